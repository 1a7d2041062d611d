// The rest of the OpenAI surface as a user meets it: `airm up` (the real CLI, its defaults) on the
// SmolLM2 GGUF, driven with the official openai client, each answer compared with a solo worker:
// n choices from one prefill (equal to single requests with seeds s, s + 1, ...), best_of, a
// completions batch, penalties, models.retrieve, /tokenize and /detokenize, the Responses API
// (create and stream, unmodified), and the prefix cache's cached_tokens. Skipped (with the
// reason) without the pulled model.
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { resolveCachedModel } from "@airm/llama";
import OpenAI from "openai";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { freePort, type RunningCluster } from "../../src/index.ts";
import { type AirmUp, startAirmUp, waitFor } from "../helpers/airm-up.ts";
import { cluster, postJson } from "../helpers/cluster.ts";

const gguf = (await resolveCachedModel("smollm2-135m-instruct"))?.path;
const SKIP = "the SmolLM2 GGUF is not in the model cache (pnpm exec airm model pull smollm2-135m-instruct)";
if (!gguf) console.warn(`OpenAI surface e2e skipped: ${SKIP}`);

let up: AirmUp;
let solo: RunningCluster;
let pd: OpenAI;
let ref: OpenAI;
let url: string;
let prefillUrl: string;
let model: string;
let cache: string;

beforeAll(async () => {
  if (!gguf) return;
  cache = mkdtempSync(join(tmpdir(), "airm-surface-"));
  const [port, pp, dp] = [await freePort(), await freePort(), await freePort()];
  up = startAirmUp(["--model", gguf, "--port", String(port), "--prefill-port", String(pp), "--decode-port", String(dp), "--quiet"], { AIRM_MODEL_CACHE: cache });
  solo = await cluster({ mode: "solo", model: gguf, maxModelLen: 512 });
  await waitFor(() => up.out().includes("rngd-pd is up") || up.child.exitCode !== null, 240_000, "airm up to be ready");
  expect(up.child.exitCode, up.err()).toBeNull();
  url = `http://127.0.0.1:${port}`;
  prefillUrl = `http://127.0.0.1:${pp}`;
  pd = new OpenAI({ baseURL: `${url}/v1`, apiKey: "none", maxRetries: 0 });
  ref = new OpenAI({ baseURL: `${solo.url}/v1`, apiKey: "none", maxRetries: 0 });
  model = (await pd.models.list()).data[0].id;
}, 300_000);
afterAll(async () => {
  up?.kill();
  await solo?.stop();
  if (cache) rmSync(cache, { recursive: true, force: true });
});

type Completion = OpenAI.Completions.CompletionCreateParamsNonStreaming;
/** A completion; vLLM's extra fields (repetition_penalty, ignore_eos) ride along as the client's extra body does. */
type CompletionParams = Omit<Completion, "model"> & { repetition_penalty?: number; ignore_eos?: boolean };
const complete = (client: OpenAI, p: CompletionParams) => client.completions.create({ model, max_tokens: 24, ...p } as Completion);
/** A choice's tokens: its log-probability entries. */
const tokens = (ch: OpenAI.Completions.CompletionChoice) => ch.logprobs?.tokens ?? [];

/** Prefills the prefill worker has answered (its airm_worker_requests_total). */
async function prefills(): Promise<number> {
  const text = await (await fetch(`${prefillUrl}/metrics`)).text();
  return text
    .split("\n")
    .filter((l) => l.startsWith("airm_worker_requests_total{") && l.includes('route="prefill"') && l.includes('outcome="ok"'))
    .reduce((a, l) => a + Number(l.split(" ").at(-1)), 0);
}

describe.skipIf(!gguf)(`the OpenAI surface through airm up (PD) with the openai client${gguf ? "" : ` (skipped: ${SKIP})`}`, { timeout: 600_000 }, () => {
  it("n: 3 seeded equals three single solo requests with seeds s, s+1, s+2, streamed and not, from one prefill", async () => {
    const prompt = "Once upon a time, the first snow";
    const want = [];
    for (let i = 0; i < 3; i++) want.push(tokens((await complete(ref, { prompt, temperature: 0.8, seed: 1003 + i, logprobs: 0 })).choices[0]));
    expect(new Set(want.map((t) => t.join("|"))).size).toBeGreaterThan(1);
    const before = await prefills();
    const got = await complete(pd, { prompt, temperature: 0.8, seed: 1003, n: 3, logprobs: 0 });
    expect(await prefills()).toBe(before + 1);
    expect(got.choices.map((c) => c.index)).toEqual([0, 1, 2]);
    expect(got.choices.map(tokens)).toEqual(want);
    expect(got.usage?.completion_tokens).toBe(got.choices.reduce((a, c) => a + tokens(c).length + (c.finish_reason === "stop" ? 1 : 0), 0));
    const stream = await pd.completions.create({ model, prompt, max_tokens: 24, temperature: 0.8, seed: 1003, n: 3, stream: true });
    const texts = ["", "", ""];
    for await (const chunk of stream) for (const c of chunk.choices) texts[c.index] += c.text;
    expect(texts).toEqual(got.choices.map((c) => c.text));
  });

  it("chat n: 2 with seeds, streamed choices carry their index", async () => {
    const messages = [{ role: "user" as const, content: "Name a fruit." }];
    const got = await pd.chat.completions.create({ model, messages, max_tokens: 16, temperature: 0.9, seed: 7, n: 2 });
    const one = await ref.chat.completions.create({ model, messages, max_tokens: 16, temperature: 0.9, seed: 8 });
    expect(got.choices[1].message.content).toBe(one.choices[0].message.content);
    const stream = await pd.chat.completions.create({ model, messages, max_tokens: 16, temperature: 0.9, seed: 7, n: 2, stream: true });
    const texts = ["", ""];
    for await (const chunk of stream) for (const c of chunk.choices) texts[c.index] += c.delta.content ?? "";
    expect(texts).toEqual(got.choices.map((c) => c.message.content));
  });

  it("best_of: 3, n: 1 returns the candidate with the highest cumulative log-probability", async () => {
    const prompt = "The best way to spend a rainy afternoon is";
    const candidates = [];
    for (let i = 0; i < 3; i++) {
      const c = (await complete(ref, { prompt, temperature: 1, seed: 50 + i, logprobs: 0 })).choices[0];
      candidates.push({ text: c.text, sum: (c.logprobs?.token_logprobs ?? []).reduce((a: number, x) => a + (x ?? 0), 0) });
    }
    const best = [...candidates].sort((a, b) => b.sum - a.sum)[0];
    const got = await complete(pd, { prompt, temperature: 1, seed: 50, best_of: 3 });
    expect(got.choices).toHaveLength(1);
    expect(got.choices[0].text).toBe(best.text);
    expect(got.choices[0].logprobs).toBeNull();
  });

  it("a batch of 3 prompts equals three single requests, in prompt order", async () => {
    const prompts = ["The capital of France is", "Two plus two equals", "My favourite colour is"];
    const singles = [];
    for (const p of prompts) singles.push((await complete(ref, { prompt: p, temperature: 0 })).choices[0].text);
    const got = await complete(pd, { prompt: prompts, temperature: 0 });
    expect(got.choices.map((c) => [c.index, c.text])).toEqual(singles.map((t, i) => [i, t]));
    const tokenIds = await pd.completions.create({
      model,
      prompt: [
        [504, 3575, 282],
        [504, 3575],
      ],
      max_tokens: 4,
      temperature: 0,
    });
    expect(tokenIds.choices).toHaveLength(2);
  });

  it("penalties change greedy output, and PD equals solo with them", async () => {
    const prompt = "Write the word apple ten times: apple apple apple";
    const plain = (await complete(pd, { prompt, temperature: 0 })).choices[0].text;
    for (const p of [{ presence_penalty: 1.5 }, { frequency_penalty: 1.5 }, { repetition_penalty: 1.5 }]) {
      const got = (await complete(pd, { prompt, temperature: 0, ...p })).choices[0].text;
      expect(got, JSON.stringify(p)).not.toBe(plain);
      expect((await complete(ref, { prompt, temperature: 0, ...p })).choices[0].text, JSON.stringify(p)).toBe(got);
    }
  });

  it("models.retrieve, /tokenize -> /detokenize, /version", async () => {
    expect((await pd.models.retrieve(model)).id).toBe(model);
    const missing = await pd.models.retrieve("no-such-model").catch((e: unknown) => e);
    expect((missing as InstanceType<typeof OpenAI.APIError>).status).toBe(404);
    const text = "Tokenize this, then detokenize it: é ✓.";
    const t = await postJson(`${url}/tokenize`, { model, prompt: text, add_special_tokens: false, return_token_strs: true });
    expect(t.status).toBe(200);
    expect(t.body).toMatchObject({ count: t.body.tokens.length, max_model_len: 8192 }); // SmolLM2's own context: airm up serves the model's whole context
    expect(t.body.token_strs).toHaveLength(t.body.count);
    const d = await postJson(`${url}/detokenize`, { model, tokens: t.body.tokens });
    expect(d.body.prompt).toBe(text);
    const chat = await postJson(`${url}/tokenize`, { model, messages: [{ role: "user", content: "hi" }] });
    expect(chat.body.count).toBeGreaterThan(3);
    expect((await (await fetch(`${url}/version`)).json()) as { version: string }).toHaveProperty("version");
  });

  it("the Responses API: responses.create and responses.stream work unmodified", async () => {
    const input = "What is the capital of France? Answer in one word.";
    const r = await pd.responses.create({ model, input, instructions: "Be brief.", max_output_tokens: 16, temperature: 0 });
    expect(r.object).toBe("response");
    expect(["completed", "incomplete"]).toContain(r.status);
    expect(r.output_text.length).toBeGreaterThan(0);
    const chat = await ref.chat.completions.create({
      model,
      max_tokens: 16,
      temperature: 0,
      messages: [
        { role: "system", content: "Be brief." },
        { role: "user", content: input },
      ],
    });
    expect(r.output_text).toBe(chat.choices[0].message.content);
    expect(r.usage?.output_tokens).toBe(chat.usage?.completion_tokens);
    const stream = pd.responses.stream({ model, input, instructions: "Be brief.", max_output_tokens: 16, temperature: 0 });
    let deltas = "";
    stream.on("response.output_text.delta", (e) => {
      deltas += e.delta;
    });
    const final = await stream.finalResponse();
    expect(final.output_text).toBe(r.output_text);
    expect(deltas).toBe(r.output_text);
    const raw = await pd.responses.create({ model, input, max_output_tokens: 8, temperature: 0, stream: true });
    const types: string[] = [];
    for await (const e of raw) types.push(e.type);
    expect(types[0]).toBe("response.created");
    expect(types.at(-1)).toMatch(/^response\.(completed|incomplete)$/);
    expect(types).toContain("response.output_text.delta");
    // Tools and function calls, with a required choice.
    const tools = [
      {
        type: "function" as const,
        name: "get_weather",
        strict: true,
        parameters: { type: "object", properties: { city: { type: "string" } }, required: ["city"], additionalProperties: false },
      },
    ];
    const call = await pd.responses.create({ model, input: "Weather in Paris?", tools, tool_choice: "required", temperature: 0, max_output_tokens: 40 });
    const fc = call.output.find((o) => o.type === "function_call");
    expect(fc && fc.type === "function_call" ? JSON.parse(fc.arguments) : null).toHaveProperty("city");
    const stored = await pd.responses.create({ model, input, previous_response_id: "resp_x" }).catch((e: unknown) => e);
    expect((stored as InstanceType<typeof OpenAI.APIError>).status).toBe(400);
  });

  it("cached_tokens > 0 on the second of two requests sharing a system prompt", async () => {
    const system = "You are a careful assistant who answers questions about geography with short, precise sentences and no lists.";
    const ask = (q: string) =>
      pd.chat.completions.create({
        model,
        max_tokens: 4,
        temperature: 0,
        messages: [
          { role: "system", content: system },
          { role: "user", content: q },
        ],
      });
    await ask("Where is Lyon?");
    const second = await ask("Where is Nantes?");
    expect(second.usage?.prompt_tokens_details?.cached_tokens ?? 0).toBeGreaterThan(10);
  });

  it("ignore_eos: a sampled completion runs to max_tokens", async () => {
    const got = await complete(pd, { prompt: "Once upon a time, the first snow", temperature: 0.8, seed: 1003, max_tokens: 200, ignore_eos: true });
    expect(got.usage?.completion_tokens).toBe(200);
    expect(got.choices[0].finish_reason).toBe("length");
  });
});
