// Bad input gets an OpenAI-style 4xx and the gateway keeps serving (real PD cluster over shm).
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { rmSync } from "node:fs";
import type { RunningCluster } from "../../src/index.ts";
import { cluster, postJson, tinyModel } from "../helpers/cluster.ts";

const S = 128;
let model: string;
let pd: RunningCluster;
let modelId: string;

beforeAll(async () => {
  model = tinyModel();
  pd = await cluster({ model, maxModelLen: S });
  modelId = ((await (await fetch(`${pd.url}/v1/models`)).json()) as any).data[0].id;
});
afterAll(async () => {
  await pd?.stop();
  if (model) rmSync(model, { recursive: true, force: true });
});

function expectOpenAIError(res: { status: number; body: any }, status: number, param?: string | null, code?: string): void {
  expect(res.status, JSON.stringify(res.body)).toBe(status);
  expect(Object.keys(res.body.error).sort()).toEqual(["code", "message", "param", "type"]);
  expect(typeof res.body.error.message).toBe("string");
  expect(res.body.error.type).toBe(status >= 500 ? "server_error" : "invalid_request_error");
  if (param !== undefined) expect(res.body.error.param).toBe(param);
  if (code !== undefined) expect(res.body.error.code).toBe(code);
}

async function raw(path: string, body: string | Uint8Array, headers: Record<string, string> = { "content-type": "application/json" }) {
  const r = await fetch(`${pd.url}${path}`, { method: "POST", headers, body });
  return { status: r.status, body: await r.json() };
}

describe("gateway bad-input matrix", () => {
  const C = "/v1/completions";
  const CH = "/v1/chat/completions";
  const ok = () => ({ model: modelId, prompt: "hello", max_tokens: 4, temperature: 0 });
  const chatOk = () => ({ model: modelId, messages: [{ role: "user", content: "hi" }], max_tokens: 4, temperature: 0 });

  it("malformed JSON", async () => {
    expectOpenAIError(await raw(C, '{"model": "m", "prompt": '), 400, null, "invalid_json");
    expectOpenAIError(await raw(CH, "not json at all"), 400, null, "invalid_json");
  });
  it("wrong types", async () => {
    expectOpenAIError(await postJson(`${pd.url}${C}`, { ...ok(), max_tokens: "4" }), 400, "max_tokens");
    expectOpenAIError(await postJson(`${pd.url}${C}`, { ...ok(), prompt: { text: "x" } }), 400, "prompt");
    expectOpenAIError(await postJson(`${pd.url}${C}`, { ...ok(), temperature: "hot" }), 400, "temperature");
    expectOpenAIError(await postJson(`${pd.url}${CH}`, { ...chatOk(), messages: "hi" }), 400, "messages");
    expectOpenAIError(await postJson(`${pd.url}${CH}`, { ...chatOk(), stream: "yes" }), 400, "stream");
    expectOpenAIError(await postJson(`${pd.url}${C}`, [1, 2, 3]), 400);
  });
  it("missing prompt / messages and empty prompt", async () => {
    const { prompt: _p, ...noPrompt } = ok();
    expectOpenAIError(await postJson(`${pd.url}${C}`, noPrompt), 400, "prompt");
    const { messages: _m, ...noMessages } = chatOk();
    expectOpenAIError(await postJson(`${pd.url}${CH}`, noMessages), 400, "messages");
    expectOpenAIError(await postJson(`${pd.url}${C}`, { ...ok(), prompt: "" }), 400, "prompt");
    expectOpenAIError(await postJson(`${pd.url}${CH}`, { ...chatOk(), messages: [] }), 400, "messages");
  });
  it("unknown model", async () => {
    const r = await postJson(`${pd.url}${C}`, { ...ok(), model: "gpt-17" });
    expectOpenAIError(r, 404, "model", "model_not_found");
    expect(r.body.error.message).toContain(modelId);
  });
  it("max_tokens <= 0 or absurd", async () => {
    expectOpenAIError(await postJson(`${pd.url}${C}`, { ...ok(), max_tokens: 0 }), 400, "max_tokens");
    expectOpenAIError(await postJson(`${pd.url}${C}`, { ...ok(), max_tokens: -5 }), 400, "max_tokens");
    expectOpenAIError(await postJson(`${pd.url}${C}`, { ...ok(), max_tokens: 1e9 }), 400, "max_tokens");
    expectOpenAIError(await postJson(`${pd.url}${C}`, { ...ok(), max_tokens: 2.5 }), 400, "max_tokens");
  });
  it("prompt + max_tokens beyond max_model_len names both numbers and the limit", async () => {
    const prompt = Array.from({ length: 100 }, (_, i) => 3 + (i % 300));
    const r = await postJson(`${pd.url}${C}`, { model: modelId, prompt, max_tokens: 60, temperature: 0 });
    expectOpenAIError(r, 400, undefined, "context_overflow");
    expect(r.body.error.message).toContain(`prompt + max_tokens = 160 tokens exceeds max_model_len of ${S} tokens`);
    const rc = await postJson(`${pd.url}${CH}`, { ...chatOk(), max_tokens: S });
    expectOpenAIError(rc, 400, "max_tokens", "context_overflow");
    expect(rc.body.error.message).toContain(String(S));
  });
  it("n and best_of beyond the decode slots, best_of below n or with stream, and best_of on chat are refused", async () => {
    const slots = ((await (await fetch(`${pd.part("decode").spec.url}/health`)).json()) as { requests: { slots: number } }).requests.slots;
    const tooMany = await postJson(`${pd.url}${C}`, { ...ok(), n: slots + 1 });
    expectOpenAIError(tooMany, 400, "n");
    expect(tooMany.body.error.message).toMatch(/at most \d+/);
    expectOpenAIError(await postJson(`${pd.url}${C}`, { ...ok(), n: 3, best_of: 2 }), 400, "best_of");
    expectOpenAIError(await postJson(`${pd.url}${C}`, { ...ok(), best_of: 2, stream: true }), 400, "best_of");
    expectOpenAIError(await postJson(`${pd.url}${CH}`, { ...chatOk(), best_of: 2 }), 400, "best_of", "unsupported_parameter");
  });
  it("oversized bodies", async () => {
    const big = JSON.stringify({ ...ok(), prompt: "x".repeat(2 * 1024 * 1024) });
    expectOpenAIError(await raw(C, big), 413, null, "request_too_large");
  });
  it("invalid UTF-8", async () => {
    const bytes = Buffer.concat([Buffer.from('{"model":"m","prompt":"'), Buffer.from([0xc3, 0x28, 0xff]), Buffer.from('"}')]);
    expectOpenAIError(await raw(C, bytes), 400, null, "invalid_encoding");
  });
  it("unknown routes answer an OpenAI 404", async () => {
    expectOpenAIError(await postJson(`${pd.url}/v1/embeddings`, {}), 404);
  });
  it("keeps serving after all of that", async () => {
    const r = await postJson(`${pd.url}${C}`, ok());
    expect(r.status).toBe(200);
    expect(r.body.usage.completion_tokens).toBeGreaterThan(0);
    expect((await fetch(`${pd.url}/health`)).status).toBe(200);
  });
});
