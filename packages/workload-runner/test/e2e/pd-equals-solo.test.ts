// PD over shm gives exactly the solo tokens, for both decode engines; the gateway's streaming
// and non-streaming answers agree; the standard OpenAI client parses every answer.
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { rmSync } from "node:fs";
import OpenAI from "openai";
import type { PrefillRequest } from "@airm/internal-api";
import type { RunningCluster } from "../../src/index.ts";
import { cluster, pdTokens, readSse, settledLeftovers, soloTokens, tinyModel, type TokenRun } from "../helpers/cluster.ts";

const S = 128;
const MAX = 12;
const TEXTS = [
  "a",
  "Hello",
  "The cat sat on the mat.",
  "Once upon a time, in a land far away, there lived",
  "1 2 3 4 5 6 7 8 9 10 11 12",
  "Ünïcödé and emoji 😀 go through the byte-level tokenizer too.",
  "def add(a, b):\n    return a + b\n",
  "KV caches move from prefill to decode through a transport chosen by name.",
  "the quick brown fox jumps over the lazy dog ".repeat(3),
  "short",
  "Lorem ipsum dolor sit amet, consectetur adipiscing elit, sed do eiusmod tempor incididunt ut labore.",
  "What is the capital of France? Answer:",
];
/** Token-id prompts whose lengths run up to exactly S - MAX (the compiled limit). */
const ID_LENGTHS = [1, 2, 7, 16, 31, 50, 64, 90, 101, S - MAX];
const idPrompt = (n: number, salt: number) => Array.from({ length: n }, (_, i) => 3 + ((i * 37 + salt * 11) % 400));

let model: string;
let solo: RunningCluster;
const soloRuns = new Map<string, TokenRun>();

type Body = Omit<PrefillRequest, "requestId">;

function bodies(): { key: string; body: Body }[] {
  const greedy = { temperature: 0, seed: 1 };
  const out: { key: string; body: Body }[] = [];
  TEXTS.forEach((t, i) => out.push({ key: `t${i}`, body: { input: { prompt: t }, maxTokens: MAX, sampling: greedy } }));
  ID_LENGTHS.forEach((n, i) => out.push({ key: `ids${n}`, body: { input: { promptTokenIds: idPrompt(n, i) }, maxTokens: MAX, sampling: greedy } }));
  out.push({ key: "chat", body: { input: { messages: [{ role: "user", content: "Say something." }] }, maxTokens: MAX, sampling: greedy } });
  out.push({ key: "sampled", body: { input: { prompt: "Sampling with a seed" }, maxTokens: MAX, sampling: { temperature: 0.9, topP: 0.95, seed: 1234 } } });
  out.push({ key: "fill", body: { input: { promptTokenIds: idPrompt(S - 20, 99) }, maxTokens: null, sampling: greedy } });
  return out;
}

beforeAll(async () => {
  model = tinyModel();
  solo = await cluster({ mode: "solo", model, seqLen: S, gateway: false });
  let i = 0;
  for (const { key, body } of bodies()) soloRuns.set(key, await soloTokens(solo.part("solo").url, { requestId: `solo-${i++}`, ...body }));
  // The reference is not degenerate: prompts lead to different continuations of several tokens.
  const runs = [...soloRuns.values()];
  expect(new Set(runs.map((r) => r.tokens.join(","))).size).toBeGreaterThan(runs.length / 2);
  expect(runs.filter((r) => r.tokens.length > 1).length).toBeGreaterThan(runs.length / 2);
});

afterAll(async () => {
  await solo?.stop();
  if (model) rmSync(model, { recursive: true, force: true });
});

describe.each(["atom", "rngd"])("PD over shm, decode on %s", (decodeBackend) => {
  let pd: RunningCluster;
  beforeAll(async () => {
    pd = await cluster({ model, seqLen: S, decode: [{ backend: decodeBackend }], kvTransport: "shm", metricsPort: 0 });
  });
  afterAll(async () => {
    await pd?.stop();
  });

  it(`gives exactly the solo tokens for ${bodies().length} prompts up to the compiled limit`, async () => {
    let i = 0;
    const lengths: number[] = [];
    for (const { key, body } of bodies()) {
      const got = await pdTokens(pd.part("prefill").url, pd.part("decode").url, { requestId: `pd-${decodeBackend}-${i++}`, ...body });
      const want = soloRuns.get(key)!;
      expect({ key, ...got }).toEqual({ key, ...want });
      lengths.push(got.promptTokens + got.tokens.length);
    }
    expect(Math.max(...lengths)).toBe(S); // the "fill" request and the longest prompt reach S
    expect(await settledLeftovers(pd.clusterDir!)).toEqual([]);
  });

  it("answers the same text streaming and non-streaming, and the OpenAI client parses both", async () => {
    const client = new OpenAI({ baseURL: `${pd.url}/v1`, apiKey: "unused" });
    const models = await client.models.list();
    const id = models.data[0].id;
    for (const prompt of [TEXTS[3], TEXTS[5]]) {
      const c = await client.completions.create({ model: id, prompt, max_tokens: MAX, temperature: 0 });
      expect(c.object).toBe("text_completion");
      expect(c.choices[0].finish_reason).toMatch(/^(stop|length)$/);
      expect(c.usage!.total_tokens).toBe(c.usage!.prompt_tokens + c.usage!.completion_tokens);
      const want = soloRuns.get(`t${TEXTS.indexOf(prompt)}`)!;
      expect(c.choices[0].text).toBe(want.text);
      expect(c.usage!.prompt_tokens).toBe(want.promptTokens);
      expect(c.usage!.completion_tokens).toBe(want.tokens.length);

      const stream = await client.completions.create({ model: id, prompt, max_tokens: MAX, temperature: 0, stream: true, stream_options: { include_usage: true } });
      let text = "";
      let usage: OpenAI.CompletionUsage | undefined;
      for await (const chunk of stream) {
        text += chunk.choices[0]?.text ?? "";
        if (chunk.usage) usage = chunk.usage;
      }
      expect(text).toBe(c.choices[0].text);
      expect(usage).toEqual(c.usage);
    }
    const chat = await client.chat.completions.create({ model: id, messages: [{ role: "user", content: "Say something." }], max_tokens: MAX, temperature: 0 });
    expect(chat.object).toBe("chat.completion");
    expect(chat.choices[0].message.role).toBe("assistant");
    expect(chat.choices[0].message.content).toBe(soloRuns.get("chat")!.text);
    expect(chat.usage!.completion_tokens).toBe(soloRuns.get("chat")!.tokens.length);
    const chatStream = await client.chat.completions.create({ model: id, messages: [{ role: "user", content: "Say something." }], max_tokens: MAX, temperature: 0, stream: true });
    let chatText = "";
    let finish: string | null = null;
    for await (const chunk of chatStream) {
      chatText += chunk.choices[0]?.delta?.content ?? "";
      finish = chunk.choices[0]?.finish_reason ?? finish;
    }
    expect(chatText).toBe(chat.choices[0].message.content);
    expect(finish).toBe(chat.choices[0].finish_reason);
  });

  it("ends SSE with data: [DONE], applies stop strings and exports airm_* metrics", async () => {
    const want = soloRuns.get("t3")!;
    const r = await fetch(`${pd.url}/v1/completions`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({ model: "x", prompt: TEXTS[3], max_tokens: MAX, temperature: 0, stream: true }),
    });
    // unknown model names are rejected before any work
    expect(r.status).toBe(404);
    await r.text();
    const id = ((await (await fetch(`${pd.url}/v1/models`)).json()) as any).data[0].id;
    const ok = await fetch(`${pd.url}/v1/completions`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({ model: id, prompt: TEXTS[3], max_tokens: MAX, temperature: 0, stream: true }),
    });
    expect(ok.headers.get("content-type")).toMatch(/text\/event-stream/);
    const events = await readSse(ok);
    expect(events.at(-1)).toBe("[DONE]");
    expect(
      (events as any[])
        .slice(0, -1)
        .map((e) => e.choices[0].text)
        .join(""),
    ).toBe(want.text);

    // a stop string cut: the text up to (not including) the first occurrence
    const cut = want.text.length > 4 ? want.text.slice(2, 4) : null;
    if (cut) {
      const s: any = await (
        await fetch(`${pd.url}/v1/completions`, {
          method: "POST",
          headers: { "content-type": "application/json" },
          body: JSON.stringify({ model: id, prompt: TEXTS[3], max_tokens: MAX, temperature: 0, stop: [cut] }),
        })
      ).json();
      expect(s.choices[0].text).toBe(want.text.slice(0, want.text.indexOf(cut)));
      expect(s.choices[0].finish_reason).toBe("stop");
    }

    const metrics = await (await fetch(pd.metricsUrl!)).text();
    const value = (name: string) => Number(new RegExp(`^${name}(?:\\{[^}]*\\})? (\\S+)$`, "m").exec(metrics)?.[1]);
    expect(value("airm_ttft_p90_ms")).toBeGreaterThan(0);
    expect(value("airm_tpot_p90_ms")).toBeGreaterThan(0);
    expect(value("airm_tok_s")).toBeGreaterThan(0);
    expect(metrics).toMatch(/^airm_kv_transfer_ms\{kv_transport="shm"\} \d/m);
    const wm = await (await fetch(`${pd.part("decode").url}/metrics`)).text();
    for (const name of ["vllm:num_requests_waiting", "vllm:num_requests_running", "vllm:kv_cache_usage_perc", "airm_kv_leases_outstanding", "airm_kv_leases_expired_total"]) {
      expect(wm).toMatch(new RegExp(`^${name}\\{`, "m"));
    }
    expect(await settledLeftovers(pd.clusterDir!)).toEqual([]);
  });
});
