// The figures `airm top` shows, computed from readings of the parts (collect.ts): per part its
// state and load from /health, its rates from the counters of two readings (KV bytes in and out,
// decode batch width), its prefix-cache hit share over the last minute; for the cluster the TTFT
// and TPOT p50/p90 from the gateways' histogram buckets over the last minute, output tokens and
// requests per second, requests by status, 429s, migrations and preemptions. Pure but for Watch,
// which keeps the last minute of readings and the history the sparklines draw.

import type { PartSample, RawSample } from "./collect.ts";
import { addHistograms, type Histogram, histogramDelta, histogramOf, histogramQuantile, type Metrics, sumBy, sumOf } from "./prom-text.ts";
import type { PartKind } from "./targets.ts";

export type PartState = "ok" | "loading" | "draining" | "failed" | "degraded" | "unreachable";

export interface PartRow {
  name: string;
  kind: PartKind;
  role: string;
  url: string | null;
  engine: string | null;
  backend: string | null;
  /** vendor:path of its device (cpu:cpu-reference, furiosa:/dev/rngd/npu0...). */
  device: string | null;
  transport: string | null;
  state: PartState;
  draining: boolean;
  /** The gateway's circuit breaker for this worker (closed, half-open, open), when a gateway lists it. */
  circuit: string | null;
  running: number | null;
  waiting: number | null;
  /** Mean streams per decode step between the last two readings (0: no step). */
  decodeBatch: number | null;
  kvUsedBlocks: number | null;
  kvTotalBlocks: number | null;
  /** Share of looked-up prompt tokens the prefix cache served, over the last minute. */
  prefixHit: number | null;
  /** KV bytes per second in (a decode worker's pulls, a relay's received) and out (a relay's sent; a prefill's pushes when it exports them). */
  kvInBytesPerS: number | null;
  kvOutBytesPerS: number | null;
  restarts: number | null;
  error: string | null;
}

export interface Quantiles {
  p50: number | null;
  p90: number | null;
  /** Observations in the window. */
  count: number;
}

export interface ClusterFigures {
  /** The span (s) the quantiles and the prefix hit shares cover (up to the last minute); null: since the parts started. */
  windowS: number | null;
  /** Time to first token and time per output token (s). */
  ttftS: Quantiles;
  tpotS: Quantiles;
  /** Output tokens per second: the tokens the workers generated (vllm:generation_tokens_total: prefills' first tokens and decode steps'). */
  outputTokPerS: number | null;
  requestsPerS: number | null;
  /** Requests the gateways answered, by HTTP status, since they started. */
  requests: Record<string, number>;
  rateLimited: number;
  migrations: number;
  preemptions: number;
  running: number;
  waiting: number;
}

export interface Snapshot {
  at: string;
  source: string;
  /** Seconds between the two readings the rates come from (null with one reading). */
  intervalS: number | null;
  cluster: ClusterFigures;
  parts: PartRow[];
  /** Parts that could not be read, with why. */
  unreachable: { name: string; error: string }[];
  notes: string[];
}

export const WINDOW_MS = 60_000;

const num = (x: unknown): number | null => (typeof x === "number" && Number.isFinite(x) ? x : null);

/** What a counter gained from `then` to `now`; a counter that went down (a restart) counts from zero. */
export function counterGain(now: number | null, then: number | null): number | null {
  if (now === null) return null;
  if (then === null || now < then) return now;
  return now - then;
}

/** A counter's rate per second between two pages (null when `now` lacks it or no time passed). */
export function rateOf(now: Metrics | null, then: Metrics | null, name: string, dtS: number | null): number | null {
  if (!now || !then || !dtS || dtS <= 0) return null;
  const gain = counterGain(sumOf(now, name), sumOf(then, name));
  return gain === null ? null : gain / dtS;
}

/** The gateway's view of its workers, by URL: breaker state. */
function gatewayViews(parts: PartSample[]): Map<string, { circuit: string; healthy: boolean }> {
  const out = new Map<string, { circuit: string; healthy: boolean }>();
  for (const p of parts) {
    if (p.target.kind !== "gateway") continue;
    const roles = (p.health?.body as { roles?: { endpoints: { url: string; circuit: string; healthy: boolean }[] }[] } | null)?.roles ?? [];
    for (const r of roles) for (const e of r.endpoints) out.set(e.url, { circuit: e.circuit, healthy: e.healthy });
  }
  return out;
}

/** A part's state: unreachable without a /health answer, else what its /health says (draining also from airm_draining). */
function stateOf(p: PartSample): PartState {
  if (!p.health) return "unreachable";
  const status = (p.health.body as { status?: string } | null)?.status;
  if (status === "ok" || status === "loading" || status === "draining" || status === "failed" || status === "degraded") return status;
  if (p.metrics && sumOf(p.metrics, "airm_draining") === 1) return "draining";
  return p.health.status === 200 ? "ok" : "failed";
}

interface WorkerHealthView {
  role?: string;
  backend?: string;
  engine?: string;
  device?: { vendor: string; path: string } | null;
  transport?: string | null;
  kvCache?: { usedBlocks: number; totalBlocks: number } | null;
  requests?: { running: number; waiting: number };
}

/** The fields of a worker's /health a row shows. */
function workerFields(p: PartSample): Partial<PartRow> {
  const h = (p.health?.body ?? {}) as WorkerHealthView;
  const m = p.metrics;
  return {
    role: h.role ?? p.target.role,
    engine: h.engine ?? null,
    backend: h.backend ?? null,
    device: h.device ? `${h.device.vendor}:${h.device.path}` : null,
    transport: h.transport ?? null,
    running: num(h.requests?.running) ?? (m ? sumOf(m, "vllm:num_requests_running") : null),
    waiting: num(h.requests?.waiting) ?? (m ? sumOf(m, "vllm:num_requests_waiting") : null),
    kvUsedBlocks: num(h.kvCache?.usedBlocks),
    kvTotalBlocks: num(h.kvCache?.totalBlocks),
  };
}

/** Mean streams per decode step between two pages (0 when no step ran; null without the histogram). */
export function decodeBatchOf(now: Metrics | null, then: Metrics | null): number | null {
  const h = now ? histogramOf(now, "airm_worker_decode_batch_size") : null;
  if (!h) return null;
  const d = histogramDelta(h, then ? histogramOf(then, "airm_worker_decode_batch_size") : null);
  return d.count > 0 ? d.sum / d.count : 0;
}

/** Prefix-cache hits over queries between two pages (null when nothing was looked up). */
export function prefixHitOf(now: Metrics | null, then: Metrics | null): number | null {
  if (!now) return null;
  const q = counterGain(sumOf(now, "vllm:prefix_cache_queries_total"), then ? sumOf(then, "vllm:prefix_cache_queries_total") : null);
  const h = counterGain(sumOf(now, "vllm:prefix_cache_hits_total"), then ? sumOf(then, "vllm:prefix_cache_hits_total") : null);
  return q && q > 0 && h !== null ? h / q : null;
}

/** The counters of a part's KV bytes: [in, out]. */
const KV_COUNTERS: Record<PartKind, [string | null, string | null]> = {
  worker: ["airm_kv_pulled_bytes_total", "airm_kv_pushed_bytes_total"],
  relay: ["airm_kv_relay_received_bytes_total", "airm_kv_relay_sent_bytes_total"],
  gateway: [null, null],
};

/** The previous readings a part's figures compare with: the last one (rates) and the window's first (hit share). */
interface Before {
  prev: PartSample | undefined;
  dtS: number | null;
  windowStart: PartSample | undefined;
}

/** One part's row. */
export function partRow(p: PartSample, b: Before, views: Map<string, { circuit: string }>, restarts: number | null): PartRow {
  const t = p.target;
  const m = p.metrics;
  const state = stateOf(p);
  const [kvIn, kvOut] = KV_COUNTERS[t.kind];
  const base: PartRow = {
    name: t.name,
    kind: t.kind,
    role: t.role,
    url: t.url,
    engine: null,
    backend: null,
    device: null,
    transport: null,
    state,
    draining: state === "draining" || (m !== null && sumOf(m, "airm_draining") === 1),
    circuit: (t.url && views.get(t.url)?.circuit) ?? null,
    running: null,
    waiting: null,
    decodeBatch: null,
    kvUsedBlocks: null,
    kvTotalBlocks: null,
    prefixHit: null,
    kvInBytesPerS: kvIn ? rateOf(m, b.prev?.metrics ?? null, kvIn, b.dtS) : null,
    kvOutBytesPerS: kvOut ? rateOf(m, b.prev?.metrics ?? null, kvOut, b.dtS) : null,
    restarts,
    error: p.error,
  };
  if (t.kind === "gateway") return { ...base, running: num((p.health?.body as { open_requests?: number } | null)?.open_requests) };
  if (t.kind === "relay") return base;
  const fields = workerFields(p);
  return {
    ...base,
    ...fields,
    // a prefill worker runs no decode step
    decodeBatch: fields.role !== "prefill" && b.dtS ? decodeBatchOf(m, b.prev?.metrics ?? null) : null,
    prefixHit: prefixHitOf(m, b.windowStart?.metrics ?? null),
  };
}

const sum = (xs: (number | null)[]) => xs.reduce<number>((a, x) => a + (x ?? 0), 0);

/** The gateways' histogram `name` summed. */
function gatewaysHistogram(s: RawSample | null, name: string): Histogram | null {
  let h: Histogram | null = null;
  for (const p of s?.parts ?? []) if (p.target.kind === "gateway" && p.metrics) h = addHistograms(h, histogramOf(p.metrics, name));
  return h;
}

/** The p50 and p90 of what a histogram observed between two readings. */
function windowQuantiles(now: RawSample, then: RawSample | null, name: string): Quantiles {
  const h = gatewaysHistogram(now, name);
  if (!h) return { p50: null, p90: null, count: 0 };
  const d = histogramDelta(h, gatewaysHistogram(then, name));
  return { p50: histogramQuantile(d, 0.5), p90: histogramQuantile(d, 0.9), count: d.count };
}

/** A sum over the parts of `kind` of a counter's total. */
function total(s: RawSample, kind: PartKind, name: string): number {
  return sum(s.parts.filter((p) => p.target.kind === kind && p.metrics).map((p) => sumOf(p.metrics!, name)));
}

/** A sum over parts of `kind` of a counter's gain between two readings, per second (null when none of them has it). */
function clusterRate(now: RawSample, prev: RawSample | null, kind: PartKind, name: string): number | null {
  if (!prev || now.at <= prev.at) return null;
  const before = new Map(prev.parts.map((p) => [p.target.name, p.metrics]));
  // a part first read now (no page before) has no gain to count yet
  const gains = now.parts
    .filter((p) => p.target.kind === kind && p.metrics && before.get(p.target.name))
    .map((p) => counterGain(sumOf(p.metrics!, name), sumOf(before.get(p.target.name)!, name)))
    .filter((g) => g !== null);
  return gains.length ? sum(gains) / ((now.at - prev.at) / 1000) : null; // null: no part exports it
}

/** Requests by status summed over the gateways. */
function requestsByStatus(s: RawSample): Record<string, number> {
  const out: Record<string, number> = {};
  for (const p of s.parts) {
    if (p.target.kind !== "gateway" || !p.metrics) continue;
    for (const [k, v] of Object.entries(sumBy(p.metrics, "airm_gateway_requests_total", "status"))) out[k] = (out[k] ?? 0) + v;
  }
  return out;
}

/** The cluster's figures from the parts' pages. */
export function clusterFigures(now: RawSample, prev: RawSample | null, windowStart: RawSample | null, rows: PartRow[]): ClusterFigures {
  const requests = requestsByStatus(now);
  const workers = rows.filter((r) => r.kind === "worker");
  return {
    windowS: windowStart ? (now.at - windowStart.at) / 1000 : null,
    ttftS: windowQuantiles(now, windowStart, "airm_ttft_seconds"),
    tpotS: windowQuantiles(now, windowStart, "airm_tpot_seconds"),
    outputTokPerS: clusterRate(now, prev, "worker", "vllm:generation_tokens_total"),
    requestsPerS: clusterRate(now, prev, "gateway", "airm_gateway_requests_total"),
    requests,
    rateLimited: requests["429"] ?? 0,
    migrations: total(now, "gateway", "airm_migrations_total"),
    preemptions: total(now, "worker", "vllm:num_preemptions_total"),
    running: sum(workers.map((r) => r.running)),
    waiting: sum(workers.map((r) => r.waiting)),
  };
}

/**
 * The snapshot of reading `now`, with `prev` (the reading before: rates) and `windowStart` (the
 * start of the quantiles' and hit shares' window; null: since the parts started).
 */
export function buildSnapshot(source: string, now: RawSample, prev: RawSample | null, windowStart: RawSample | null, restarts: (name: string) => number | null): Snapshot {
  const dtS = prev && now.at > prev.at ? (now.at - prev.at) / 1000 : null;
  const prevOf = new Map((prev?.parts ?? []).map((p) => [p.target.name, p]));
  const startOf = new Map((windowStart?.parts ?? []).map((p) => [p.target.name, p]));
  const views = gatewayViews(now.parts);
  const parts = now.parts.map((p) => partRow(p, { prev: prevOf.get(p.target.name), dtS, windowStart: startOf.get(p.target.name) }, views, restarts(p.target.name)));
  return {
    at: new Date(now.at).toISOString(),
    source,
    intervalS: dtS,
    cluster: clusterFigures(now, prev, windowStart, parts),
    parts,
    unreachable: parts.filter((r) => r.error !== null).map((r) => ({ name: r.name, error: r.error! })),
    notes: now.notes,
  };
}

/** The history a sparkline draws: one value per reading, newest last. */
export interface Trend {
  outputTokPerS: number[];
  requestsPerS: number[];
  ttftP50: number[];
  tpotP50: number[];
  running: number[];
}

const TREND_LENGTH = 120;

/**
 * Keeps the readings of the last minute (and one before it), the restarts it saw (a part whose
 * process_start_time_seconds changed) for parts no launcher counts, and the trend of the cluster's
 * figures; each new reading gives a snapshot.
 */
export class Watch {
  private readonly readings: RawSample[] = [];
  private readonly starts = new Map<string, { start: number; seen: number }>();
  readonly trend: Trend = { outputTokPerS: [], requestsPerS: [], ttftP50: [], tpotP50: [], running: [] };

  constructor(private readonly source: string) {}

  add(r: RawSample): Snapshot {
    const prev = this.readings.at(-1) ?? null;
    this.readings.push(r);
    while (this.readings.length > 2 && r.at - this.readings[1].at >= WINDOW_MS) this.readings.shift();
    this.noteStarts(r);
    // the oldest reading kept: the last one at least a minute old, or the first (then the figures cover the parts' whole life)
    const windowStart = this.readings[0] === r ? null : this.readings[0];
    const snap = buildSnapshot(this.source, r, prev, windowStart, (name) => this.restartsOf(r, name));
    this.addTrend(snap);
    return snap;
  }

  private noteStarts(r: RawSample): void {
    for (const p of r.parts) {
      const start = p.metrics ? sumOf(p.metrics, "process_start_time_seconds") : null;
      if (start === null) continue;
      const was = this.starts.get(p.target.name);
      if (!was) this.starts.set(p.target.name, { start, seen: 0 });
      else if (start !== was.start) this.starts.set(p.target.name, { start, seen: was.seen + 1 });
    }
  }

  private restartsOf(r: RawSample, name: string): number | null {
    const counted = r.parts.find((p) => p.target.name === name)?.target.restarts;
    return counted ?? this.starts.get(name)?.seen ?? null;
  }

  private addTrend(s: Snapshot): void {
    const push = (xs: number[], x: number | null) => {
      xs.push(x ?? 0);
      if (xs.length > TREND_LENGTH) xs.shift();
    };
    push(this.trend.outputTokPerS, s.cluster.outputTokPerS);
    push(this.trend.requestsPerS, s.cluster.requestsPerS);
    push(this.trend.ttftP50, s.cluster.ttftS.p50);
    push(this.trend.tpotP50, s.cluster.tpotS.p50);
    push(this.trend.running, s.cluster.running);
  }
}
