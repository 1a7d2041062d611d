// Not disaggregating a request: with --local-prefill a gateway may run a request whole on its
// decode worker, which then serves /internal/generate too (airm-worker --local-prefill). With
// --disaggregation header (llm-d's sidecar rule) a request no endpoint picker gave a prefill pod
// (no x-prefiller-host-port) runs there; with auto (the default) the gateway decides from what the
// workers measured (their /health estimates). Real in-process workers on a tiny model, KV over a
// real shm root: the local answer is token-identical to the disaggregated one, the prefill worker
// is not called, and a decode worker without the flag refuses /generate.
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { makeTinyModel } from "@airm/llama";
import { startWorker, type RunningWorker } from "@airm/worker";
import pino from "pino";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { startGateway, type RunningGateway } from "../src/index.ts";

const S = 64;
const root = mkdtempSync(join(tmpdir(), "airm-gateway-local-"));
const model = join(root, "model");
const env = { AIRM_ENGINE_LOG: "0", AIRM_ARTIFACT_CACHE: "off", PD_SHM_ROOT: `/dev/shm/airm-gateway-local-${process.pid}` };
const logger = pino({ level: "silent" });
const workers: RunningWorker[] = [];
let prefill: RunningWorker;
let decode: RunningWorker;
let plainDecode: RunningWorker;
let gw: RunningGateway;
let id: string;

async function start(role: "prefill" | "decode", backend: string, localPrefill = false): Promise<RunningWorker> {
  const w = await startWorker({ role, backend, model, port: 0, maxModelLen: S, env, logger, localPrefill });
  workers.push(w);
  await w.ready;
  return w;
}

/** Requests a worker answered on `route` with outcome ok. */
async function served(w: RunningWorker, route: string): Promise<number> {
  const text = await (await fetch(`${w.url}/metrics`)).text();
  return Number(new RegExp(`^airm_worker_requests_total\\{route="${route}",outcome="ok"[^}]*\\} (\\d+)$`, "m").exec(text)?.[1] ?? 0);
}

async function complete(headers: Record<string, string> = {}, at = gw): Promise<string> {
  const r = await fetch(`${at.url}/v1/completions`, {
    method: "POST",
    headers: { "content-type": "application/json", ...headers },
    body: JSON.stringify({ model: id, prompt: "short prompts stay", max_tokens: 12, temperature: 0 }),
  });
  const body = (await r.json()) as any;
  expect(r.status, JSON.stringify(body)).toBe(200);
  return body.choices[0].text;
}

beforeAll(async () => {
  makeTinyModel({ arch: "llama", out: model, layers: 2, seed: 5 });
  [prefill, decode, plainDecode] = await Promise.all([start("prefill", "rngd-full"), start("decode", "atom", true), start("decode", "atom")]);
  gw = await startGateway({ port: 0, prefill: [prefill.url], decode: [decode.url], localPrefill: true, disaggregation: "header" });
  id = ((await (await fetch(`${gw.url}/v1/models`)).json()) as { data: { id: string }[] }).data[0]!.id;
});
afterAll(async () => {
  await gw?.close();
  await Promise.all(workers.map((w) => w.close()));
  rmSync(root, { recursive: true, force: true });
  rmSync(env.PD_SHM_ROOT, { recursive: true, force: true });
});

describe("--local-prefill", () => {
  it("runs a request without x-prefiller-host-port whole on the decode worker, token-identical to the disaggregated run", async () => {
    const before = { prefill: await served(prefill, "prefill"), generate: await served(decode, "generate"), decode: await served(decode, "decode") };
    const local = await complete();
    expect(await served(prefill, "prefill")).toBe(before.prefill);
    expect(await served(decode, "generate")).toBe(before.generate + 1);
    const disaggregated = await complete({ "x-prefiller-host-port": prefill.url.replace(/^http:\/\//, "") });
    expect(await served(prefill, "prefill")).toBe(before.prefill + 1);
    expect(await served(decode, "decode")).toBe(before.decode + 1);
    expect(local).toBe(disaggregated);
    expect(local.length).toBeGreaterThan(0);
  });

  it("a decode worker started without it has no /internal/generate; the flag is refused on other roles", async () => {
    const r = await fetch(`${plainDecode.url}/internal/generate`, { method: "POST", headers: { "content-type": "application/json" }, body: "{}" });
    expect(r.status).toBe(404);
    expect(((await r.json()) as any).error.code).toBe("wrong_role");
    await expect(startWorker({ role: "prefill", backend: "rngd-full", model, port: 0, env, logger, localPrefill: true })).rejects.toThrow(/--local-prefill.*decode workers/);
    await expect(startGateway({ port: 0, solo: [plainDecode.url], localPrefill: true })).rejects.toThrow(/--local-prefill/);
  });
});

describe("--disaggregation auto (the default with --local-prefill)", () => {
  it("learns both paths, then runs each request where the workers' measurements say its first token comes sooner", async () => {
    const fresh = await start("decode", "atom", true); // nothing measured yet
    const auto = await startGateway({ port: 0, prefill: [prefill.url], decode: [fresh.url], localPrefill: true, healthIntervalMs: 50 });
    try {
      const paths = async () => {
        const t = await (await fetch(`${auto.url}/metrics`)).text();
        return [...t.matchAll(/^airm_disaggregation_picks_total\{path="(\w+)",reason="(\w+)"\} (\d+)$/gm)].map((m) => `${m[1]}/${m[2]}=${m[3]}`).sort();
      };
      const probed = () => new Promise((r) => setTimeout(r, 200)); // the pools' probes carry the workers' new estimates
      const want = await complete({}, auto);
      // nothing measured yet: the KV path first (the decode worker learns its bandwidth) ...
      expect(await paths()).toEqual(["pd/explore_kv=1"]);
      await probed();
      const h = (await (await fetch(`${fresh.url}/health`)).json()) as any;
      expect(h.estimates.kvBandwidth).toBeGreaterThan(0);
      // k and v, 2 layers, 2 kv heads x 16, the prompt's blocks of 16 positions of bf16 (not S-wide: only the prompt crosses)
      const blocks = Math.ceil(h.estimates.kvBytes / (2 * 2 * 2 * 16 * 16 * 2));
      expect(blocks).toBeGreaterThan(0);
      expect(h.estimates.kvBytes).toBe(blocks * 2 * 2 * 2 * 16 * 16 * 2);
      expect(blocks * 16).toBeLessThan(S);
      expect(h.estimates.kvBytesPerToken).toBeGreaterThanOrEqual(2 * 2 * 2 * 16 * 2); // at least a position's bytes per prompt token
      expect(h.estimates.localPrefill).toBe(true);
      expect(h.estimates.prefill).toBeNull(); // it has not prefilled yet
      // ... then the local prefill
      expect(await complete({}, auto)).toBe(want);
      expect(await paths()).toEqual(["local/explore_local=1", "pd/explore_kv=1"]);
      await probed();
      // then measured: the decision and its path agree, the text is the same either way
      expect(await complete({}, auto)).toBe(want);
      const last = (await paths()).find((p) => /kv_faster|local_faster/.test(p));
      expect(last === "pd/kv_faster=1" || last === "local/local_faster=1", String(await paths())).toBe(true);
      const gauges = await (await fetch(`${fresh.url}/metrics`)).text();
      await probed();
      const h2 = (await (await fetch(`${fresh.url}/health`)).json()) as any;
      expect(Number(/^airm_kv_bandwidth_bytes_per_second\S* (\S+)$/m.exec(gauges)?.[1])).toBeGreaterThan(0);
      expect(Number(/^airm_worker_prefill_seconds_per_token\S* (\S+)$/m.exec(gauges)?.[1])).toBeGreaterThan(0);
      expect(/^airm_worker_local_prefill\S* 1$/m.test(gauges)).toBe(true);
      // the gateway re-exports them: in llm-d's topology a picker scrapes the decode pod's serving port, the gateway
      const own = await (await fetch(`${auto.url}/metrics`)).text();
      expect(Number(/^airm_kv_bandwidth_bytes_per_second (\S+)$/m.exec(own)?.[1])).toBe(h2.estimates.kvBandwidth);
      expect(/^airm_worker_local_prefill 1$/m.test(own)).toBe(true);
    } finally {
      await auto.close();
    }
  });

  it("never and header need the local path", async () => {
    await expect(startGateway({ port: 0, prefill: [prefill.url], decode: [decode.url], disaggregation: "never" })).rejects.toThrow(/--disaggregation: never .*--local-prefill/);
  });
});
