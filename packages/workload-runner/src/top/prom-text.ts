// The Prometheus text exposition a part serves on /metrics, read into samples (name, labels,
// value), and the sums and histograms `airm top` needs from it. Pure; knows no metric by name.

/** One sample line: `name{labels} value`. */
export interface Sample {
  name: string;
  labels: Record<string, string>;
  value: number;
}

/** A page of samples by metric name (a histogram's _bucket, _sum and _count are names of their own). */
export type Metrics = Map<string, Sample[]>;

/** A cumulative histogram: `buckets` are [upper bound, count of observations <= it], ascending, ending with +Inf. */
export interface Histogram {
  buckets: [number, number][];
  sum: number;
  count: number;
}

/** The labels of a `{...}` set (quotes and escapes honoured). */
function labelsOf(set: string): Record<string, string> {
  const out: Record<string, string> = {};
  for (const m of set.matchAll(/([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"/g)) out[m[1]] = m[2].replace(/\\(.)/g, (_, c: string) => (c === "n" ? "\n" : c));
  return out;
}

/** A sample value as Prometheus writes it (NaN, +Inf, -Inf included). */
function numberOf(text: string): number {
  if (text === "+Inf" || text === "Inf") return Number.POSITIVE_INFINITY;
  if (text === "-Inf") return Number.NEGATIVE_INFINITY;
  return Number(text);
}

/** One line to a sample, or null for a comment, a blank line or a line it cannot read. */
function sampleOf(line: string): Sample | null {
  const t = line.trim();
  if (t === "" || t.startsWith("#")) return null;
  const brace = t.indexOf("{");
  const space = t.indexOf(" ");
  const hasLabels = brace >= 0 && (space < 0 || brace < space);
  const close = hasLabels ? t.lastIndexOf("}") : -1;
  if (hasLabels && close < brace) return null;
  const name = hasLabels ? t.slice(0, brace) : t.slice(0, space);
  const rest = (hasLabels ? t.slice(close + 1) : t.slice(space)).trim().split(/\s+/);
  const value = numberOf(rest[0] ?? "");
  if (!name || rest[0] === undefined || (Number.isNaN(value) && rest[0] !== "NaN")) return null;
  return { name, labels: hasLabels ? labelsOf(t.slice(brace + 1, close)) : {}, value };
}

/** Reads an exposition page. */
export function parseMetrics(text: string): Metrics {
  const out: Metrics = new Map();
  for (const line of text.split("\n")) {
    const s = sampleOf(line);
    if (!s) continue;
    const list = out.get(s.name);
    if (list) list.push(s);
    else out.set(s.name, [s]);
  }
  return out;
}

/** Whether a sample's labels hold every pair of `match`. */
const matches = (s: Sample, match: Record<string, string>) => Object.entries(match).every(([k, v]) => s.labels[k] === v);

/** The sum of `name`'s samples whose labels hold `match` (NaN samples skipped); null when the page has no such sample. */
export function sumOf(m: Metrics, name: string, match: Record<string, string> = {}): number | null {
  const xs = (m.get(name) ?? []).filter((s) => matches(s, match) && !Number.isNaN(s.value));
  return xs.length ? xs.reduce((a, s) => a + s.value, 0) : null;
}

/** `name`'s samples summed by the value of `label` (e.g. requests by status). */
export function sumBy(m: Metrics, name: string, label: string): Record<string, number> {
  const out: Record<string, number> = {};
  for (const s of m.get(name) ?? []) {
    const k = s.labels[label];
    if (k !== undefined && !Number.isNaN(s.value)) out[k] = (out[k] ?? 0) + s.value;
  }
  return out;
}

/** The histogram `name` (its _bucket, _sum, _count), summed over its label sets; null when absent. */
export function histogramOf(m: Metrics, name: string): Histogram | null {
  const raw = m.get(`${name}_bucket`);
  if (!raw?.length) return null;
  const byLe = new Map<number, number>();
  for (const s of raw) {
    const le = numberOf(s.labels.le ?? "");
    if (!Number.isNaN(le)) byLe.set(le, (byLe.get(le) ?? 0) + s.value);
  }
  const buckets = [...byLe.entries()].sort((a, b) => a[0] - b[0]);
  return { buckets, sum: sumOf(m, `${name}_sum`) ?? 0, count: sumOf(m, `${name}_count`) ?? buckets.at(-1)?.[1] ?? 0 };
}

/** Two histograms of the same buckets added (several gateways); the other when one is null. */
export function addHistograms(a: Histogram | null, b: Histogram | null): Histogram | null {
  if (!a || !b) return a ?? b;
  const byLe = new Map(a.buckets);
  for (const [le, n] of b.buckets) byLe.set(le, (byLe.get(le) ?? 0) + n);
  return { buckets: [...byLe.entries()].sort((x, y) => x[0] - y[0]), sum: a.sum + b.sum, count: a.count + b.count };
}

/**
 * What `now` observed since `then` (bucket by bucket): the observations of a window. A counter
 * that went down (the part restarted) counts from zero: `now` whole.
 */
export function histogramDelta(now: Histogram, then: Histogram | null): Histogram {
  if (!then || now.count < then.count) return now;
  const before = new Map(then.buckets);
  return {
    buckets: now.buckets.map(([le, n]) => [le, Math.max(0, n - (before.get(le) ?? 0))] as [number, number]),
    sum: now.sum - then.sum,
    count: now.count - then.count,
  };
}

/**
 * The q-quantile (0-1) of a histogram's observations as Prometheus's histogram_quantile computes
 * it: linear within the bucket the rank falls in (from 0 for the first bucket; the highest finite
 * bound when it falls in +Inf). Null without observations.
 */
export function histogramQuantile(h: Histogram, q: number): number | null {
  const total = h.buckets.at(-1)?.[1] ?? 0;
  if (total <= 0) return null;
  const rank = q * total;
  let prevLe = 0;
  let prevCount = 0;
  for (const [le, n] of h.buckets) {
    if (n >= rank) {
      if (le === Number.POSITIVE_INFINITY) return prevLe;
      if (n === prevCount) return le;
      return prevLe + (le - prevLe) * ((rank - prevCount) / (n - prevCount));
    }
    prevLe = le;
    prevCount = n;
  }
  return prevLe;
}
