// The closed-loop client of the serving benches (serve-load, lora): streaming chat completions,
// greedy, each measured for TTFT (the first chunk with content), TPOT and its text; `c` clients
// each send their next request when their last one ended.
import { performance } from "node:perf_hooks";
import { sseEvents } from "../lib.ts";
import type { ChatPrompt } from "./prompts.ts";

export interface Sample {
  ok: boolean;
  error?: string;
  ttftMs: number;
  tpotMs: number | null;
  tokens: number;
  text: string;
}

/** What request `i` adds to the chat body (its `model`; llama-server's `lora`; `ignore_eos`). */
export type RequestExtras = (i: number) => Record<string, unknown>;

const failed = (error: string, tokens = 0, text = ""): Sample => ({ ok: false, error, ttftMs: 0, tpotMs: null, tokens, text });

/** One streaming chat request; TTFT is the first chunk with content, TPOT (last - first) / (tokens - 1). */
export async function chat(url: string, p: ChatPrompt, maxTokens: number, extras: Record<string, unknown>): Promise<Sample> {
  const t0 = performance.now();
  try {
    const body = { messages: p.messages, max_tokens: maxTokens, temperature: 0, stream: true, stream_options: { include_usage: true }, ...extras };
    const r = await fetch(`${url}/v1/chat/completions`, { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify(body) });
    if (!r.ok || !r.body) return failed(`HTTP ${r.status}: ${(await r.text()).slice(0, 200)}`);
    let first: number | null = null;
    let last = 0;
    let text = "";
    let tokens = 0;
    for await (const j of sseEvents(r.body)) {
      if (j.error) return failed(j.error.message, tokens, text);
      if (j.usage) tokens = j.usage.completion_tokens;
      const delta = j.choices?.[0]?.delta?.content;
      if (delta) {
        const now = performance.now();
        first ??= now;
        last = now;
        text += delta;
      }
    }
    if (first === null) return failed("no content arrived", tokens, text);
    return { ok: true, ttftMs: first - t0, tpotMs: tokens > 1 ? (last - first) / (tokens - 1) : null, tokens, text };
  } catch (e) {
    return failed((e as Error).message);
  }
}

/** One round: its requests' samples by prompt index, and its wall time. */
export interface Round {
  results: { i: number; s: Sample }[];
  wallS: number;
}

/**
 * `c` closed-loop clients over prompts [from, to) (each sends its next request when its last one
 * ended); request i's body gets `extras(i)`.
 */
export async function closedLoop(url: string, prompts: ChatPrompt[], from: number, to: number, c: number, maxTokens: number, extras: RequestExtras): Promise<Round> {
  const results: { i: number; s: Sample }[] = [];
  let next = from;
  const t0 = performance.now();
  await Promise.all(
    Array.from({ length: c }, async () => {
      for (let i = next++; i < to; i = next++) results.push({ i, s: await chat(url, prompts[i]!, maxTokens, extras(i)) });
    }),
  );
  for (const r of results) if (!r.s.ok) console.error(`  request ${r.i}: ${r.s.error}`);
  return { results, wallS: (performance.now() - t0) / 1000 };
}
