// Turns generations' events into the choices of one answer: per choice, stop strings applied to
// the streamed text (rm-core's StopStringMatcher), the finish reason, the tokens and their
// log-probabilities; then usage, and the per-request timings the gateway's metrics record. A
// request runs one generation per prompt (a completions batch has several), each with one or
// more choices (n, best_of); choice c of the generation whose first choice is `base` is the
// answer's choice base + c. Shared by the JSON and the SSE answer.

import { ApiError, type FirstToken, type TokenLogprobsEntry } from "@airm/internal-api";
import { StopStringMatcher } from "@airm/rm-core";
import { type Span, SpanStatusCode } from "@opentelemetry/api";
import type { GatewayMetrics } from "../gateway-metrics.ts";
import type { GenEvent } from "../orchestrator/index.ts";
import type { GenerationRequest } from "./request-common.ts";

export type Usage = { prompt_tokens: number; completion_tokens: number; total_tokens: number; prompt_tokens_details: { cached_tokens: number } };

/** One generation of the answer: its events after the first token, the first token (choice 0's, with the others'), and its first choice's index. */
export interface Run {
  gen: AsyncGenerator<GenEvent>;
  first: FirstToken;
  base: number;
}

export interface ChoiceOutcome {
  index: number;
  text: string;
  finishReason: "stop" | "length";
  /** Completion tokens the worker produced for it (up to a stop string; its end-of-sequence token counted). */
  tokens: number;
  /** Log-probabilities of the tokens that made the text (end-of-sequence excluded), when asked for. */
  logprobs: TokenLogprobsEntry[];
  /** Those of `logprobs` no onText call carried (their text was held back, then cut or empty). */
  unsent: TokenLogprobsEntry[];
}

export interface Outcome {
  /** By index. */
  choices: ChoiceOutcome[];
  usage: Usage;
}

/** When things happened, for airm_ttft/tpot and the KV figure. */
export class Timing {
  readonly startMs = Date.now();
  readonly startedAt = performance.now();
  firstAt = 0;
  lastAt = 0;
  kvMs: number | null = null;
  transport: string | null = null;
  /** The answer is a stream: its end, not the route's, ends the request's span. */
  streaming = false;
  private spanEnded = false;

  /** @param span the request's gateway.request span, ended by record() or endSpan(). */
  constructor(readonly span?: Span) {}

  /** Records a finished request in `metrics` (TPOT over choice 0 of the first generation's tokens) and on its span, and ends the span. */
  record(metrics: GatewayMetrics, out: Outcome): void {
    const n = out.choices[0]?.tokens ?? 0;
    const ttftMs = this.firstAt - this.startedAt;
    const tpotMs = n > 1 ? (this.lastAt - this.firstAt) / (n - 1) : null;
    metrics.record({
      startMs: this.startMs,
      endMs: Date.now(),
      ttftMs,
      tpotMs,
      completionTokens: out.usage.completion_tokens,
      kvTransferMs: this.kvMs,
      transport: this.transport,
    });
    if (this.span?.isRecording())
      this.span.setAttributes({
        "gen_ai.usage.input_tokens": out.usage.prompt_tokens,
        "gen_ai.usage.output_tokens": out.usage.completion_tokens,
        "airm.cached_tokens": out.usage.prompt_tokens_details.cached_tokens,
        "gen_ai.response.finish_reasons": out.choices.map((c) => c.finishReason),
        "airm.ttft_ms": Math.round(ttftMs * 1000) / 1000,
        ...(tpotMs !== null ? { "airm.tpot_ms": Math.round(tpotMs * 1000) / 1000 } : {}),
        ...(this.kvMs !== null ? { "airm.kv_transfer_ms": this.kvMs } : {}),
        ...(this.transport !== null ? { "airm.kv_transport": this.transport } : {}),
      });
    this.endSpan();
  }

  /** Ends the request's span once (with an error status when `error` is given). */
  endSpan(error?: string): void {
    if (!this.span || this.spanEnded) return;
    this.spanEnded = true;
    if (error !== undefined) this.span.setStatus({ code: SpanStatusCode.ERROR, message: error });
    this.span.end();
  }
}

export interface CollectOptions {
  runs: Run[];
  req: GenerationRequest;
  timing: Timing;
  /** Each text delta of choice `index` that is safe to show (never part of a stop string), with the log-probabilities of its tokens since the last one. */
  onText?(index: number, delta: string, logprobs: TokenLogprobsEntry[]): void | Promise<void>;
  /** After a choice's first token was handled (the SSE answer sends it even when its text is ""). */
  afterFirst?(index: number): void | Promise<void>;
}

/** One choice as its tokens arrive. */
class ChoiceState {
  readonly stops: StopStringMatcher;
  text = "";
  tokens = 1;
  finishReason: "stop" | "length" = "length";
  done = false;
  readonly logprobs: TokenLogprobsEntry[] = [];
  pending: TokenLogprobsEntry[] = [];

  constructor(
    readonly index: number,
    stop: string[],
    private readonly o: CollectOptions,
  ) {
    this.stops = new StopStringMatcher(stop);
  }

  scored(lp: TokenLogprobsEntry | undefined): void {
    if (!lp) return;
    this.logprobs.push(lp);
    this.pending.push(lp);
  }

  async emit(delta: string): Promise<void> {
    if (!delta) return;
    this.text += delta;
    const carried = this.pending;
    this.pending = [];
    await this.o.onText?.(this.index, delta, carried);
  }

  /** Pushes text; true when a stop string ended the choice. */
  async push(text: string): Promise<boolean> {
    await this.emit(this.stops.push(text).text);
    if (this.stops.stoppedBy === null) return false;
    this.finishReason = "stop";
    this.done = true;
    return true;
  }

  outcome(): ChoiceOutcome {
    return { index: this.index, text: this.text, finishReason: this.finishReason, tokens: this.tokens, logprobs: this.logprobs, unsent: this.pending };
  }
}

/** Consumes one generation to the end of every choice (or their stop strings). Throws ApiError for a broken stream. */
async function consume(run: Run, n: number, o: CollectOptions): Promise<ChoiceOutcome[]> {
  const firsts = [run.first, ...(run.first.others ?? [])];
  if (firsts.length !== n) throw new ApiError(502, "worker_bad_answer", `the worker answered ${firsts.length} first token(s) for ${n} choices`);
  const states = firsts.map((_, c) => new ChoiceState(run.base + c, o.req.stop, o));
  o.timing.firstAt ||= performance.now();
  o.timing.lastAt = performance.now();
  for (const [c, f] of firsts.entries()) {
    const st = states[c];
    if (!f.eos) st.scored(f.logprobs);
    await st.push(f.text);
    await o.afterFirst?.(st.index);
  }
  while (states.some((s) => !s.done)) {
    const r = await run.gen.next();
    if (r.done) throw new ApiError(502, "worker_stream_broken", "the worker stream ended without a final event");
    const ev = r.value;
    if (ev.type === "first") continue;
    const st = states[ev.choice ?? 0];
    if (!st) throw new ApiError(502, "worker_bad_answer", `the worker sent choice ${ev.choice} of ${n}`);
    if (st.done) continue;
    if (ev.type === "token") {
      st.tokens++;
      if (run.base === 0 && (ev.choice ?? 0) === 0) o.timing.lastAt = performance.now();
      st.scored(ev.logprobs);
      await st.push(ev.text);
    } else {
      st.tokens = ev.completionTokens;
      st.finishReason = ev.finishReason;
      o.timing.kvMs ??= ev.kvTransferMs;
      o.timing.transport ??= ev.transport;
      if (!(await st.push(ev.text))) await st.emit(st.stops.flush());
      st.done = true;
    }
  }
  await run.gen.return(undefined);
  return states.map((s) => s.outcome());
}

/** Consumes every generation (at once) to its end. A failure of one ends the others and is thrown. */
export async function collectChoices(o: CollectOptions): Promise<Outcome> {
  const n = o.req.bestOf;
  const results = await Promise.allSettled(o.runs.map((run) => consume(run, n, o)));
  const failure = results.find((r) => r.status === "rejected");
  if (failure) {
    await Promise.all(o.runs.map((r) => r.gen.return(undefined).catch(() => {})));
    throw (failure as PromiseRejectedResult).reason;
  }
  const choices = results.flatMap((r) => (r as PromiseFulfilledResult<ChoiceOutcome[]>).value).sort((a, b) => a.index - b.index);
  const prompt = o.runs.reduce((a, r) => a + r.first.promptTokens, 0);
  const completion = choices.reduce((a, c) => a + c.tokens, 0);
  const cached = o.runs.reduce((a, r) => a + (r.first.cachedTokens ?? 0), 0);
  return { choices, usage: { prompt_tokens: prompt, completion_tokens: completion, total_tokens: prompt + completion, prompt_tokens_details: { cached_tokens: cached } } };
}
