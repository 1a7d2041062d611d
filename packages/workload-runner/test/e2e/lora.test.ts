// LoRA adapters through real processes (a gateway, prefill and decode workers over tcp, and a solo
// worker as the reference), on a generated tiny model with generated PEFT adapters:
// - /v1/models lists each adapter with its folder and base;
// - a request naming an adapter gives, through PD, exactly the solo worker's tokens with that
//   adapter (greedy and seeded), and not the base model's;
// - requests on three adapters and the base at once each get their solo tokens;
// - an unknown adapter is a 404 naming it; a corrupt adapter or a rank over the limit is a 400
//   naming the tensor or r at load; the KV of one adapter is refused by a decode on another;
// - loading and unloading at run time while requests run loses none of them;
// - vllm:lora_requests_info says max_lora and the adapters in use;
// - a decode worker that restarts is given the adapters loaded at run time again by the gateway
//   before it takes a request, so the requests waiting for it get their solo tokens, not a 404.
import { existsSync, mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { WorkerClient } from "@airm/internal-api";
import { loadCheckpoint, makeTinyLora } from "@airm/llama";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { RunningCluster } from "../../src/index.ts";
import { cluster, postJson, soloTokens, tinyModel } from "../helpers/cluster.ts";

const S = 128;
const ADAPTERS = ["qv", "all", "mlp"] as const;
let root: string;
let model: string;
const dirs: Record<string, string> = {};
let pd: RunningCluster;
let solo: RunningCluster;

beforeAll(async () => {
  root = mkdtempSync(join(tmpdir(), "airm-lora-e2e-"));
  model = tinyModel({ arch: "qwen2" });
  const ckpt = await loadCheckpoint(model);
  const config = ckpt.config;
  ckpt.tensors.close();
  for (const n of [...ADAPTERS, "late", "big"]) dirs[n] = join(root, n);
  makeTinyLora({ out: dirs.qv, model: config, baseModel: model, r: 4, seed: 1 });
  makeTinyLora({ out: dirs.all, model: config, baseModel: model, r: 8, useRslora: true, targets: "all-linear", seed: 2 });
  makeTinyLora({ out: dirs.mlp, model: config, baseModel: model, r: 3, targets: ["o_proj", "gate_proj", "up_proj", "down_proj"], seed: 3 });
  makeTinyLora({ out: dirs.late, model: config, baseModel: model, r: 6, targets: ["q_proj", "k_proj", "v_proj"], seed: 4 });
  makeTinyLora({ out: dirs.big, model: config, baseModel: model, r: 32, seed: 5 });
  const modules = ADAPTERS.map((n) => `${n}=${dirs[n]}`).join(",");
  const env = { AIRM_LORA_MODULES: modules, AIRM_MAX_LORA_RANK: "16" };
  [pd, solo] = await Promise.all([
    cluster({ model, maxModelLen: S, kvTransport: "tcp", env }),
    cluster({ mode: "solo", model, maxModelLen: S, gateway: false, env: { ...env, AIRM_LORA_MODULES: `${modules},late=${dirs.late}` } }),
  ]);
}, 240_000);
afterAll(async () => {
  await Promise.all([pd?.stop(), solo?.stop()]);
  if (model) rmSync(model, { recursive: true, force: true });
  if (root) rmSync(root, { recursive: true, force: true });
});

const PROMPT = "Adapters change what a model says next";

/** The solo worker's token ids for PROMPT on `lora` (none: the base model). */
async function reference(lora: string | undefined, sampling: { temperature: number; seed?: number } = { temperature: 0 }, tag = ""): Promise<number[]> {
  const run = await soloTokens(
    solo.part("solo").url,
    { requestId: `cmpl-ref-${lora ?? "base"}${tag}`, input: { prompt: PROMPT }, maxTokens: 12, sampling, ignoreEos: true, ...(lora ? { lora } : {}) },
    solo.internalToken,
  );
  return run.tokens;
}

/** The gateway's completion of PROMPT naming `modelName`, as token ids. */
async function viaGateway(
  modelName: string,
  sampling: { temperature: number; seed?: number } = { temperature: 0 },
  gateway = pd.url,
): Promise<{ status: number; tokens: number[]; body: any }> {
  const r = await postJson(`${gateway}/v1/completions`, {
    model: modelName,
    prompt: PROMPT,
    max_tokens: 12,
    ignore_eos: true,
    return_tokens_as_token_ids: true,
    logprobs: 0,
    ...sampling,
  });
  if (r.status !== 200) return { status: r.status, tokens: [], body: r.body };
  const tokens = (r.body.choices[0].logprobs.tokens as string[]).map((t) => Number(t.replace("token_id:", "")));
  return { status: 200, tokens, body: r.body };
}

async function baseId(): Promise<string> {
  const models = (await (await fetch(`${pd.url}/v1/models`)).json()) as { data: { id: string; parent: string | null }[] };
  return models.data.find((m) => m.parent === null)!.id;
}

describe("an adapter loaded at run time, and a decode worker that restarts", () => {
  let c: RunningCluster;
  afterAll(async () => {
    await c?.stop();
  });

  it("the gateway loads it on the restarted worker before the worker takes a request: the requests waiting for it get their solo tokens", async () => {
    c = await cluster({ model, maxModelLen: S, kvTransport: "tcp", onPartExit: "restart", env: { AIRM_LORA_MODULES: `qv=${dirs.qv}`, AIRM_MAX_LORA_RANK: "16" } });
    const loaded = await postJson(`${c.url}/v1/load_lora_adapter`, { lora_name: "late", lora_path: dirs.late });
    expect(loaded.status, JSON.stringify(loaded.body)).toBe(200);
    const want = await reference("late");
    expect((await viaGateway("late", undefined, c.url)).tokens).toEqual(want);

    const decode = c.part("decode");
    decode.child.kill("SIGKILL");
    await decode.exited;
    // Sent while the worker is down: they wait for it (a worker that restarts is waited for), then run on it.
    const during = await Promise.all([0, 1, 2].map(() => viaGateway("late", undefined, c.url)));
    for (const r of during) {
      expect(r.status, JSON.stringify(r.body)).toBe(200);
      expect(r.tokens).toEqual(want);
    }
    const health = await new WorkerClient(c.part("decode").url, undefined, { token: c.internalToken }).health();
    expect(health.health?.lora?.adapters.map((a) => a.name).sort()).toEqual(["late", "qv"]);
    expect(c.part("gateway").logs()).not.toContain("lora_not_found");
  }, 180_000);
});

describe("LoRA adapters through PD (tcp) against a solo worker", () => {
  it("lists each adapter in /v1/models with its folder and base", async () => {
    const models = (await (await fetch(`${pd.url}/v1/models`)).json()) as { data: { id: string; parent: string | null; root: string }[] };
    const base = models.data.filter((m) => m.parent === null);
    expect(base).toHaveLength(1);
    for (const n of ADAPTERS) expect(models.data).toContainEqual(expect.objectContaining({ id: n, parent: base[0].id, root: dirs[n] }));
    expect(await (await fetch(`${pd.url}/v1/models/qv`)).json()).toMatchObject({ id: "qv", parent: base[0].id, root: dirs.qv });
    // An adapter tokenizes as its base model.
    const [a, b] = await Promise.all(["qv", base[0].id].map((m) => postJson(`${pd.url}/tokenize`, { model: m, prompt: PROMPT })));
    expect(a.status).toBe(200);
    expect(a.body.tokens).toEqual(b.body.tokens);
  });

  it("gives each adapter's solo tokens through PD, greedy and seeded, and not the base model's", async () => {
    const base = await reference(undefined);
    expect((await viaGateway(await baseId())).tokens).toEqual(base);
    for (const n of ADAPTERS) {
      const want = await reference(n);
      expect(want).not.toEqual(base);
      expect((await viaGateway(n)).tokens, n).toEqual(want);
    }
    const seeded = { temperature: 0.9, seed: 11 };
    expect((await viaGateway("all", seeded)).tokens).toEqual(await reference("all", seeded, "-seeded"));
  });

  it("serves requests on three adapters and the base at once, each with its solo tokens", async () => {
    const names = [await baseId(), ...ADAPTERS, ...ADAPTERS];
    const wants = await Promise.all(names.map((n, i) => reference(ADAPTERS.includes(n as never) ? n : undefined, { temperature: 0 }, `-mix-${i}`)));
    const gots = await Promise.all(names.map((n) => viaGateway(n)));
    gots.forEach((g, i) => expect(g.tokens, names[i]).toEqual(wants[i]));
  });

  it("refuses an unknown adapter (404 naming it), a corrupt one and one over the rank limit (400 naming the tensor or r)", async () => {
    const unknown = await viaGateway("nope");
    expect(unknown.status).toBe(404);
    expect(unknown.body.error).toMatchObject({ code: "model_not_found", param: "model" });
    expect(unknown.body.error.message).toContain("'nope'");

    const big = await postJson(`${pd.url}/v1/load_lora_adapter`, { lora_name: "big", lora_path: dirs.big });
    expect(big.status).toBe(400);
    expect(big.body.error.param).toBe("r");
    // A tensor cut short: the safetensors file is truncated.
    const bad = join(root, "bad");
    makeTinyLora({ out: bad, model: (await loadCheckpoint(model)).config, baseModel: model, r: 4, seed: 9 });
    const file = join(bad, "adapter_model.safetensors");
    writeFileSync(file, readFileSync(file).subarray(0, readFileSync(file).length - 64));
    const corrupt = await postJson(`${pd.url}/v1/load_lora_adapter`, { lora_name: "bad", lora_path: bad });
    expect(corrupt.status).toBe(400);
    expect(corrupt.body.error.message).toMatch(/lora_[AB]|safetensors|truncated/i);
    // Neither was left loaded on any worker.
    const listed = ((await (await fetch(`${pd.url}/v1/models`)).json()) as { data: { id: string }[] }).data.map((m) => m.id);
    expect(listed).not.toContain("big");
    expect(listed).not.toContain("bad");
  });

  it("loads and unloads an adapter at run time while requests run, losing none", async () => {
    const want = await reference("qv");
    let stop = false;
    const results: number[][] = [];
    const failures: string[] = [];
    const loop = async () => {
      while (!stop) {
        const r = await viaGateway("qv");
        if (r.status === 200) results.push(r.tokens);
        else failures.push(`${r.status} ${JSON.stringify(r.body)}`);
      }
    };
    const loops = [loop(), loop()];
    const loaded = await fetch(`${pd.url}/v1/load_lora_adapter`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({ lora_name: "late", lora_path: dirs.late }),
    });
    expect(loaded.status).toBe(200);
    expect(await loaded.text()).toBe("Success: LoRA adapter 'late' added successfully.");
    expect((await viaGateway("late")).tokens).toEqual(await reference("late"));
    const again = await postJson(`${pd.url}/v1/load_lora_adapter`, { lora_name: "late", lora_path: dirs.late });
    expect(again.status).toBe(400);
    const unloaded = await fetch(`${pd.url}/v1/unload_lora_adapter`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({ lora_name: "late" }),
    });
    expect(await unloaded.text()).toBe("Success: LoRA adapter 'late' removed successfully.");
    expect((await viaGateway("late")).status).toBe(404);
    expect((await postJson(`${pd.url}/v1/unload_lora_adapter`, { lora_name: "late" })).status).toBe(404);
    stop = true;
    await Promise.all(loops);
    expect(failures).toEqual([]);
    expect(results.length).toBeGreaterThan(0);
    for (const r of results) expect(r).toEqual(want);
  });

  it("refuses, at the decode worker, KV that prefill computed with another adapter (kv_integrity_error on lora)", async () => {
    const requestId = "cmpl-lora-mismatch-0001";
    const token = pd.internalToken;
    const decode = new WorkerClient(pd.part("decode").url, undefined, { token }).decode({ requestId, maxTokens: 4, sampling: { temperature: 0 }, lora: "all" });
    decode.catch(() => {});
    const prefill = new WorkerClient(pd.part("prefill").url, undefined, { token });
    await prefill.prefill({ requestId, input: { prompt: PROMPT }, maxTokens: 4, sampling: { temperature: 0 }, lora: "qv" });
    const events = [];
    for await (const ev of (await decode).events(60_000)) events.push(ev);
    await prefill.release({ requestId });
    expect(events.at(-1)).toMatchObject({ type: "error", code: "kv_integrity_error", param: "lora" });
    expect(JSON.stringify(events.at(-1))).toContain('LoRA adapter \\"qv\\"');
  });

  it("exports vllm:lora_requests_info with max_lora and the loaded adapters as active, workers and gateway alike", async () => {
    for (const url of [pd.part("prefill").url, pd.part("decode").url, pd.url]) {
      const text = await (await fetch(`${url}/metrics`)).text();
      const active = text.match(/^vllm:lora_requests_info\{[^}]*running_lora_adapters="([^"]*)"/m)?.[1].split(",") ?? [];
      expect(active.sort(), url).toEqual([...ADAPTERS].sort());
    }
    for (const part of ["prefill", "decode"]) {
      const text = await (await fetch(`${pd.part(part).url}/metrics`)).text();
      expect(text, part).toMatch(/^vllm:lora_requests_info\{max_lora="4",running_lora_adapters="[^"]*",waiting_lora_adapters="[^"]*"[^}]*\} \d/m);
    }
  });

  it("leaves no KV event socket behind when a cluster stops, and the other cluster of this process keeps its own", async () => {
    const mine = pd.plan.eventsDir!;
    const other = solo.plan.eventsDir!;
    expect(mine.path).not.toBe(other.path);
    expect(readdirSync(mine.path).filter((f) => f.endsWith(".sock")).length).toBeGreaterThan(0);
    await pd.stop();
    expect(existsSync(mine.path)).toBe(false);
    expect(readdirSync(other.path).filter((f) => f.endsWith(".sock")).length).toBeGreaterThan(0);
    await solo.stop();
    expect(existsSync(other.launcherDir)).toBe(false);
  });
});
