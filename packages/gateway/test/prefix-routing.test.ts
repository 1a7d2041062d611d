// Prefix-aware routing (AIRM_ROUTING=prefix, the default): a gateway in front of one prefill and
// two decode workers that publish their KV events (real ZMQ over Unix sockets, real engines on a
// tiny model, KV over a real shm root). A conversation's next turns go to the decode worker that
// holds its blocks (its kv-hold counter moves, the other's does not), where routing by load alone
// (ties in turn) sends them to the other one; a gateway that restarts rebuilds its index from the
// workers' replay endpoints. A conversation on a LoRA adapter is routed the same way (its blocks
// are named under the adapter's fingerprint by the workers and by the gateway alike).
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { loadCheckpoint, makeTinyLora, makeTinyModel } from "@airm/llama";
import { startWorker, type RunningWorker } from "@airm/worker";
import pino from "pino";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { startGateway, type RunningGateway } from "../src/index.ts";

const root = mkdtempSync(join(tmpdir(), "airm-gateway-prefix-"));
const model = join(root, "model");
const env = { AIRM_ENGINE_LOG: "0", AIRM_ARTIFACT_CACHE: "off", AIRM_BLOCK_SIZE: "8", PD_SHM_ROOT: `/dev/shm/airm-gateway-prefix-${process.pid}` };
const logger = pino({ level: "silent" });
const workers: RunningWorker[] = [];
let prefill: RunningWorker;
let decodes: RunningWorker[];
const gateways: RunningGateway[] = [];
let id: string;

async function start(role: "prefill" | "decode", backend: string, name: string): Promise<RunningWorker> {
  const at = (what: string) => `ipc://${join(root, `${name}-${what}.sock`)}`;
  const kvEventsConfig = JSON.stringify({ enable_kv_cache_events: true, endpoint: at("pub"), replay_endpoint: at("replay"), topic: `kv@${name}` });
  const lora = { modules: [{ name: "qv", path: join(root, "lora-qv") }] };
  const w = await startWorker({ role, backend, model, port: 0, maxModelLen: 64, env, logger, kvEventsConfig, lora });
  workers.push(w);
  await w.ready;
  return w;
}

async function gateway(routing: "prefix" | "load"): Promise<RunningGateway> {
  const g = await startGateway({ port: 0, prefill: [prefill.url], decode: decodes.map((d) => d.url), routing });
  gateways.push(g);
  return g;
}

/** A sample of a Prometheus page (0 when absent). */
async function sample(url: string, name: string, labels = ""): Promise<number> {
  const text = await (await fetch(`${url}/metrics`)).text();
  const re = new RegExp(`^${name}${labels ? `\\{${labels}\\}` : "(\\{[^}]*\\})?"} (\\S+)$`, "m");
  return Number(re.exec(text)?.[labels ? 1 : 2] ?? 0);
}

const held = (w: RunningWorker) => sample(w.url, "airm_kv_held_positions_total");

/** Greedy completion of token ids; the prompt and the answer's tokens. */
async function turn(g: RunningGateway, prompt: number[], name = id): Promise<number[]> {
  const r = await fetch(`${g.url}/v1/completions`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify({ model: name, prompt, max_tokens: 4, temperature: 0, ignore_eos: true, logprobs: 0, return_tokens_as_token_ids: true }),
  });
  const body = (await r.json()) as { choices: { logprobs: { tokens: string[] } }[] };
  expect(r.status, JSON.stringify(body)).toBe(200);
  return [...prompt, ...body.choices[0].logprobs.tokens.map((t) => Number(t.replace("token_id:", "")))];
}

/** Waits until the gateway's index holds at least `n` blocks of `w` (the events arrive after the release). */
async function indexed(g: RunningGateway, w: RunningWorker, n: number): Promise<number> {
  for (let i = 0; i < 200; i++) {
    const blocks = await sample(g.url, "airm_router_index_blocks", `endpoint="${w.url.replace(/\/+$/, "")}"`);
    if (blocks >= n) return blocks;
    await new Promise((r) => setTimeout(r, 25));
  }
  throw new Error(`the gateway's index never held ${n} blocks of ${w.url}`);
}

/** Three turns of one conversation through `g` (`watch`: a prefix-routing gateway whose index shows the events arrived); the positions each decode worker held for turns 2 and 3. */
async function conversation(g: RunningGateway, seed: number, watch = g, name = id): Promise<number[]> {
  let ctx = Array.from({ length: 21 }, (_, i) => 10 + ((seed * 7 + i * 3) % 90));
  const gains: number[] = decodes.map(() => 0);
  ctx = await turn(g, ctx, name);
  for (let t = 0; t < 2; t++) {
    await Promise.race(decodes.map((d) => indexed(watch, d, Math.floor((ctx.length - 1) / 8))));
    const before = await Promise.all(decodes.map(held));
    ctx = await turn(g, [...ctx, 11 + t, 12 + t, 13 + t], name);
    const after = await Promise.all(decodes.map(held));
    after.forEach((a, i) => (gains[i] += a - before[i]));
  }
  return gains;
}

beforeAll(async () => {
  makeTinyModel({ arch: "llama", out: model, layers: 2, seed: 9 });
  const ckpt = await loadCheckpoint(model);
  makeTinyLora({ out: join(root, "lora-qv"), model: ckpt.config, baseModel: model, r: 4, seed: 2 });
  ckpt.tensors.close();
  prefill = await start("prefill", "rngd-full", "prefill");
  decodes = await Promise.all([start("decode", "atom", "decode-a"), start("decode", "atom", "decode-b")]);
  const g = await gateway("prefix");
  id = ((await (await fetch(`${g.url}/v1/models`)).json()) as { data: { id: string }[] }).data[0]!.id;
}, 120_000);
afterAll(async () => {
  await Promise.all(gateways.map((g) => g.close()));
  await Promise.all(workers.map((w) => w.close()));
  rmSync(root, { recursive: true, force: true });
  rmSync(env.PD_SHM_ROOT, { recursive: true, force: true });
});

describe("prefix-aware routing", () => {
  it("routes a conversation on a LoRA adapter the same way: its next turns go where its (adapter-named) blocks are", async () => {
    const gains = await conversation(gateways[0], 5, gateways[0], "qv");
    expect(gains.filter((g) => g > 0)).toHaveLength(1);
    expect(Math.max(...gains)).toBe(8 * (3 + 3));
  });

  it("sends a conversation's next turns to the decode worker that holds its blocks", async () => {
    const gains = await conversation(gateways[0], 1);
    // Both later turns found their prefix on one worker: 3 blocks of 8 positions each time (turn
    // 1 computed 24 positions, turn 2 31).
    expect(gains.filter((g) => g > 0)).toHaveLength(1);
    expect(Math.max(...gains)).toBe(8 * (3 + 3));
    expect(await sample(gateways[0].url, "airm_router_kv_events_total")).toBeGreaterThan(0);
    expect(await sample(gateways[0].url, "airm_router_prefix_lookups_total")).toBeGreaterThan(0);
  });

  it("routing by load alone sends them elsewhere (the check above can fail)", async () => {
    const g = await gateway("load");
    const gains = await conversation(g, 2, gateways[0]);
    // Ties rotate: turn 2 goes to the other decode worker, which holds nothing of it; turn 3 comes back.
    expect(gains.reduce((a, b) => a + b)).toBe(8 * 3);
  });

  it("a gateway that restarts rebuilds its index from the workers' replay", async () => {
    const first = gateways[0];
    const counts = await Promise.all(decodes.map((d) => indexed(first, d, 0)));
    expect(counts.some((c) => c > 0)).toBe(true);
    await first.close();
    gateways.shift();
    const again = await gateway("prefix");
    for (const [i, d] of decodes.entries()) expect(await indexed(again, d, counts[i])).toBe(counts[i]);
    expect(await sample(again.url, "airm_router_kv_event_replays_total")).toBeGreaterThanOrEqual(2);
  });
});
