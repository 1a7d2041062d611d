// The paged KV cache through the worker's routes: requests are admitted by KV blocks (the rest
// wait, counted in vllm:num_requests_waiting), a decode worker whose cache is too small for every
// stream at once preempts the newest and recomputes it, and every stream still gives the tokens of
// a worker with room for all (PD and solo, greedy and seeded); a request longer than the model's
// context or the whole cache is a 400 naming the limit. Real engines on a generated tiny model.
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { ErrorBodySchema, PrefillResponseSchema } from "@airm/internal-api";
import { makeTinyModel } from "@airm/llama";
import type { SamplingParams, WorkerRole } from "@airm/rm-core";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { events, inProcessWorker, tokensOf, type Opened } from "./in-process-worker.ts";

const root = mkdtempSync(join(tmpdir(), "airm-worker-paged-"));
const model = join(root, "model");
const shmRoot = `/dev/shm/airm-worker-paged-${process.pid}`;
const env = { AIRM_ENGINE_LOG: "0", AIRM_ARTIFACT_CACHE: "off", PD_SHM_ROOT: shmRoot, AIRM_BLOCK_SIZE: "8" };
const opened: Opened[] = [];
const MAX_LEN = 128;
const MAX_TOKENS = 40;

const PROMPTS = [
  "the first of eight",
  "a second, a little longer than the first one",
  "three",
  "four: the quick brown fox",
  "five five five",
  "six",
  "seven and then some more words",
  "eight",
];
const SAMPLING: SamplingParams[] = PROMPTS.map((_, i) => (i % 2 ? { temperature: 0.8, seed: 100 + i } : { temperature: 0 }));
const body = (requestId: string, i: number) => ({ requestId, input: { prompt: PROMPTS[i] }, maxTokens: MAX_TOKENS, sampling: SAMPLING[i], ignoreEos: true });

const worker = (role: WorkerRole, backend: string, blocks?: number) => inProcessWorker(role, backend, { model, env, maxModelLen: MAX_LEN, maxNumSeqs: 16, opened, blocks });

let roomy: Awaited<ReturnType<typeof worker>>;
let reference: number[][];

beforeAll(async () => {
  makeTinyModel({ arch: "llama", out: model, layers: 2, seed: 9 });
  roomy = await worker("solo", "rngd");
  reference = [];
  for (const [i] of PROMPTS.entries()) reference.push(tokensOf(null, await events(await roomy.post("/internal/generate", body(`ref-${i}`, i)))));
}, 120_000);
afterAll(async () => {
  for (const o of opened) {
    await o.engine.close();
    await o.transport?.close();
  }
  rmSync(root, { recursive: true, force: true });
  rmSync(shmRoot, { recursive: true, force: true });
});

describe("admission by KV blocks and preemption by recompute", () => {
  it("solo: eight streams on a cache that holds about three; the newest are preempted and recomputed; each gives its tokens", async () => {
    // One request of max_model_len takes 16 blocks; 20 leave room for about three streams of ~50 positions.
    const small = await worker("solo", "rngd", 20);
    const runs = await Promise.all(PROMPTS.map(async (_, i) => tokensOf(null, await events(await small.post("/internal/generate", body(`small-${i}`, i))))));
    runs.forEach((r, i) => expect(r, `prompt ${i}`).toEqual(reference[i]));
    const kv = small.engine.kvCache();
    expect(kv.preemptions).toBeGreaterThan(0);
    expect(kv.usedBlocks).toBe(0);
    const metrics = await (await small.app.request("/metrics")).text();
    expect(Number(/^vllm:num_preemptions_total\S* (\S+)$/m.exec(metrics)?.[1])).toBe(kv.preemptions);
    expect(Number(/^vllm:kv_cache_usage_perc\S* (\S+)$/m.exec(metrics)?.[1])).toBe(0);
  });

  it("PD: the decode worker's cache is the small one; streams preempted there are recomputed there and equal solo", async () => {
    const prefill = await worker("prefill", "rngd-full");
    const decode = await worker("decode", "atom", 20);
    const runs = await Promise.all(
      PROMPTS.map(async (_, i) => {
        const id = `pd-${i}`;
        const d = decode.post("/internal/decode", { requestId: id, maxTokens: MAX_TOKENS, sampling: SAMPLING[i], ignoreEos: true });
        const p = await prefill.post("/internal/prefill", body(id, i));
        const first = PrefillResponseSchema.parse(await p.json()).first.token;
        return tokensOf(first, await events(await d));
      }),
    );
    runs.forEach((r, i) => expect(r, `prompt ${i}`).toEqual(reference[i]));
    expect(decode.engine.kvCache().preemptions).toBeGreaterThan(0);
    expect(prefill.engine.kvCache().preemptions).toBe(0);
    expect(decode.rt.leases.counters().outstanding).toBe(0);
  });

  it("requests wait for blocks instead of failing, and are counted as waiting meanwhile", async () => {
    const w = await worker("solo", "rngd", 16);
    // the cache holds one max_model_len request: the second waits until the first is done
    const big = async (id: string): Promise<Response> =>
      w.post("/internal/generate", { requestId: id, input: { promptTokenIds: Array.from({ length: 100 }, (_, i) => 1 + (i % 50)) }, maxTokens: 28, ignoreEos: true });
    const a = big("wait-a");
    const b = big("wait-b");
    let sawWaiting = false;
    for (let i = 0; i < 200 && !sawWaiting; i++) {
      sawWaiting = w.rt.admission.numWaiting > 0;
      await new Promise((r) => setTimeout(r, 5));
    }
    expect(sawWaiting).toBe(true);
    const [ea, eb] = await Promise.all([a.then(events), b.then(events)]);
    expect(tokensOf(null, ea)).toHaveLength(28);
    expect(tokensOf(null, eb)).toEqual(tokensOf(null, ea));
  });

  it("a request past max_model_len, or past the whole cache, is a 400 that names the limit", async () => {
    const w = await worker("solo", "rngd", 16);
    const over = await w.post("/internal/generate", { requestId: "over-1", input: { promptTokenIds: [1, 2, 3] }, maxTokens: MAX_LEN });
    expect(over.status).toBe(400);
    const e1 = ErrorBodySchema.parse(await over.json()).error;
    expect(e1).toMatchObject({ code: "context_overflow", requested: MAX_LEN + 3, limit: MAX_LEN });
    expect(e1.message).toContain(`exceeds max_model_len of ${MAX_LEN} tokens`);
    // two choices of 128 positions each cannot both hold their blocks in 16 blocks
    const two = await w.post("/internal/generate", { requestId: "over-2", input: { promptTokenIds: [1, 2, 3] }, maxTokens: MAX_LEN - 3, n: 2 });
    expect(two.status).toBe(400);
    const e2 = ErrorBodySchema.parse(await two.json()).error;
    expect(e2.message).toMatch(/exceeds the KV cache of 128 tokens \(2 choices need \d+ blocks; 16 blocks of 8 positions; raise --kv-cache-memory\)/);
  });
});
