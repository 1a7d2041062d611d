// The statistics every `airm bench` figure is made of: percentiles (linear interpolation between
// the closest ranks, numpy's default, so p50 of [1, 2, 3, 4] is 2.5), SLO attainment and the
// seed's result row (airm_ttft_p90_ms, airm_tpot_p90_ms, airm_tok_s). Pure functions over request
// rows; no I/O.

/** One request as the load generator saw it. Times in ms, relative to the run's start. */
export interface RequestRow {
  /** Sequence number in the run (the seeded request stream's index). */
  i: number;
  /** When it was sent and when its last byte came (ms since the run started). */
  startMs: number;
  endMs: number;
  /** HTTP status; 0 when no answer came (refused, reset). */
  status: number;
  /** Time to the first content chunk (null: none came). */
  ttftMs: number | null;
  /** Mean time per output token after the first: (last content chunk - first) / (outTokens - 1); null below 2 tokens. */
  tpotMs: number | null;
  /** Gaps between consecutive content chunks. */
  itlMs: number[];
  inTokens: number;
  outTokens: number;
  /** Why it failed (an error body's message, a stream error event, a network error). */
  error: string | null;
}

/** The q-th percentile (0-100) of `xs` by linear interpolation between closest ranks; NaN when empty. */
export function percentile(xs: number[], q: number): number {
  if (xs.length === 0) return Number.NaN;
  const s = [...xs].sort((a, b) => a - b);
  const pos = (q / 100) * (s.length - 1);
  const lo = Math.floor(pos);
  const hi = Math.ceil(pos);
  return s[lo] + (s[hi] - s[lo]) * (pos - lo);
}

export interface Slo {
  /** Most time to first token a request may take (ms; Infinity: no TTFT SLO). */
  ttftMs: number;
  /** Most mean time per output token (ms); the seed's SLO is 150. */
  tpotMs: number;
}

/** True when `r` succeeded within both SLOs (a failed request never attains; one output token has no TPOT to miss). */
export function attains(r: RequestRow, slo: Slo): boolean {
  if (r.status !== 200 || r.error !== null || r.ttftMs === null) return false;
  return r.ttftMs <= slo.ttftMs && (r.tpotMs === null || r.tpotMs <= slo.tpotMs);
}

/** The share of `rows` that attain `slo` (0 for no rows). */
export function attainment(rows: RequestRow[], slo: Slo): number {
  return rows.length === 0 ? 0 : rows.filter((r) => attains(r, slo)).length / rows.length;
}

/** The seed's result row, from the client's side, plus counts. */
export interface ResultRow {
  requests: number;
  ok: number;
  failed: number;
  airm_ttft_p50_ms: number;
  airm_ttft_p90_ms: number;
  airm_ttft_p99_ms: number;
  airm_tpot_p50_ms: number;
  airm_tpot_p90_ms: number;
  airm_tpot_p99_ms: number;
  airm_e2e_p50_ms: number;
  /** Output tokens of successful requests over the run's wall-clock span (first send to last byte). */
  airm_tok_s: number;
  /** Successful requests per second over the same span. */
  req_s: number;
}

export function resultRow(rows: RequestRow[]): ResultRow {
  const ok = rows.filter((r) => r.status === 200 && r.error === null);
  const ttft = ok.flatMap((r) => (r.ttftMs === null ? [] : [r.ttftMs]));
  const tpot = ok.flatMap((r) => (r.tpotMs === null ? [] : [r.tpotMs]));
  const spanS = rows.length ? (Math.max(...rows.map((r) => r.endMs)) - Math.min(...rows.map((r) => r.startMs))) / 1000 : 0;
  const tokens = ok.reduce((a, r) => a + r.outTokens, 0);
  return {
    requests: rows.length,
    ok: ok.length,
    failed: rows.length - ok.length,
    airm_ttft_p50_ms: percentile(ttft, 50),
    airm_ttft_p90_ms: percentile(ttft, 90),
    airm_ttft_p99_ms: percentile(ttft, 99),
    airm_tpot_p50_ms: percentile(tpot, 50),
    airm_tpot_p90_ms: percentile(tpot, 90),
    airm_tpot_p99_ms: percentile(tpot, 99),
    airm_e2e_p50_ms: percentile(
      ok.map((r) => r.endMs - r.startMs),
      50,
    ),
    airm_tok_s: spanS > 0 ? tokens / spanS : 0,
    req_s: spanS > 0 ? ok.length / spanS : 0,
  };
}
