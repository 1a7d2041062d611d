// Turns one generation's events into completion text: stop strings applied to the streamed text
// (rm-core's StopStringMatcher), the finish reason, usage, and the per-request timings the
// gateway's metrics record. Shared by the JSON and the SSE answer.

import { ApiError, type FirstToken, type TokenLogprobsEntry } from "@airm/internal-api";
import { StopStringMatcher } from "@airm/rm-core";
import type { GatewayMetrics } from "../gateway-metrics.ts";
import type { GenEvent } from "../orchestrator/index.ts";
import type { GenerationRequest } from "./parse.ts";

export type Usage = { prompt_tokens: number; completion_tokens: number; total_tokens: number };

export interface Outcome {
  text: string;
  finishReason: "stop" | "length";
  usage: Usage;
  /** Log-probabilities of the generated tokens that made the text (end-of-sequence excluded), when asked for. */
  logprobs: TokenLogprobsEntry[];
  /** Those of `logprobs` no onText call carried (their text was held back, then cut or empty). */
  unsent: TokenLogprobsEntry[];
}

/** When things happened, for airm_ttft/tpot and the KV figure. */
export class Timing {
  readonly startMs = Date.now();
  readonly startedAt = performance.now();
  firstAt = 0;
  lastAt = 0;
  kvMs: number | null = null;
  transport: string | null = null;

  /** Records a finished request in `metrics`. */
  record(metrics: GatewayMetrics, out: Outcome): void {
    const n = out.usage.completion_tokens;
    metrics.record({
      startMs: this.startMs,
      endMs: Date.now(),
      ttftMs: this.firstAt - this.startedAt,
      tpotMs: n > 1 ? (this.lastAt - this.firstAt) / (n - 1) : null,
      completionTokens: n,
      kvTransferMs: this.kvMs,
      transport: this.transport,
    });
  }
}

export interface CollectOptions {
  gen: AsyncGenerator<GenEvent>;
  first: FirstToken;
  req: GenerationRequest;
  timing: Timing;
  /** Each text delta that is safe to show (never part of a stop string), with the log-probabilities of the tokens since the last one. */
  onText(delta: string, logprobs: TokenLogprobsEntry[]): void | Promise<void>;
  /** After the first token was handled (the SSE answer sends it even when its text is ""). */
  afterFirst?(): void | Promise<void>;
}

/** Consumes the generation to its end (or a stop string). Throws ApiError for a broken stream. */
export async function collectCompletion(o: CollectOptions): Promise<Outcome> {
  const stops = new StopStringMatcher(o.req.stop);
  let text = "";
  let tokens = 1;
  let finishReason: "stop" | "length" = "length";
  const logprobs: TokenLogprobsEntry[] = [];
  let pending: TokenLogprobsEntry[] = [];
  const scored = (lp: TokenLogprobsEntry | undefined) => {
    if (!lp) return;
    logprobs.push(lp);
    pending.push(lp);
  };
  const emit = async (delta: string) => {
    if (!delta) return;
    text += delta;
    const carried = pending;
    pending = [];
    await o.onText(delta, carried);
  };
  o.timing.firstAt = o.timing.lastAt = performance.now();
  if (!o.first.eos) scored(o.first.logprobs);
  await emit(stops.push(o.first.text).text);
  await o.afterFirst?.();
  if (stops.stoppedBy !== null) finishReason = "stop";
  else {
    for (;;) {
      const r = await o.gen.next();
      if (r.done) throw new ApiError(502, "worker_stream_broken", "the worker stream ended without a final event");
      const ev = r.value;
      if (ev.type === "token") {
        tokens++;
        o.timing.lastAt = performance.now();
        scored(ev.logprobs);
        await emit(stops.push(ev.text).text);
        if (stops.stoppedBy !== null) {
          finishReason = "stop";
          break;
        }
      } else if (ev.type === "done") {
        tokens = ev.completionTokens;
        finishReason = ev.finishReason;
        o.timing.kvMs = ev.kvTransferMs;
        o.timing.transport = ev.transport;
        await emit(stops.push(ev.text).text);
        await emit(stops.flush());
        break;
      }
    }
  }
  await o.gen.return(undefined);
  const p = o.first.promptTokens;
  return { text, finishReason, usage: { prompt_tokens: p, completion_tokens: tokens, total_tokens: p + tokens }, logprobs, unsent: pending };
}
