// The worker's routes in-process through app.request(): the contract's bodies and events (every
// answer parsed with @airm/internal-api's schemas), PD through a real shm transport between two
// runtimes equal to solo, and the error answers. Real engines on a generated tiny model.
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { ErrorBodySchema, PrefillResponseSchema, ReleaseResponseSchema, WorkerEventSchema, WorkerHealthSchema, type WorkerEvent } from "@airm/internal-api";
import { makeTinyModel } from "@airm/llama";
import { engineForBackend, selectTransport, type KVTransport, type SamplingParams, type WorkerRole } from "@airm/rm-core";
import pino from "pino";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { createWorkerApp, loadServingEngine, WorkerRuntime, type ServingEngine } from "../src/index.ts";

const S = 64;
const root = mkdtempSync(join(tmpdir(), "airm-worker-routes-"));
const model = join(root, "model");
const shmRoot = `/dev/shm/airm-worker-routes-${process.pid}`;
const env = { AIRM_ENGINE_LOG: "0", AIRM_ARTIFACT_CACHE: "off", PD_SHM_ROOT: shmRoot };
const log = pino({ level: "silent" });
const opened: { engine?: ServingEngine; transport?: KVTransport }[] = [];

async function worker(role: WorkerRole, backend: string, ready = true) {
  const rt = new WorkerRuntime({ role, backend, engineName: engineForBackend(backend, role), maxNumSeqs: 16, leaseTtlMs: 60_000, kvTimeoutMs: 10_000, log });
  if (ready) {
    const transport = role === "solo" ? null : await selectTransport({ name: "shm", env });
    const engine = await loadServingEngine(rt.engineName, { model, backend, maxModelLen: S }, { env });
    opened.push({ engine, transport: transport ?? undefined });
    rt.markReady({ engine, transport });
  }
  const app = createWorkerApp(rt);
  const post = (path: string, body: unknown) =>
    app.request(path, { method: "POST", headers: { "content-type": "application/json" }, body: typeof body === "string" ? body : JSON.stringify(body) });
  return { rt, app, post };
}

async function events(r: Response): Promise<WorkerEvent[]> {
  expect(r.headers.get("content-type")).toContain("application/x-ndjson");
  return (await r.text())
    .trim()
    .split("\n")
    .map((l) => WorkerEventSchema.parse(JSON.parse(l)));
}

/** First token + decoded tokens of a stream whose first token came separately (or in a `first` event). */
function tokensOf(first: number | null, evs: WorkerEvent[]): number[] {
  const f = first ?? (evs.find((e) => e.type === "first") as { token: number }).token;
  return [f, ...evs.flatMap((e) => (e.type === "token" ? [e.token] : []))];
}

let solo: Awaited<ReturnType<typeof worker>>;
let prefill: Awaited<ReturnType<typeof worker>>;
let decode: Awaited<ReturnType<typeof worker>>;

beforeAll(async () => {
  makeTinyModel({ arch: "llama", out: model, layers: 2, seed: 5 });
  [solo, prefill, decode] = await Promise.all([worker("solo", "rngd"), worker("prefill", "rngd-full"), worker("decode", "atom")]);
});
afterAll(async () => {
  for (const o of opened) {
    await o.engine?.close();
    await o.transport?.close();
  }
  rmSync(root, { recursive: true, force: true });
  rmSync(shmRoot, { recursive: true, force: true });
});

describe("worker routes (in-process)", () => {
  const body = (requestId: string, sampling: SamplingParams = { temperature: 0 }) => ({ requestId, input: { prompt: "routes in process" }, maxTokens: 12, sampling });

  it("solo: a first event, token events and done, every line an event of the contract", async () => {
    const evs = await events(await solo.post("/internal/generate", body("solo-1")));
    expect(evs[0].type).toBe("first");
    expect(evs.at(-1)?.type).toBe("done");
    const done = evs.at(-1) as Extract<WorkerEvent, { type: "done" }>;
    expect(done.completionTokens).toBe(tokensOf(null, evs).length + (done.finishReason === "stop" ? 1 : 0));
  });

  it("PD through a real shm transport between two runtimes gives the solo tokens, greedy and seeded", async () => {
    for (const [i, sampling] of ([{ temperature: 0 }, { temperature: 0.9, seed: 77 }] as SamplingParams[]).entries()) {
      const want = tokensOf(null, await events(await solo.post("/internal/generate", body(`s-${i}`, sampling))));
      const d = decode.post("/internal/decode", { requestId: `pd-${i}`, maxTokens: 12, sampling });
      const p = await prefill.post("/internal/prefill", body(`pd-${i}`, sampling));
      expect(p.status).toBe(200);
      const answer = PrefillResponseSchema.parse(await p.json());
      expect(answer.transport).toBe("shm");
      const evs = await events(await d);
      expect(evs[0]).toMatchObject({ type: "ready", promptTokens: answer.first.promptTokens, seqLen: S });
      expect(tokensOf(answer.first.token, evs)).toEqual(want);
      expect(ReleaseResponseSchema.parse(await (await prefill.post("/internal/release", { requestId: `pd-${i}` })).json())).toEqual({ requestId: `pd-${i}`, released: true });
    }
    expect(prefill.rt.leases.counters().outstanding).toBe(0);
    expect(decode.rt.leases.counters().outstanding).toBe(0);
  });

  it("logprobs and echo: PD answers the solo log-probabilities, first token from prefill, the rest from decode, with texts and bytes", async () => {
    const ask = { ...body("lp-solo"), logprobs: 4, echo: true };
    const soloEvs = await events(await solo.post("/internal/generate", ask));
    const first = soloEvs[0] as Extract<WorkerEvent, { type: "first" }>;
    const soloTokens = soloEvs.flatMap((e) => (e.type === "token" ? [e] : []));
    expect(first.logprobs?.token).toBe(first.token);
    expect(first.logprobs?.top).toHaveLength(4);
    expect(first.logprobs!.top[0]!.logprob).toBeGreaterThanOrEqual(first.logprobs!.logprob);
    expect(soloTokens.length).toBeGreaterThan(2);
    for (const t of soloTokens) expect(t.logprobs?.token).toBe(t.token);
    // echo: the prompt's tokens, the first unscored, the others scored given their prefix
    const echo = first.echo!;
    expect(echo.text).toBe("routes in process");
    expect(echo.tokens).toHaveLength(first.promptTokens);
    expect(echo.tokens[0]).toMatchObject({ logprob: null, top: [] });
    for (const t of echo.tokens.slice(1)) expect(t.logprob).toBeLessThanOrEqual(0);
    expect(Buffer.concat(echo.tokens.map((t) => Buffer.from(t.bytes))).toString("utf8")).toBe(echo.text);

    const d = decode.post("/internal/decode", { requestId: "lp-pd", maxTokens: 12, sampling: { temperature: 0 }, logprobs: 4 });
    const p = PrefillResponseSchema.parse(await (await prefill.post("/internal/prefill", { ...ask, requestId: "lp-pd" })).json());
    const { prefillMs: _a, ...pdFirst } = p.first;
    const { prefillMs: _b, type: _t, ...soloFirst } = first;
    expect(pdFirst).toEqual(soloFirst);
    const pdTokens = (await events(await d)).flatMap((e) => (e.type === "token" ? [e] : []));
    expect(pdTokens).toEqual(soloTokens);
    await prefill.post("/internal/release", { requestId: "lp-pd" });

    // without logprobs nothing is computed or sent; echo alone gives the prompt without scores
    const plain = await events(await solo.post("/internal/generate", { ...body("lp-none"), echo: true }));
    expect((plain[0] as Extract<WorkerEvent, { type: "first" }>).logprobs).toBeUndefined();
    expect((plain[0] as Extract<WorkerEvent, { type: "first" }>).echo!.tokens.every((t) => t.logprob === null)).toBe(true);
    expect(plain.some((e) => e.type === "token" && e.logprobs)).toBe(false);
    const bad = await solo.post("/internal/generate", { ...body("lp-bad"), logprobs: 21 });
    expect(bad.status).toBe(400);
    expect(ErrorBodySchema.parse(await bad.json()).error.param).toBe("logprobs");
  });

  it("a body outside the contract is a 400 naming the field; unknown fields are refused too", async () => {
    for (const [bad, param] of [
      [{ requestId: "x", input: { prompt: "a" }, maxTokens: 0 }, "maxTokens"],
      [{ requestId: "a/b", input: { prompt: "a" }, maxTokens: 2 }, "requestId"],
      [{ requestId: "x", input: { prompt: "a", messages: [] }, maxTokens: 2 }, "input"],
      [{ requestId: "x", input: { prompt: "a" }, maxTokens: 2, sampling: { top_p: 0.5 } }, "sampling"],
      [{ requestId: "x", input: { prompt: "a" }, maxTokens: 2, colour: "red" }, null],
    ] as const) {
      const r = await solo.post("/internal/generate", bad);
      expect(r.status, JSON.stringify(bad)).toBe(400);
      const e = ErrorBodySchema.parse(await r.json()).error;
      expect(e.code).toBe("invalid_request");
      if (param) expect(e.param).toBe(param);
    }
    const notJson = await solo.post("/internal/generate", "{not json");
    expect(ErrorBodySchema.parse(await notJson.json()).error.message).toBe("body is not valid JSON");
  });

  it("prompt + maxTokens past the compiled context is a 400 context_overflow with both numbers", async () => {
    const r = await prefill.post("/internal/prefill", { requestId: "big", input: { promptTokenIds: Array.from({ length: 60 }, (_, i) => 10 + i) }, maxTokens: 10 });
    expect(r.status).toBe(400);
    const e = (await r.json()) as { error: { code: string; requested: number; limit: number } };
    expect(e.error).toMatchObject({ code: "context_overflow", requested: 70, limit: S });
  });

  it("a route of another role is a 404 wrong_role; a request id in flight is a 409", async () => {
    const r = await prefill.post("/internal/decode", { requestId: "x", maxTokens: 2 });
    expect(r.status).toBe(404);
    expect(ErrorBodySchema.parse(await r.json()).error.code).toBe("wrong_role");
    const d = decode.post("/internal/decode", { requestId: "dup-1", maxTokens: 2, kvTimeoutMs: 2000 });
    await new Promise((res) => setTimeout(res, 50));
    const dup = await decode.post("/internal/decode", { requestId: "dup-1", maxTokens: 2 });
    expect(dup.status).toBe(409);
    expect(ErrorBodySchema.parse(await dup.json()).error).toMatchObject({ code: "duplicate_request", param: "requestId" });
    const evs = await events(await d); // the first one times out waiting for KV nobody pushes
    expect(evs.at(-1)).toMatchObject({ type: "error", status: 504, code: "kv_timeout" });
    expect(decode.rt.leases.counters().outstanding).toBe(0);
  });

  it("/health follows the contract while loading (503) and when ready (200)", async () => {
    const loading = await worker("decode", "atom", false);
    const h1 = await loading.app.request("/health");
    expect(h1.status).toBe(503);
    expect(WorkerHealthSchema.parse(await h1.json())).toMatchObject({ status: "loading", ready: false, model: null, role: "decode", engine: "atom" });
    const busy = await loading.post("/internal/decode", { requestId: "x", maxTokens: 2 });
    expect(busy.status).toBe(503);
    expect(ErrorBodySchema.parse(await busy.json()).error.code).toBe("not_ready");
    loading.rt.markFailed("no such model");
    expect(WorkerHealthSchema.parse(await (await loading.app.request("/health")).json())).toMatchObject({ status: "failed", error: "no such model" });
    const h2 = await decode.app.request("/health");
    expect(h2.status).toBe(200);
    expect(WorkerHealthSchema.parse(await h2.json())).toMatchObject({ status: "ok", ready: true, transport: "shm", maxModelLen: S });
  });
});
