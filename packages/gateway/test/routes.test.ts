// The gateway's routes in-process (app.request()) in front of in-process workers (startWorker on
// free ports, real engines on a generated tiny model, KV over a real shm root): the OpenAI JSON
// and SSE answers agree with each other and with solo, stop strings cut the text, and bad input
// or unknown models get OpenAI errors.
import { mkdtempSync, rmSync } from "node:fs";
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

async function start(role: "prefill" | "decode" | "solo", backend: string): Promise<string> {
  const w = await startWorker({ role, backend, model, port: 0, maxModelLen: S, env, logger });
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
