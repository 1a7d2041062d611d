// The disaggregation decision, pure: ship a request's KV from a prefill worker to its decode
// worker (PD), or let the decode worker prefill the prompt itself (local), whichever is predicted
// to give the first token sooner. Its inputs are measured by the workers on their own traffic:
//
//   - the decode endpoint's KV bandwidth B (bytes/s): the bytes of its KV pulls over the time
//     they were moving (the union of each blob's transfer interval, waits for a blob not yet
//     pushed excluded), smoothed (EWMA);
//   - the KV bytes K a request sends: the prompt's tokens times the decode endpoint's smoothed
//     bytes per prompt token received (the KV crosses as the prompt's blocks, so bytes follow the
//     prompt), or its smoothed bytes per request where the per-token figure is not known;
//   - prefill time models t(n) = fixed + perToken * n, least-squares over each worker's last
//     prefills: the prefill endpoint's (remote) and the decode endpoint's own (local).
//
//   PD    ~ max(t_remote(n), K / B)   (layers are pushed as they are computed: transfer and
//                                      compute overlap, the slower one sets the pace)
//   local ~ t_local(n)
//   ship the KV when PD < local; otherwise prefill locally (a tie stays local: nothing crosses).
//
// Without a remote model the local one stands in (same hardware). A missing bandwidth or local
// model makes the decision explore the path that measures it, once, so both get learned.

/** The worker gauges that carry the inputs to an endpoint picker (NaN: not measured yet). */
export const ESTIMATE_GAUGES = {
  kvBandwidth: "airm_kv_bandwidth_bytes_per_second",
  kvBytes: "airm_kv_request_bytes",
  kvBytesPerToken: "airm_kv_bytes_per_token",
  prefillFixed: "airm_worker_prefill_fixed_seconds",
  prefillPerToken: "airm_worker_prefill_seconds_per_token",
  localPrefill: "airm_worker_local_prefill",
} as const;

/** A prefill time model: ms = fixedMs + msPerToken * tokens. */
export interface PrefillModel {
  fixedMs: number;
  msPerToken: number;
}

export function prefillMs(m: PrefillModel, tokens: number): number {
  return m.fixedMs + m.msPerToken * tokens;
}

/** Least squares over the last `window` (tokens, ms) samples. */
export class PrefillFit {
  private readonly samples: [number, number][] = [];
  /** The fit of the current samples (read at every /health and /metrics; refitted only after a new sample). */
  private fitted: PrefillModel | null | undefined = null;
  constructor(private readonly window = 64) {}

  add(tokens: number, ms: number): void {
    if (!(tokens > 0 && ms >= 0 && Number.isFinite(ms))) return;
    this.samples.push([tokens, ms]);
    if (this.samples.length > this.window) this.samples.shift();
    this.fitted = undefined;
  }

  /** The model, or null before the first sample. With one prompt length only: through the origin. */
  model(): PrefillModel | null {
    if (this.fitted === undefined) this.fitted = this.fit();
    return this.fitted;
  }

  private fit(): PrefillModel | null {
    const s = this.samples;
    if (s.length === 0) return null;
    const n = s.length;
    const mx = s.reduce((a, [x]) => a + x, 0) / n;
    const my = s.reduce((a, [, y]) => a + y, 0) / n;
    const sxx = s.reduce((a, [x]) => a + (x - mx) ** 2, 0);
    if (sxx === 0) return { fixedMs: 0, msPerToken: my / mx };
    const slope = s.reduce((a, [x, y]) => a + (x - mx) * (y - my), 0) / sxx;
    // a negative slope (noise over close lengths) or intercept is clamped to a line through the mean
    if (slope <= 0) return { fixedMs: my, msPerToken: 0 };
    const fixed = my - slope * mx;
    if (fixed < 0) return { fixedMs: 0, msPerToken: my / mx };
    return { fixedMs: fixed, msPerToken: slope };
  }
}

/** An exponentially weighted moving average; null before the first sample. */
export class Ewma {
  private v: number | null = null;
  constructor(private readonly alpha = 0.3) {}
  add(x: number): void {
    if (!Number.isFinite(x) || x <= 0) return;
    this.v = this.v === null ? x : this.v + this.alpha * (x - this.v);
  }
  get value(): number | null {
    return this.v;
  }
}

/** Length of the union of [start, end] intervals (ms). */
export function unionMs(intervals: { startMs: number; endMs: number }[]): number {
  const s = intervals.filter((i) => i.endMs >= i.startMs).sort((a, b) => a.startMs - b.startMs);
  let total = 0;
  let curStart = -Infinity;
  let curEnd = -Infinity;
  for (const i of s) {
    if (i.startMs > curEnd) {
      if (curEnd > curStart) total += curEnd - curStart;
      curStart = i.startMs;
      curEnd = i.endMs;
    } else curEnd = Math.max(curEnd, i.endMs);
  }
  if (curEnd > curStart) total += curEnd - curStart;
  return total;
}

export interface DisaggregationInputs {
  /** The prompt's tokens (or an estimate). */
  promptTokens: number;
  /** The decode endpoint's KV bandwidth, bytes/s (null: not measured yet). */
  bandwidth: number | null;
  /** KV bytes a request sends to it (null: not measured yet). */
  kvBytes: number | null;
  /**
   * KV bytes per prompt token it received (paged KV moves the prompt's blocks, so bytes follow the
   * prompt); when known, the request's bytes are predicted as this times promptTokens.
   */
  kvBytesPerToken?: number | null;
  /** The prefill endpoint's model (null: use the local one). */
  remote: PrefillModel | null;
  /** The decode endpoint's own prefill model (null: not measured yet). */
  local: PrefillModel | null;
  /**
   * Prompt positions the decode endpoint already holds in its prefix cache (default 0): they do
   * not cross (the handoff skips them) and a local prefill does not compute them.
   */
  heldTokens?: number;
}

export type DisaggregationReason = "kv_faster" | "local_faster" | "explore_kv" | "explore_local";

export interface DisaggregationDecision {
  ship: boolean;
  reason: DisaggregationReason;
  /** The predictions (ms), when both were made. */
  pdMs?: number;
  localMs?: number;
  kvMs?: number;
}

export const DISAGGREGATION_REASONS: readonly DisaggregationReason[] = ["kv_faster", "local_faster", "explore_kv", "explore_local"];

/** The decision for one request (see the top of this file). */
export function decideDisaggregation(i: DisaggregationInputs): DisaggregationDecision {
  const rest = Math.max(1, i.promptTokens - Math.max(0, i.heldTokens ?? 0));
  const bytes = i.kvBytesPerToken != null && i.kvBytesPerToken > 0 ? i.kvBytesPerToken * rest : i.kvBytes;
  if (i.bandwidth === null || bytes === null || !(i.bandwidth > 0)) return { ship: true, reason: "explore_kv" };
  if (i.local === null) return { ship: false, reason: "explore_local" };
  const kvMs = (bytes / i.bandwidth) * 1000;
  const localMs = prefillMs(i.local, rest);
  const pdMs = Math.max(prefillMs(i.remote ?? i.local, i.promptTokens), kvMs);
  return { ship: pdMs < localMs, reason: pdMs < localMs ? "kv_faster" : "local_faster", pdMs, localMs, kvMs };
}

/** Tokens of a prompt of `chars` characters, as the gateway and the endpoint picker estimate them (no tokenizer there). */
export const CHARS_PER_TOKEN = 4;
export function estimateTokens(chars: number): number {
  return Math.max(1, Math.ceil(chars / CHARS_PER_TOKEN));
}
