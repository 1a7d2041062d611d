// The LoRA bench's load: closed-loop clients sending streaming chat completions (greedy, a fixed
// number of new tokens with ignore_eos, so every run does the same work), each request's body
// given by the run (which model or adapter it names), in rounds; per run (its rounds together)
// output tok/s, TTFT and TPOT p50 and the errors, and every answer's text by prompt (to see that
// the adapters changed them).
import { performance } from "node:perf_hooks";
import { sseEvents } from "../lib.ts";
import type { ChatPrompt } from "../serve-load/prompts.ts";

interface Sample {
  ok: boolean;
  error?: string;
  ttftMs: number;
  tpotMs: number | null;
  tokens: number;
  text: string;
}

export interface RunResult {
  requests: number;
  errors: number;
  tokS: number;
  ttftP50: number;
  tpotP50: number;
  /** Answer text by prompt index (failed requests left out). */
  texts: Map<number, string>;
}

/** What request `i` adds to the chat body: its `model`, and llama-server's `lora` field. */
export type RequestExtras = (i: number) => Record<string, unknown>;

const failed = (error: string, tokens = 0, text = ""): Sample => ({ ok: false, error, ttftMs: 0, tpotMs: null, tokens, text });

/** p50 of `xs` (NaN for none). */
export function median(xs: number[]): number {
  if (xs.length === 0) return Number.NaN;
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.ceil(0.5 * s.length) - 1]!;
}

/** One streaming chat request; TTFT is the first chunk with content, TPOT (last - first) / (tokens - 1). */
async function chat(url: string, p: ChatPrompt, maxTokens: number, extras: Record<string, unknown>): Promise<Sample> {
  const t0 = performance.now();
  try {
    const body = { messages: p.messages, max_tokens: maxTokens, temperature: 0, ignore_eos: true, stream: true, stream_options: { include_usage: true }, ...extras };
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

/** A run's figures from its rounds: output tokens over the rounds' summed wall time, p50s over all their requests. */
export function runResult(rounds: Round[]): RunResult {
  const results = rounds.flatMap((r) => r.results);
  const ok = results.filter((r) => r.s.ok);
  const wallS = rounds.reduce((a, r) => a + r.wallS, 0);
  return {
    requests: results.length,
    errors: results.length - ok.length,
    tokS: ok.reduce((a, r) => a + r.s.tokens, 0) / wallS,
    ttftP50: median(ok.map((r) => r.s.ttftMs)),
    tpotP50: median(ok.flatMap((r) => (r.s.tpotMs === null ? [] : [r.s.tpotMs]))),
    texts: new Map(ok.map((r) => [r.i, r.s.text])),
  };
}

/** One short request per body in `warm` (sequential): compiles, loads and touches what the runs use. */
export async function warmUp(url: string, prompt: ChatPrompt, warm: Record<string, unknown>[]): Promise<void> {
  for (const extras of warm) {
    const s = await chat(url, prompt, 4, extras);
    if (!s.ok) throw new Error(`warm-up request ${JSON.stringify(extras)} failed: ${s.error}`);
  }
}

/** How many prompts answered in both runs got a different text in `b` than in `a`. */
export function changedAnswers(a: RunResult, b: RunResult): { changed: number; compared: number } {
  let changed = 0;
  let compared = 0;
  for (const [i, text] of b.texts) {
    const base = a.texts.get(i);
    if (base === undefined) continue;
    compared++;
    if (base !== text) changed++;
  }
  return { changed, compared };
}
