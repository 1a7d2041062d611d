// PD over shm gives exactly the solo tokens, for both decode engines, greedy and seeded sampling
// (min_p, top-k, top-p) alike; the gateway's streaming and non-streaming answers agree; the
// standard OpenAI client parses every answer.
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
  out.push({ key: "min-p", body: { input: { prompt: "Sampling with a seed" }, maxTokens: MAX, sampling: { temperature: 1.5, minP: 0.3, seed: 1234 } } });
  out.push({ key: "min-p-off", body: { input: { prompt: "Sampling with a seed" }, maxTokens: MAX, sampling: { temperature: 1.5, seed: 1234 } } });
  out.push({ key: "min-p-top-k-p", body: { input: { prompt: "Sampling with a seed" }, maxTokens: MAX, sampling: { temperature: 1.5, minP: 0.2, topK: 8, topP: 0.9, seed: 99 } } });
  out.push({ key: "fill", body: { input: { promptTokenIds: idPrompt(S - 20, 99) }, maxTokens: null, sampling: greedy } });
  return out;
}

beforeAll(async () => {
  model = tinyModel();
  solo = await cluster({ mode: "solo", model, maxModelLen: S });
  let i = 0;
  for (const { key, body } of bodies()) soloRuns.set(key, await soloTokens(solo.part("solo").url, { requestId: `solo-${i++}`, ...body }, solo.internalToken));
  // The reference is not degenerate: prompts lead to different continuations of several tokens.
  const runs = [...soloRuns.values()];
  expect(new Set(runs.map((r) => r.tokens.join(","))).size).toBeGreaterThan(runs.length / 2);
  expect(runs.filter((r) => r.tokens.length > 1).length).toBeGreaterThan(runs.length / 2);
  // min_p changes the seeded draw (so PD matching solo on it says the field reached both workers)
  expect(soloRuns.get("min-p")!.tokens).not.toEqual(soloRuns.get("min-p-off")!.tokens);
});

afterAll(async () => {
  await solo?.stop();
  if (model) rmSync(model, { recursive: true, force: true });
});

describe.each(["atom", "rngd"])("PD over shm, decode on %s", (decodeBackend) => {
  let pd: RunningCluster;
  beforeAll(async () => {
    pd = await cluster({ model, maxModelLen: S, decode: [{ backend: decodeBackend }], kvTransport: "shm", metricsPort: 0 });
  });
  afterAll(async () => {
    await pd?.stop();
  });

  it(`gives exactly the solo tokens for ${bodies().length} prompts up to the compiled limit`, async () => {
    let i = 0;
    const lengths: number[] = [];
    for (const { key, body } of bodies()) {
      const got = await pdTokens(pd.part("prefill").url, pd.part("decode").url, { requestId: `pd-${decodeBackend}-${i++}`, ...body }, pd.internalToken);
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
      // The same counts; the streamed run, second, may find its prompt in the prefix cache.
      const { prompt_tokens_details: _d, ...counts } = c.usage!;
      expect(usage).toMatchObject(counts);
      expect(usage?.prompt_tokens_details?.cached_tokens ?? 0).toBeGreaterThanOrEqual(c.usage?.prompt_tokens_details?.cached_tokens ?? 0);
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

    // min_p (a vLLM field) through the gateway, PD and solo: the seeded tokens of the workers' own run
    const body = { model: id, prompt: "Sampling with a seed", max_tokens: MAX, temperature: 1.5, min_p: 0.3, seed: 1234 } as OpenAI.CompletionCreateParamsNonStreaming;
    const viaPd = await client.completions.create(body);
    const viaSolo = await new OpenAI({ baseURL: `${solo.url}/v1`, apiKey: "unused" }).completions.create(body);
    expect(viaPd.choices[0].text).toBe(soloRuns.get("min-p")!.text);
    expect(viaSolo.choices[0].text).toBe(soloRuns.get("min-p")!.text);
  });

  it("the OpenAI client gets logprobs/top_logprobs on chat and logprobs/echo on completions, streaming and not, equal to solo's", async () => {
    const pdClient = new OpenAI({ baseURL: `${pd.url}/v1`, apiKey: "unused" });
    const soloClient = new OpenAI({ baseURL: `${solo.url}/v1`, apiKey: "unused" });
    const id = (await pdClient.models.list()).data[0].id;
    const chatReq = { model: id, messages: [{ role: "user" as const, content: "Say something." }], max_tokens: MAX, temperature: 0, logprobs: true, top_logprobs: 5 };
    const [pdChat, soloChat] = [await pdClient.chat.completions.create(chatReq), await soloClient.chat.completions.create(chatReq)];
    const content = pdChat.choices[0].logprobs!.content!;
    expect(content.length).toBeGreaterThan(1);
    expect(content.map((c) => c.token).join("")).toBe(pdChat.choices[0].message.content);
    for (const c of content) {
      expect(c.top_logprobs).toHaveLength(5);
      expect(c.top_logprobs[0].logprob).toBeGreaterThanOrEqual(c.logprob); // greedy: the chosen one is the best
      expect(c.logprob).toBeLessThanOrEqual(0);
      expect(Buffer.from(c.bytes!).toString("utf8")).toBe(c.token);
    }
    expect(pdChat.choices[0].logprobs).toEqual(soloChat.choices[0].logprobs);

    // streamed: the chunks' logprobs add up to the non-streamed ones
    const streamed: typeof content = [];
    for await (const chunk of await pdClient.chat.completions.create({ ...chatReq, stream: true })) streamed.push(...(chunk.choices[0]?.logprobs?.content ?? []));
    expect(streamed).toEqual(content);

    // completions: logprobs 0-5 and echo (prompt tokens scored, the first one without a score)
    const compReq = { model: id, prompt: TEXTS[3], max_tokens: MAX, temperature: 0, logprobs: 3, echo: true };
    const [pdComp, soloComp] = [await pdClient.completions.create(compReq), await soloClient.completions.create(compReq)];
    const lp = pdComp.choices[0].logprobs!;
    const want = soloRuns.get("t3")!;
    expect(pdComp.choices[0].text).toBe(TEXTS[3] + want.text);
    // every prompt token, then every generated token but an end-of-sequence one
    const u = pdComp.usage!;
    expect(u.prompt_tokens).toBe(want.promptTokens);
    expect(lp.tokens!.length).toBe(u.prompt_tokens + u.completion_tokens - (pdComp.choices[0].finish_reason === "stop" ? 1 : 0));
    expect(lp.token_logprobs![0]).toBeNull();
    expect(lp.top_logprobs![0]).toBeNull();
    expect(lp.token_logprobs!.slice(1).every((x) => typeof x === "number" && x <= 0)).toBe(true);
    // the 3 alternatives and the chosen token, keyed by text (tokens that decode alike, such as partial characters, share a key)
    expect(lp.top_logprobs!.every((t, i) => i === 0 || (t !== null && t[lp.tokens![i]!] === lp.token_logprobs![i] && Object.keys(t).length <= 4))).toBe(true);
    expect(lp.text_offset![0]).toBe(0);
    expect(pdComp.choices[0].logprobs).toEqual(soloComp.choices[0].logprobs);
    let streamedText = "";
    const streamedTokens: string[] = [];
    for await (const chunk of await pdClient.completions.create({ ...compReq, stream: true })) {
      streamedText += chunk.choices[0]?.text ?? "";
      streamedTokens.push(...(chunk.choices[0]?.logprobs?.tokens ?? []));
    }
    expect(streamedText).toBe(pdComp.choices[0].text);
    expect(streamedTokens).toEqual(lp.tokens);
    // out of range: a 400 naming the parameter
    await expect(pdClient.completions.create({ ...compReq, logprobs: 6 })).rejects.toMatchObject({ status: 400, param: "logprobs" });
    await expect(pdClient.chat.completions.create({ ...chatReq, top_logprobs: 21 })).rejects.toMatchObject({ status: 400, param: "top_logprobs" });
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
