// The LoRA bench's load: the serving benches' closed-loop clients (serve-load/closed-loop.ts)
// sending greedy streaming chat completions with a fixed number of new tokens (ignore_eos, so every
// run does the same work), each request's body given by the run (which model or adapter it names),
// in rounds; per run (its rounds together) output tok/s, TTFT and TPOT p50 and the errors, and
// every answer's text by prompt (to see that the adapters changed them).
import { chat, closedLoop as clients, type RequestExtras, type Round } from "../serve-load/closed-loop.ts";
import type { ChatPrompt } from "../serve-load/prompts.ts";

export type { RequestExtras, Round } from "../serve-load/closed-loop.ts";

/** A round of `c` closed-loop clients over prompts [from, to), every request with ignore_eos and `extras(i)`. */
export function closedLoop(url: string, prompts: ChatPrompt[], from: number, to: number, c: number, maxTokens: number, extras: RequestExtras): Promise<Round> {
  return clients(url, prompts, from, to, c, maxTokens, (i) => ({ ignore_eos: true, ...extras(i) }));
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

/** p50 of `xs` (NaN for none). */
export function median(xs: number[]): number {
  if (xs.length === 0) return Number.NaN;
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.ceil(0.5 * s.length) - 1]!;
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
    const s = await chat(url, prompt, 4, { ignore_eos: true, ...extras });
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
