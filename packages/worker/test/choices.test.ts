// Several choices from one prefill, and what rides with them (in-process routes, real engines on a
// generated tiny model, KV over a real shm transport): n choices drawn with seeds seed, seed + 1,
// ... equal n single requests with those seeds, in PD as solo; penalties change greedy output and
// PD equals solo with them (decode reads the prompt's ids from the KV manifest); the prefix cache's
// tokens come back with the first token; tokenize and detokenize answer from the model's tokenizer.
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { DetokenizeResponseSchema, TokenizeResponseSchema, WorkerEventSchema, type WorkerEvent } from "@airm/internal-api";
import { makeTinyModel } from "@airm/llama";
import { engineForBackend, selectTransport, type KVTransport, type SamplingParams, type WorkerRole } from "@airm/rm-core";
import pino from "pino";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { createWorkerApp, loadServingEngine, WorkerRuntime, type ServingEngine } from "../src/index.ts";

const S = 128;
const root = mkdtempSync(join(tmpdir(), "airm-worker-choices-"));
const model = join(root, "model");
const shmRoot = `/dev/shm/airm-worker-choices-${process.pid}`;
const env = { AIRM_ENGINE_LOG: "0", AIRM_ARTIFACT_CACHE: "off", PD_SHM_ROOT: shmRoot };
const log = pino({ level: "silent" });
const opened: { engine: ServingEngine; transport: KVTransport | null }[] = [];

async function worker(role: WorkerRole, backend: string, batch: number) {
  const rt = new WorkerRuntime({ role, backend, engineName: engineForBackend(backend, role), maxNumSeqs: batch, leaseTtlMs: 60_000, kvTimeoutMs: 10_000, log });
  const transport = role === "solo" ? null : await selectTransport({ name: "shm", env });
  const engine = await loadServingEngine(rt.engineName, { model, backend, maxModelLen: S, batch }, { env });
  opened.push({ engine, transport });
  rt.markReady({ engine, transport });
  const app = createWorkerApp(rt);
  const post = (path: string, body: unknown) => app.request(path, { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify(body) });
  return { rt, post };
}

async function events(r: Response): Promise<WorkerEvent[]> {
  if (r.status !== 200) throw new Error(`status ${r.status}: ${await r.text()}`);
  return (await r.text())
    .trim()
    .split("\n")
    .map((l) => WorkerEventSchema.parse(JSON.parse(l)));
}

/** Each choice's tokens: its first token, then its token events. */
function choices(firsts: number[], evs: WorkerEvent[]): number[][] {
  const out = firsts.map((t) => [t]);
  for (const e of evs) if (e.type === "token") out[e.choice ?? 0].push(e.token);
  expect(evs.filter((e) => e.type === "done")).toHaveLength(firsts.length);
  return out;
}

let solo: Awaited<ReturnType<typeof worker>>;
let prefill: Awaited<ReturnType<typeof worker>>;
let decode: Awaited<ReturnType<typeof worker>>;

beforeAll(async () => {
  makeTinyModel({ arch: "llama", out: model, layers: 2, seed: 21 });
  [solo, prefill, decode] = await Promise.all([worker("solo", "rngd", 4), worker("prefill", "rngd-full", 1), worker("decode", "atom", 4)]);
});
afterAll(async () => {
  for (const o of opened) {
    await o.engine.close();
    await o.transport?.close();
  }
  rmSync(root, { recursive: true, force: true });
  rmSync(shmRoot, { recursive: true, force: true });
});

async function soloRun(rid: string, sampling: SamplingParams, n = 1, input: object = { prompt: "several choices" }) {
  const evs = await events(await solo.post("/internal/generate", { requestId: rid, input, maxTokens: 12, sampling, n }));
  const first = evs.find((e) => e.type === "first") as Extract<WorkerEvent, { type: "first" }>;
  return { runs: choices([first.token, ...(first.others ?? []).map((o) => o.token)], evs), first, completionTokens: completionTokens(evs) };
}

async function pdRun(rid: string, sampling: SamplingParams, n = 1, input: object = { prompt: "several choices" }) {
  const dec = decode.post("/internal/decode", { requestId: rid, maxTokens: 12, sampling, n });
  const pre = await prefill.post("/internal/prefill", { requestId: rid, input, maxTokens: 12, sampling, n });
  expect(pre.status).toBe(200);
  const { first } = (await pre.json()) as { first: { token: number; promptTokens: number; cachedTokens?: number; others?: { token: number }[] } };
  const evs = await events(await dec);
  return { runs: choices([first.token, ...(first.others ?? []).map((o) => o.token)], evs), first, completionTokens: completionTokens(evs) };
}

/** The completion tokens the done events report (an end-of-sequence token included), over the choices. */
function completionTokens(evs: WorkerEvent[]): number {
  return evs.reduce((a, e) => a + (e.type === "done" ? e.completionTokens : 0), 0);
}

/** A worker's vllm:prompt_tokens_total and vllm:generation_tokens_total. */
async function tokenCounters(w: { rt: WorkerRuntime }): Promise<[number, number]> {
  const value = async (c: typeof w.rt.metrics.promptTokens) => (await c.get()).values[0]?.value ?? 0;
  return [await value(w.rt.metrics.promptTokens), await value(w.rt.metrics.generationTokens)];
}

describe("choices and penalties in the worker", () => {
  it("n = 3 equals three single requests with seeds s, s + 1, s + 2, solo and PD alike, from one prefill", async () => {
    const seed = 4000;
    const singles = [];
    for (let i = 0; i < 3; i++) singles.push((await soloRun(`one-${i}`, { temperature: 1, seed: seed + i })).runs[0]);
    expect(new Set(singles.map((t) => t.join())).size).toBeGreaterThan(1);
    expect((await soloRun("three-solo", { temperature: 1, seed }, 3)).runs).toEqual(singles);
    const before = (await prefill.rt.metrics.requests.get()).values.find((v) => v.labels.route === "prefill" && v.labels.outcome === "ok")?.value ?? 0;
    expect((await pdRun("three-pd", { temperature: 1, seed }, 3)).runs).toEqual(singles);
    const after = (await prefill.rt.metrics.requests.get()).values.find((v) => v.labels.route === "prefill" && v.labels.outcome === "ok")?.value ?? 0;
    expect(after - before).toBe(1);
    // Greedy choices are the same answer n times.
    const greedy = (await pdRun("three-greedy", { temperature: 0 }, 3)).runs;
    expect(greedy[1]).toEqual(greedy[0]);
    expect(greedy[2]).toEqual(greedy[0]);
  });

  it("penalties change greedy output, and PD equals solo with them", async () => {
    // A bias makes one prompt token the greedy answer at every step; each penalty must break that.
    const input = { promptTokenIds: [40, 41, 42, 43, 44, 45] };
    const bias: [number, number][] = [[42, 3]];
    const plain = (await soloRun("pen-0", { temperature: 0, logitBias: bias }, 1, input)).runs[0];
    expect(plain.filter((t) => t === 42).length).toBeGreaterThan(6);
    for (const [i, p] of ([{ repetitionPenalty: 10 }, { frequencyPenalty: 2 }, { presencePenalty: 2 }] as SamplingParams[]).entries()) {
      const sampling = { temperature: 0, logitBias: bias, ...p };
      const want = (await soloRun(`pen-s${i}`, sampling, 1, input)).runs[0];
      expect(want.filter((t) => t === 42).length, JSON.stringify(p)).toBeLessThan(plain.filter((t) => t === 42).length);
      expect((await pdRun(`pen-p${i}`, sampling, 1, input)).runs[0], JSON.stringify(p)).toEqual(want);
    }
  });

  it("the first token carries the prompt tokens the prefix cache gave", async () => {
    const input = {
      messages: [
        { role: "system", content: "a system prompt long enough to be kept as a prefix" },
        { role: "user", content: "one" },
      ],
    };
    await pdRun("cache-1", { temperature: 0 }, 1, input);
    const second = await pdRun("cache-2", { temperature: 0 }, 1, { messages: [input.messages[0], { role: "user", content: "two" }] });
    expect(second.first.cachedTokens ?? 0).toBeGreaterThan(0);
  });

  it("vllm:prompt_tokens_total and vllm:generation_tokens_total count each token once where it was made (solo; PD: the prompt and first tokens on prefill, the rest on decode)", async () => {
    const sampling = { temperature: 1, seed: 77 };
    const [p0, g0] = await tokenCounters(solo);
    const s = await soloRun("count-solo", sampling, 3);
    const [p1, g1] = await tokenCounters(solo);
    expect([p1 - p0, g1 - g0]).toEqual([s.first.promptTokens, s.completionTokens]);
    expect(s.completionTokens).toBeGreaterThan(3);
    const [before, decBefore] = [await tokenCounters(prefill), await tokenCounters(decode)];
    const pd = await pdRun("count-pd", sampling, 3);
    const [after, decAfter] = [await tokenCounters(prefill), await tokenCounters(decode)];
    expect(pd.completionTokens).toBe(s.completionTokens);
    expect([after[0] - before[0], after[1] - before[1]]).toEqual([pd.first.promptTokens, 3]);
    expect([decAfter[0] - decBefore[0], decAfter[1] - decBefore[1]]).toEqual([0, pd.completionTokens - 3]);
  });

  it("tokenize and detokenize answer from the model's tokenizer and chat template", async () => {
    const t = TokenizeResponseSchema.parse(await (await solo.post("/internal/tokenize", { input: { prompt: "hello tokens" } })).json());
    expect(t.tokens.length).toBeGreaterThan(0);
    expect(t.maxModelLen).toBe(S);
    const d = DetokenizeResponseSchema.parse(await (await decode.post("/internal/detokenize", { tokens: t.tokens })).json());
    expect(d.text).toContain("hello tokens");
    const chat = TokenizeResponseSchema.parse(await (await prefill.post("/internal/tokenize", { input: { messages: [{ role: "user", content: "hi" }] } })).json());
    expect(DetokenizeResponseSchema.parse(await (await solo.post("/internal/detokenize", { tokens: chat.tokens })).json()).text).toMatch(
      /<\|im_start\|>user\nhi<\|im_end\|>\n<\|im_start\|>assistant\n$/,
    );
    expect((await solo.post("/internal/detokenize", { tokens: [10_000_000] })).status).toBe(400);
  });

  it("n beyond the decode slots is a 400 naming n", async () => {
    const r = await solo.post("/internal/generate", { requestId: "too-many", input: { prompt: "x" }, maxTokens: 2, n: 5 });
    expect(r.status).toBe(400);
    expect(((await r.json()) as { error: { param: string } }).error.param).toBe("n");
  });
});
