// What `airm top` draws, as lines of colored segments for a screen of a given size: the title
// bar, the cluster's figures with sparklines, one row per part (columns chosen by priority to fit
// the width: 80 columns show the load, wider windows add engine, transport, device and breaker),
// the selected part's details, and the key bar; and the log view. Pure: the ink layer (tui.ts)
// only paints these lines, and `--once` prints them.

import type { PartRow, PartState, Snapshot, Trend } from "./snapshot.ts";

export type Color = "green" | "yellow" | "red" | "cyan" | "magenta" | "blue" | "gray" | "white";

export interface Segment {
  text: string;
  color?: Color;
  bold?: boolean;
  inverse?: boolean;
  dim?: boolean;
}

export type Line = Segment[];

export const SORT_KEYS = ["name", "role", "state", "running", "waiting", "batch", "kv", "hit", "kvIn", "kvOut", "restarts"] as const;
export type SortKey = (typeof SORT_KEYS)[number];

interface Column {
  title: string;
  width: number;
  /** Lower comes first when the width is short. */
  priority: number;
  right?: boolean;
  /** The sort key this column shows, if any. */
  sort?: SortKey;
  cell(r: PartRow): string;
  color?(r: PartRow): Color | undefined;
}

const DASH = "-";
const n0 = (x: number | null) => (x === null ? DASH : String(x));

/** A count, short: 982, 12k, 983k, 1.2M. */
export function fmtCount(x: number): string {
  if (x < 1000) return String(Math.round(x));
  if (x < 10_000) return `${(x / 1000).toFixed(1)}k`;
  if (x < 1_000_000) return `${Math.round(x / 1000)}k`;
  return `${(x / 1e6).toFixed(1)}M`;
}

/** Bytes per second, short: 0, 812, 12k, 3.4M, 1.2G. */
export function fmtRate(x: number | null): string {
  if (x === null) return DASH;
  if (x < 1) return "0";
  const units = ["", "k", "M", "G", "T"];
  let i = 0;
  let v = x;
  while (v >= 1000 && i < units.length - 1) {
    v /= 1000;
    i++;
  }
  return `${v >= 100 || i === 0 ? Math.round(v) : v.toFixed(1)}${units[i]}`;
}

/** A duration given in seconds, short: 850us, 42ms, 1.3s. */
export function fmtSeconds(s: number | null): string {
  if (s === null) return DASH;
  if (s < 0.001) return `${Math.round(s * 1e6)}us`;
  if (s < 1) return `${Math.round(s * 1000)}ms`;
  return `${s < 10 ? s.toFixed(1) : Math.round(s)}s`;
}

const STATE_TEXT: Record<PartState, string> = { ok: "ok", loading: "loading", draining: "draining", failed: "failed", degraded: "degraded", unreachable: "no answer" };
const STATE_COLOR: Record<PartState, Color> = { ok: "green", loading: "cyan", draining: "yellow", failed: "red", degraded: "yellow", unreachable: "red" };

const COLUMNS: Column[] = [
  { title: "PART", width: 10, priority: 0, sort: "name", cell: (r) => r.name },
  { title: "ROLE", width: 7, priority: 1, sort: "role", cell: (r) => r.role, color: (r) => (r.kind === "gateway" ? "magenta" : r.kind === "relay" ? "blue" : "cyan") },
  { title: "STATE", width: 9, priority: 0, sort: "state", cell: (r) => STATE_TEXT[r.state], color: (r) => STATE_COLOR[r.state] },
  { title: "RUN", width: 4, priority: 0, right: true, sort: "running", cell: (r) => n0(r.running) },
  { title: "WAIT", width: 4, priority: 1, right: true, sort: "waiting", cell: (r) => n0(r.waiting), color: (r) => ((r.waiting ?? 0) > 0 ? "yellow" : undefined) },
  { title: "BATCH", width: 5, priority: 2, right: true, sort: "batch", cell: (r) => (r.decodeBatch === null ? DASH : r.decodeBatch.toFixed(1)) },
  {
    title: "KV BLOCKS",
    width: 10,
    priority: 1,
    right: true,
    sort: "kv",
    cell: (r) => (r.kvTotalBlocks === null ? DASH : `${fmtCount(r.kvUsedBlocks ?? 0)}/${fmtCount(r.kvTotalBlocks)}`),
  },
  { title: "HIT", width: 4, priority: 3, right: true, sort: "hit", cell: (r) => (r.prefixHit === null ? DASH : `${Math.round(r.prefixHit * 100)}%`) },
  { title: "KV IN", width: 6, priority: 2, right: true, sort: "kvIn", cell: (r) => fmtRate(r.kvInBytesPerS) },
  { title: "KV OUT", width: 6, priority: 2, right: true, sort: "kvOut", cell: (r) => fmtRate(r.kvOutBytesPerS) },
  { title: "RST", width: 3, priority: 3, right: true, sort: "restarts", cell: (r) => n0(r.restarts), color: (r) => ((r.restarts ?? 0) > 0 ? "red" : undefined) },
  { title: "ENGINE/BACKEND", width: 16, priority: 4, cell: (r) => (r.engine ? `${r.engine}/${r.backend}` : DASH) },
  { title: "KV VIA", width: 8, priority: 5, cell: (r) => r.transport ?? DASH },
  { title: "BREAKER", width: 9, priority: 6, cell: (r) => r.circuit ?? DASH, color: (r) => (r.circuit && r.circuit !== "closed" ? "red" : undefined) },
  { title: "DEVICE", width: 20, priority: 7, cell: (r) => r.device ?? DASH },
];

/** A cell's text fitted to `width` (cut with a trailing "~" when too long). */
export function fit(text: string, width: number, right = false): string {
  const t = text.length > width ? `${text.slice(0, Math.max(0, width - 1))}~` : text;
  return right ? t.padStart(width) : t.padEnd(width);
}

/** The columns that fit `width` (a leading selection mark and one space between columns), in table order; PART takes what is left, up to 24. */
export function layoutColumns(width: number): Column[] {
  const byPriority = [...COLUMNS].sort((a, b) => a.priority - b.priority);
  const chosen = new Set<Column>();
  let used = 1;
  for (const c of byPriority) {
    const need = c.width + (chosen.size ? 1 : 0);
    if (used + need > width) break;
    chosen.add(c);
    used += need;
  }
  const extra = Math.max(0, Math.min(14, width - used));
  return COLUMNS.filter((c) => chosen.has(c)).map((c) => (c.title === "PART" ? { ...c, width: c.width + extra } : c));
}

const ROLE_ORDER = ["gateway", "prefill", "decode", "solo", "relay"];

/** The value a row sorts by. */
function sortValue(r: PartRow, key: SortKey): number | string {
  switch (key) {
    case "name":
      return `${ROLE_ORDER.indexOf(r.kind === "worker" ? r.role : r.kind === "gateway" ? "gateway" : "relay")}:${r.name.replace(/\d+/g, (d) => d.padStart(4, "0"))}`;
    case "role":
      return r.role;
    case "state":
      return STATE_TEXT[r.state];
    case "running":
      return r.running ?? -1;
    case "waiting":
      return r.waiting ?? -1;
    case "batch":
      return r.decodeBatch ?? -1;
    case "kv":
      return r.kvTotalBlocks ? (r.kvUsedBlocks ?? 0) / r.kvTotalBlocks : -1;
    case "hit":
      return r.prefixHit ?? -1;
    case "kvIn":
      return r.kvInBytesPerS ?? -1;
    case "kvOut":
      return r.kvOutBytesPerS ?? -1;
    case "restarts":
      return r.restarts ?? -1;
  }
}

/** Rows sorted by `key`: names and roles A to Z, figures largest first; `reverse` flips it. Ties keep name order. */
export function sortRows(rows: PartRow[], key: SortKey, reverse = false): PartRow[] {
  const textual = key === "name" || key === "role" || key === "state";
  const cmp = (a: PartRow, b: PartRow) => {
    const va = sortValue(a, key);
    const vb = sortValue(b, key);
    const c = textual ? String(va).localeCompare(String(vb)) : (vb as number) - (va as number);
    return c || String(sortValue(a, "name")).localeCompare(String(sortValue(b, "name")));
  };
  const out = [...rows].sort(cmp);
  return reverse ? out.reverse() : out;
}

/** Rows whose name, role or state holds `text` (case-insensitive); all of them for "". */
export function filterRows(rows: PartRow[], text: string): PartRow[] {
  const t = text.trim().toLowerCase();
  if (!t) return rows;
  return rows.filter((r) => [r.name, r.role, STATE_TEXT[r.state]].some((x) => x.toLowerCase().includes(t)));
}

const BARS = "▁▂▃▄▅▆▇█";

/** The last `width` values as bars scaled to their largest (a flat low line when all are 0). */
export function sparkline(values: number[], width: number): string {
  if (width <= 0) return "";
  const xs = values.slice(-width);
  const max = Math.max(0, ...xs);
  const bars = xs.map((x) => (max > 0 ? BARS[Math.min(BARS.length - 1, Math.round((x / max) * (BARS.length - 1)))] : BARS[0]));
  return bars.join("").padStart(width, " ");
}

/** The length of a line's text. */
export const lineLength = (l: Line) => l.reduce((a, s) => a + s.text.length, 0);

/** A line cut or padded to `width`. */
export function fitLine(l: Line, width: number): Line {
  const out: Line = [];
  let left = width;
  for (const s of l) {
    if (left <= 0) break;
    const text = s.text.length > left ? s.text.slice(0, left) : s.text;
    out.push({ ...s, text });
    left -= text.length;
  }
  if (left > 0) out.push({ text: " ".repeat(left) });
  return out;
}

/** "label value" pairs of the cluster panel, with a sparkline filling `spark` columns. */
function figure(label: string, value: string, trend: number[] | null, spark: number): Line {
  const out: Line = [
    { text: `${label} `, dim: true },
    { text: value, bold: true },
  ];
  if (trend?.length && spark > 0) out.push({ text: " " }, { text: sparkline(trend, spark), color: "cyan" });
  return out;
}

const join = (parts: Line[], gap = "  "): Line => parts.flatMap((p, i) => (i ? [{ text: gap }, ...p] : p));

/** The cluster's figures: latencies, throughput and counters, three lines. */
export function clusterLines(s: Snapshot, trend: Trend, width: number): Line[] {
  const c = s.cluster;
  const span = c.windowS === null ? "since start" : `last ${Math.round(c.windowS)}s`;
  const spark = Math.max(0, Math.min(30, Math.floor((width - 62) / 2)));
  const lat = (q: { p50: number | null; p90: number | null }) => `p50 ${fmtSeconds(q.p50)} p90 ${fmtSeconds(q.p90)}`;
  const statuses = Object.entries(c.requests)
    .sort(([a], [b]) => a.localeCompare(b))
    .map(
      ([k, v]): Line => [
        { text: `${k}:`, dim: true },
        { text: String(v), color: k.startsWith("2") ? "green" : k === "429" ? "yellow" : "red" },
      ],
    );
  return [
    join([figure("TTFT", lat(c.ttftS), trend.ttftP50, spark), figure("TPOT", lat(c.tpotS), trend.tpotP50, spark), [{ text: `(${span})`, dim: true }]]),
    join([
      figure("out", c.outputTokPerS === null ? DASH : `${c.outputTokPerS.toFixed(1)} tok/s`, trend.outputTokPerS, spark),
      figure("req", c.requestsPerS === null ? DASH : `${c.requestsPerS.toFixed(1)}/s`, trend.requestsPerS, spark),
      figure("run", String(c.running), null, 0),
      figure("wait", String(c.waiting), null, 0),
    ]),
    join([
      [{ text: "requests ", dim: true }, ...(statuses.length ? join(statuses, " ") : [{ text: "none yet" }])],
      figure("429s", String(c.rateLimited), null, 0),
      figure("migrations", String(c.migrations), null, 0),
      figure("preemptions", String(c.preemptions), null, 0),
    ]),
  ];
}

/** The table's header line, the sorted column's title in yellow (the title bar names it too). */
export function headerLine(cols: Column[], sort: SortKey): Line {
  const out: Line = [{ text: " ", inverse: true }];
  cols.forEach((c, i) => {
    if (i) out.push({ text: " ", inverse: true });
    out.push({ text: fit(c.title, c.width, c.right), inverse: true, bold: true, ...(c.sort === sort ? { color: "yellow" as const } : {}) });
  });
  return out;
}

/** One part's row; the selected one is marked and bold. */
export function rowLine(r: PartRow, cols: Column[], selected: boolean): Line {
  const out: Line = [{ text: selected ? ">" : " ", color: "cyan", bold: true }];
  cols.forEach((c, i) => {
    if (i) out.push({ text: " " });
    out.push({ text: fit(c.cell(r), c.width, c.right), color: c.color?.(r), bold: selected });
  });
  return out;
}

/** The selected part's details: what does not fit in its row. */
export function detailLine(r: PartRow | undefined): Line {
  if (!r) return [{ text: "no part matches", dim: true }];
  const bits = [
    r.engine ? `engine ${r.engine}/${r.backend}` : null,
    r.device ? `device ${r.device}` : null,
    r.transport ? `KV via ${r.transport}` : null,
    r.circuit ? `breaker ${r.circuit}` : null,
    r.url,
  ].filter((x): x is string => x !== null);
  const out: Line = [{ text: `${r.name}: `, bold: true }, { text: bits.join("  ") }];
  if (r.error) out.push({ text: `  ${r.error}`, color: "red" });
  return out;
}

export interface Screen {
  snapshot: Snapshot | null;
  trend: Trend;
  sort: SortKey;
  reverse: boolean;
  filter: string;
  /** The selected part's name. */
  selected: string | null;
  /** The bottom line: keys, a prompt or a message. */
  footer: Line;
  /** Lines in the log view, or null for the table. */
  log: { part: string; where: string; lines: string[] } | null;
}

/** The title bar. */
export function titleLine(s: Screen, width: number): Line {
  const snap = s.snapshot;
  const right = `${snap ? new Date(snap.at).toTimeString().slice(0, 8) : "--:--:--"} `; // local time
  const left = ` airm top  ${snap?.source ?? "connecting..."}  sort ${s.sort}${s.reverse ? " (reversed)" : ""}${s.filter ? `  filter "${s.filter}"` : ""}`;
  const pad = Math.max(1, width - left.length - right.length);
  return [{ text: `${left}${" ".repeat(pad)}${right}`, inverse: true, bold: true }];
}

/** What cannot be reached or known, one line (red when a part does not answer). */
export function noticeLine(snap: Snapshot): Line | null {
  if (snap.unreachable.length) {
    const [first, ...rest] = snap.unreachable;
    return [{ text: `cannot read ${first.name}: ${first.error}${rest.length ? ` (and ${rest.map((u) => u.name).join(", ")})` : ""}`, color: "red" }];
  }
  return snap.notes.length ? [{ text: snap.notes.join("; "), dim: true }] : null;
}

/** The rows shown, in order: filtered, then sorted. */
export function visibleRows(s: Screen): PartRow[] {
  return sortRows(filterRows(s.snapshot?.parts ?? [], s.filter), s.sort, s.reverse);
}

/** The whole table view for a width x height screen (exactly `height` lines, each `width` wide). */
export function tableScreen(s: Screen, width: number, height: number): Line[] {
  const head: Line[] = [titleLine(s, width)];
  if (s.snapshot) {
    head.push(...clusterLines(s.snapshot, s.trend, width));
    const notice = noticeLine(s.snapshot);
    if (notice) head.push(notice);
  }
  const cols = layoutColumns(width);
  const rows = visibleRows(s);
  const room = Math.max(1, height - head.length - 3);
  const at = Math.max(
    0,
    rows.findIndex((r) => r.name === s.selected),
  );
  const offset = Math.max(0, at - room + 1); // the selected row stays in view
  const body = rows.slice(offset, offset + room).map((r) => rowLine(r, cols, r.name === rows[at]?.name));
  const filler = Array.from({ length: Math.max(0, room - body.length) }, (): Line => []);
  const lines = [...head, headerLine(cols, s.sort), ...body, detailLine(rows[at]), ...filler, s.footer];
  return lines.slice(0, height).map((l) => fitLine(l, width));
}

/** A text cut into pieces of `width` (one empty piece for an empty text). */
export function wrap(text: string, width: number): string[] {
  if (width <= 0 || text.length <= width) return [text];
  const out: string[] = [];
  for (let i = 0; i < text.length; i += width) out.push(text.slice(i, i + width));
  return out;
}

/** The log view: the part's last lines (long ones wrapped), newest at the bottom. */
export function logScreen(s: Screen, width: number, height: number): Line[] {
  const log = s.log!;
  const room = Math.max(1, height - 3);
  const lines = log.lines
    .flatMap((l) => wrap(l.replace(/\t/g, "  ").replace(/\p{Cc}/gu, ""), width))
    .slice(-room)
    .map((t): Line => [{ text: t }]);
  const filler = Array.from({ length: Math.max(0, room - lines.length) }, (): Line => []);
  const title: Line = [{ text: ` logs of ${log.part}  ${log.where}`, inverse: true, bold: true }];
  const empty: Line[] = log.lines.length ? [] : [[{ text: "no log lines yet", dim: true }]];
  return [titleLine(s, width), title, ...empty, ...lines, ...filler, s.footer].slice(0, height).map((l) => fitLine(l, width));
}

/** The key bar of the table view. */
export const KEYS_LINE: Line = [
  ...["q quit", "s sort", "S reverse", "/ filter", "↑↓ select", "l logs", "d drain", "u resume"].flatMap((k): Line => {
    const [key, ...what] = k.split(" ");
    return [{ text: ` ${key}`, bold: true, color: "cyan" }, { text: ` ${what.join(" ")} ` }];
  }),
];

/** A screen's lines as plain text (no colors): what --once prints. */
export function plainText(lines: Line[]): string {
  return lines
    .map((l) =>
      l
        .map((s) => s.text)
        .join("")
        .trimEnd(),
    )
    .join("\n");
}
