// `airm bench report`: a Markdown page with SVG plots from a sweep's JSONL rows. One series per
// cluster shape: throughput against TPOT p90 (the latency-throughput curve), TTFT p90 against the
// load, attainment against the load, and the TTFT CDF of each shape's heaviest point. The SVGs are
// drawn here (axes, ticks, polylines, a legend): no plotting dependency, and they open in any
// browser or image viewer.

import { mkdirSync, readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import type { SweepRow } from "./sweep.ts";

interface Series {
  name: string;
  points: [number, number][];
}

const COLORS = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf"];
const esc = (s: string) => s.replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;");

/** "Nice" tick values covering [lo, hi]. */
function ticks(lo: number, hi: number, n = 5): number[] {
  const span = hi - lo || Math.abs(hi) || 1;
  const raw = span / n;
  const mag = 10 ** Math.floor(Math.log10(raw));
  const step = [1, 2, 5, 10].map((m) => m * mag).find((s) => s >= raw)!;
  const out: number[] = [];
  // from the step at or below lo to the first step at or above hi, so every point is inside
  for (let v = Math.floor(lo / step) * step; ; v += step) {
    out.push(Number(v.toPrecision(12)));
    if (v >= hi - step * 1e-9) return out;
  }
}

/** A line chart as an SVG document. */
export function lineChart(title: string, xLabel: string, yLabel: string, series: Series[]): string {
  const W = 720;
  const H = 400;
  const m = { l: 70, r: 230, t: 40, b: 55 };
  const all = series.flatMap((s) => s.points).filter(([x, y]) => Number.isFinite(x) && Number.isFinite(y));
  const xs = ticks(Math.min(0, ...all.map((p) => p[0])), Math.max(1e-9, ...all.map((p) => p[0])));
  const ys = ticks(Math.min(0, ...all.map((p) => p[1])), Math.max(1e-9, ...all.map((p) => p[1])));
  const [x0, x1, y0, y1] = [xs[0], xs.at(-1)!, ys[0], ys.at(-1)!];
  const px = (x: number) => m.l + ((x - x0) / (x1 - x0 || 1)) * (W - m.l - m.r);
  const py = (y: number) => H - m.b - ((y - y0) / (y1 - y0 || 1)) * (H - m.t - m.b);
  const parts = [
    `<svg xmlns="http://www.w3.org/2000/svg" width="${W}" height="${H}" viewBox="0 0 ${W} ${H}" font-family="sans-serif" font-size="12">`,
    `<title>${esc(title)}</title>`,
    `<rect width="${W}" height="${H}" fill="white"/>`,
    `<text x="${W / 2 - m.r / 2}" y="22" text-anchor="middle" font-size="15">${esc(title)}</text>`,
    `<line x1="${m.l}" y1="${H - m.b}" x2="${W - m.r}" y2="${H - m.b}" stroke="black"/>`,
    `<line x1="${m.l}" y1="${m.t}" x2="${m.l}" y2="${H - m.b}" stroke="black"/>`,
    ...xs.map(
      (v) => `<line x1="${px(v)}" y1="${H - m.b}" x2="${px(v)}" y2="${H - m.b + 5}" stroke="black"/><text x="${px(v)}" y="${H - m.b + 18}" text-anchor="middle">${v}</text>`,
    ),
    ...ys.map((v) => `<line x1="${m.l - 5}" y1="${py(v)}" x2="${W - m.r}" y2="${py(v)}" stroke="#ddd"/><text x="${m.l - 8}" y="${py(v) + 4}" text-anchor="end">${v}</text>`),
    `<text x="${(m.l + W - m.r) / 2}" y="${H - 12}" text-anchor="middle">${esc(xLabel)}</text>`,
    `<text transform="translate(16 ${(m.t + H - m.b) / 2}) rotate(-90)" text-anchor="middle">${esc(yLabel)}</text>`,
  ];
  series.forEach((s, i) => {
    const c = COLORS[i % COLORS.length];
    const pts = s.points.filter(([x, y]) => Number.isFinite(x) && Number.isFinite(y)).sort((a, b) => a[0] - b[0]);
    if (pts.length > 1) parts.push(`<polyline fill="none" stroke="${c}" stroke-width="2" points="${pts.map(([x, y]) => `${px(x).toFixed(1)},${py(y).toFixed(1)}`).join(" ")}"/>`);
    for (const [x, y] of pts) parts.push(`<circle cx="${px(x).toFixed(1)}" cy="${py(y).toFixed(1)}" r="3" fill="${c}"/>`);
    const ly = m.t + 10 + i * 18;
    parts.push(
      `<line x1="${W - m.r + 12}" y1="${ly}" x2="${W - m.r + 32}" y2="${ly}" stroke="${c}" stroke-width="2"/><text x="${W - m.r + 38}" y="${ly + 4}">${esc(s.name)}</text>`,
    );
  });
  parts.push("</svg>");
  return `${parts.join("\n")}\n`;
}

/** The rows of a sweep's JSONL file (lines that do not parse are skipped: a killed run's last line). */
export function readSweepRows(path: string): SweepRow[] {
  return readFileSync(path, "utf8")
    .split("\n")
    .flatMap((l) => {
      try {
        return l.trim() ? [JSON.parse(l) as SweepRow] : [];
      } catch {
        return [];
      }
    });
}

const shapeName = (r: SweepRow) =>
  r.serve === "solo" ? `solo x${r.decode} B${r.decodeBatch}` : `${r.serve === "pd-local-prefill" ? "local-prefill " : ""}${r.transport} B${r.decodeBatch} ${r.prefill}:${r.decode}`;

/** Writes `<dir>/README.md` and its SVG plots from `rows`; returns the files written. */
export function writeReport(rows: SweepRow[], dir: string, o: { title: string; command: string; note?: string }): string[] {
  if (rows.length === 0) throw new Error("no sweep rows to report");
  mkdirSync(dir, { recursive: true });
  const byShape = new Map<string, SweepRow[]>();
  for (const r of rows) byShape.set(shapeName(r), [...(byShape.get(shapeName(r)) ?? []), r]);
  const loadName = rows[0].mode === "closed" ? "concurrency (clients)" : "request rate (req/s)";
  const series = (f: (r: SweepRow) => [number, number]) => [...byShape].map(([name, rs]) => ({ name, points: rs.map(f) }));
  const plots: [string, string, string][] = [
    [
      "latency-throughput.svg",
      "Latency against throughput",
      lineChart(
        "TPOT p90 against throughput",
        "output tokens/s",
        "TPOT p90 (ms)",
        series((r) => [r.airm_tok_s, r.airm_tpot_p90_ms]),
      ),
    ],
    [
      "ttft-vs-load.svg",
      "Time to first token against load",
      lineChart(
        "TTFT p90 against load",
        loadName,
        "TTFT p90 (ms)",
        series((r) => [r.load, r.airm_ttft_p90_ms]),
      ),
    ],
    [
      "attainment-vs-load.svg",
      "SLO attainment against load",
      lineChart(
        "SLO attainment against load",
        loadName,
        "attainment (%)",
        series((r) => [r.load, r.attainment * 100]),
      ),
    ],
  ];
  const cdf = [...byShape].map(([name, rs]) => {
    const heaviest = rs.reduce((a, b) => (b.load > a.load ? b : a));
    const t = (heaviest.rows ?? []).flatMap((x) => (x.ttftMs === null ? [] : [x.ttftMs])).sort((a, b) => a - b);
    return { name: `${name} @${heaviest.load}`, points: t.map((v, i) => [v, ((i + 1) / t.length) * 100] as [number, number]) };
  });
  if (cdf.some((s) => s.points.length))
    plots.push(["ttft-cdf.svg", "TTFT distribution at each shape's heaviest load", lineChart("TTFT CDF at the heaviest load", "TTFT (ms)", "requests (%)", cdf)]);
  for (const [file, , svg] of plots) writeFileSync(join(dir, file), svg);
  const f = (x: number) => (Number.isFinite(x) ? x.toFixed(1) : "-");
  const table = [
    `| shape | ${rows[0].mode === "closed" ? "clients" : "rate"} | ok / requests | tok/s | TTFT p50 / p90 (ms) | TPOT p50 / p90 (ms) | attainment |`,
    "|---|---|---|---|---|---|---|",
    ...rows.map(
      (r) =>
        `| ${shapeName(r)} | ${r.load} | ${r.ok} / ${r.requests} | ${f(r.airm_tok_s)} | ${f(r.airm_ttft_p50_ms)} / ${f(r.airm_ttft_p90_ms)} | ${f(r.airm_tpot_p50_ms)} / ${f(r.airm_tpot_p90_ms)} | ${(r.attainment * 100).toFixed(0)}% |`,
    ),
  ];
  const md = [
    `# ${o.title}`,
    "",
    `Made by \`${o.command}\` from ${rows.length} points (${rows[0].inputTokens} tokens in, ${rows[0].outputTokens} out per request).`,
    "",
    ...(o.note ? [o.note, ""] : []),
    ...plots.flatMap(([file, caption]) => [`## ${caption}`, "", `![${caption}](${file})`, ""]),
    "## Points",
    "",
    ...table,
    "",
  ].join("\n");
  writeFileSync(join(dir, "README.md"), md);
  return ["README.md", ...plots.map((p) => p[0])];
}
