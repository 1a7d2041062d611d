// The gateway's routes in-process (app.request()) in front of in-process workers (startWorker on
// free ports, real engines on a generated tiny model, KV over a real shm root): the OpenAI JSON
// and SSE answers agree with each other and with solo, stop strings cut the text, and bad input
// or unknown models get OpenAI errors; a model's generation_config.json defaults reach the
// sampler when a request leaves the fields out, never when it gives them.
import { cpSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { makeTinyModel } from "@airm/llama";
import { startWorker, type RunningWorker } from "@airm/worker";
import pino from "pino";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { createGatewayApp, EndpointPool, GatewayMetrics, Orchestrator } from "../src/index.ts";

const S = 64;
const root = mkdtempSync(join(tmpdir(), "airm-gateway-routes-"));
const model = join(root, "model");
const env = { AIRM_ENGINE_LOG: "0", AIRM_ARTIFACT_CACHE: "off", PD_SHM_ROOT: `/dev/shm/airm-gateway-routes-${process.pid}` };
const logger = pino({ level: "silent" });
const workers: RunningWorker[] = [];
const pools: EndpointPool[] = [];

async function start(role: "prefill" | "decode" | "solo", backend: string, o: { model?: string; env?: Record<string, string> } = {}): Promise<string> {
  const w = await startWorker({ role, backend, model: o.model ?? model, port: 0, maxModelLen: S, env: { ...env, ...o.env }, logger });
  workers.push(w);
  await w.ready;
  return w.url;
}

async function gateway(urls: { prefill?: string[]; decode?: string[]; solo?: string[] }) {
  const p = Object.fromEntries(Object.entries(urls).map(([role, u]) => [role, new EndpointPool(role, u)])) as Record<string, EndpointPool>;
  for (const pool of Object.values(p)) {
    pools.push(pool);
    await pool.start(60_000);
  }
  const app = createGatewayApp({
    orchestrator: new Orchestrator({ ...p, prefillTimeoutMs: 30_000, decodeIdleTimeoutMs: 30_000, kvTimeoutMs: 30_000 }),
    pools: Object.values(p),
    modelPool: p.solo ?? p.decode,
    metrics: new GatewayMetrics(),
    maxBodyBytes: 1 << 20,
  });
  const post = (path: string, body: unknown) => app.request(path, { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify(body) });
  return { app, post };
}

let pd: Awaited<ReturnType<typeof gateway>>;
let solo: Awaited<ReturnType<typeof gateway>>;
let id: string;

beforeAll(async () => {
  makeTinyModel({ arch: "llama", out: model, layers: 2, seed: 9 });
  const [p, d, s] = await Promise.all([start("prefill", "rngd-full"), start("decode", "atom"), start("solo", "rngd")]);
  pd = await gateway({ prefill: [p], decode: [d] });
  solo = await gateway({ solo: [s] });
  id = ((await (await pd.app.request("/v1/models")).json()) as { data: { id: string }[] }).data[0].id;
});
afterAll(async () => {
  for (const p of pools) p.stop();
  await Promise.all(workers.map((w) => w.close()));
  rmSync(root, { recursive: true, force: true });
  rmSync(env.PD_SHM_ROOT, { recursive: true, force: true });
});

async function sse(r: Response): Promise<any[]> {
  expect(r.headers.get("content-type")).toContain("text/event-stream");
  return (await r.text())
    .split("\n\n")
    .map((b) => b.trim())
    .filter((b) => b.startsWith("data: "))
    .map((b) => b.slice(6))
    .map((d) => (d === "[DONE]" ? d : JSON.parse(d)));
}

describe("gateway routes (in-process)", () => {
  // more than a KV block (16 positions) of prompt: a second run finds its first block in the prefill worker's prefix cache
  const completion = { model: "", prompt: "the gateway in process answers the same text over and over again, block after block", max_tokens: 10, temperature: 0 };

  it("PD and solo answer the same text; JSON and SSE agree; usage adds up", async () => {
    const body = { ...completion, model: id };
    const a = (await (await pd.post("/v1/completions", body)).json()) as any;
    const b = (await (await solo.post("/v1/completions", body)).json()) as any;
    expect(a.object).toBe("text_completion");
    expect(a.choices[0].text).toBe(b.choices[0].text);
    expect(a.usage).toEqual(b.usage);
    expect(a.usage.total_tokens).toBe(a.usage.prompt_tokens + a.usage.completion_tokens);
    const chunks = await sse(await pd.post("/v1/completions", { ...body, stream: true, stream_options: { include_usage: true } }));
    expect(chunks.at(-1)).toBe("[DONE]");
    expect(
      chunks
        .slice(0, -1)
        .flatMap((c) => c.choices.map((x: any) => x.text))
        .join(""),
    ).toBe(a.choices[0].text);
    // The same counts; the second PD run found its prompt in the prefill worker's prefix cache.
    const { prompt_tokens_details: cached, ...counts } = chunks.at(-2).usage;
    expect({ ...counts, prompt_tokens_details: a.usage.prompt_tokens_details }).toEqual(a.usage);
    expect(cached.cached_tokens).toBeGreaterThan(0);
    expect(a.usage.prompt_tokens_details.cached_tokens).toBe(0);
  });

  it("chat: JSON and streamed deltas agree", async () => {
    const body = { model: id, messages: [{ role: "user", content: "Say something." }], max_tokens: 8, temperature: 0 };
    const j = (await (await pd.post("/v1/chat/completions", body)).json()) as any;
    expect(j.choices[0].message.role).toBe("assistant");
    const chunks = await sse(await pd.post("/v1/chat/completions", { ...body, stream: true }));
    expect(chunks[0].choices[0].delta).toEqual({ role: "assistant", content: "" });
    expect(
      chunks
        .slice(0, -1)
        .map((c) => c.choices[0].delta.content ?? "")
        .join(""),
    ).toBe(j.choices[0].message.content);
    expect(chunks.at(-2).choices[0].finish_reason).toBe(j.choices[0].finish_reason);
  });

  it("a stop string cuts the text before it, in JSON and SSE", async () => {
    const full = ((await (await pd.post("/v1/completions", { ...completion, model: id })).json()) as any).choices[0].text as string;
    expect(full.length).toBeGreaterThan(4);
    const stop = full.slice(2, 4);
    const j = (await (await pd.post("/v1/completions", { ...completion, model: id, stop: [stop] })).json()) as any;
    expect(j.choices[0]).toMatchObject({ text: full.slice(0, full.indexOf(stop)), finish_reason: "stop" });
    const chunks = await sse(await pd.post("/v1/completions", { ...completion, model: id, stop: [stop], stream: true }));
    expect(
      chunks
        .slice(0, -1)
        .map((c) => c.choices[0].text)
        .join(""),
    ).toBe(j.choices[0].text);
  });

  it("a request that names no model is served by the only model served, as vLLM does", async () => {
    const { model: _m, ...noModel } = completion as typeof completion & { model?: string };
    const named = (await (await pd.post("/v1/completions", { ...completion, model: id })).json()) as any;
    const r = await pd.post("/v1/completions", noModel);
    const j = (await r.json()) as any;
    expect(r.status, JSON.stringify(j)).toBe(200);
    expect(j.model).toBe(id);
    expect(j.choices[0].text).toBe(named.choices[0].text);
    const chat = await pd.post("/v1/chat/completions", { messages: [{ role: "user", content: "Hi" }], max_tokens: 3, model: null });
    expect(chat.status).toBe(200);
    expect(((await chat.json()) as any).model).toBe(id);
  });

  it("unknown models, bad bodies and unknown routes get OpenAI errors", async () => {
    const unknown = await pd.post("/v1/completions", { ...completion, model: "gpt-17" });
    expect(unknown.status).toBe(404);
    expect(((await unknown.json()) as any).error).toMatchObject({ code: "model_not_found", param: "model" });
    const bad = await pd.post("/v1/completions", { ...completion, model: id, max_tokens: "ten" });
    expect(bad.status).toBe(400);
    expect(((await bad.json()) as any).error).toMatchObject({ param: "max_tokens", type: "invalid_request_error" });
    const overflow = await pd.post("/v1/completions", { model: id, prompt: Array.from({ length: 60 }, (_, i) => 10 + i), max_tokens: 10 });
    expect(overflow.status).toBe(400);
    expect(Object.keys(((await overflow.json()) as any).error).sort()).toEqual(["code", "message", "param", "type"]);
    const nf = await pd.app.request("/v1/embeddings", { method: "POST" });
    expect(nf.status).toBe(404);
    expect(((await nf.json()) as any).error.code).toBe("not_found");
  });

  it("/health and /v1/models report the workers", async () => {
    const h = (await (await pd.app.request("/health")).json()) as any;
    expect(h).toMatchObject({ status: "ok", mode: "pd" });
    expect(h.roles.map((r: any) => r.role)).toEqual(["prefill", "decode"]);
    const m = (await (await solo.app.request("/v1/models")).json()) as any;
    expect(m.data).toEqual([expect.objectContaining({ id, object: "model", max_model_len: S })]);
  });
});

describe("the model's generation defaults (vLLM's --generation-config auto)", () => {
  // The same weights with a generation_config.json that recommends sampling settings: a request
  // that leaves a field out gets the model's value, one that gives it keeps its own.
  const recommended = { temperature: 0.3, top_p: 0.9, top_k: 3, min_p: 0.3, repetition_penalty: 1.3 };
  const prompt = "the model's own sampling settings apply when the request is silent";
  let withDefaults: { pd: Awaited<ReturnType<typeof gateway>>; solo: Awaited<ReturnType<typeof gateway>>; off: Awaited<ReturnType<typeof gateway>>; id: string };
  const text = async (g: Awaited<ReturnType<typeof gateway>>, model: string, extra: object) => {
    const r = await g.post("/v1/completions", { model, prompt, max_tokens: 16, seed: 5, ...extra });
    const j = (await r.json()) as any;
    expect(r.status, JSON.stringify(j)).toBe(200);
    return j.choices[0].text as string;
  };

  beforeAll(async () => {
    const dir = join(root, "model-with-defaults");
    cpSync(model, dir, { recursive: true });
    const gen = JSON.parse(readFileSync(join(dir, "generation_config.json"), "utf8"));
    writeFileSync(join(dir, "generation_config.json"), JSON.stringify({ ...gen, do_sample: true, ...recommended }));
    const [p, d, s, off] = await Promise.all([
      start("prefill", "rngd-full", { model: dir }),
      start("decode", "atom", { model: dir }),
      start("solo", "rngd", { model: dir }),
      start("solo", "rngd", { model: dir, env: { AIRM_GENERATION_CONFIG: "vllm" } }),
    ]);
    const health = (await (await fetch(`${s}/health`)).json()) as any;
    expect(health.model.generationDefaults).toEqual({ temperature: 0.3, topP: 0.9, topK: 3, minP: 0.3, repetitionPenalty: 1.3 });
    expect(((await (await fetch(`${off}/health`)).json()) as any).model.generationDefaults).toBeUndefined();
    withDefaults = { pd: await gateway({ prefill: [p], decode: [d] }), solo: await gateway({ solo: [s] }), off: await gateway({ solo: [off] }), id: health.model.id };
  });

  it("a silent request gets them, in PD and solo alike: the text of the plain model asked for them explicitly", async () => {
    const asked = await text(solo, id, recommended);
    expect(await text(withDefaults.pd, withDefaults.id, {})).toBe(asked);
    expect(await text(withDefaults.solo, withDefaults.id, {})).toBe(asked);
    // the defaults change the answer: the plain model's silent request (temperature 1, nothing else) differs
    const plain = await text(solo, id, {});
    expect(plain).not.toBe(asked);
    // AIRM_GENERATION_CONFIG=vllm: the model's defaults are not used
    expect(await text(withDefaults.off, withDefaults.id, {})).toBe(plain);
  });

  it("values the request gives win, neutral ones included; the fields it leaves out still come from the model", async () => {
    const neutral = { temperature: 1, top_p: 1, top_k: -1, min_p: 0, repetition_penalty: 1 };
    expect(await text(withDefaults.pd, withDefaults.id, neutral)).toBe(await text(solo, id, {}));
    const own = { temperature: 0.8, top_p: 0.95, top_k: 10, min_p: 0.05, repetition_penalty: 1.1 };
    expect(await text(withDefaults.solo, withDefaults.id, own)).toBe(await text(solo, id, own));
    // greedy by the request's word, with the model's repetition_penalty (it changes greedy picks too)
    const greedy = await text(withDefaults.solo, withDefaults.id, { temperature: 0 });
    expect(greedy).toBe(await text(solo, id, { ...recommended, temperature: 0 }));
    expect(greedy).not.toBe(await text(solo, id, { temperature: 0 }));
  });
});
