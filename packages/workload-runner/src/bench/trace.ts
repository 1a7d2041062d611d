// Traces for `airm bench replay`: parsing (the Azure LLM inference trace 2023 CSV layout as it is,
// `TIMESTAMP,ContextTokens,GeneratedTokens`, or JSONL rows {"t": s, "input_tokens": n,
// "output_tokens": n}), a synthetic generator with the same shape, and the replay itself (each
// entry sent at its offset from the first, divided by a time scale, with its own lengths).
//
// The synthetic trace's shape: Poisson arrivals and log-normal input and output lengths, i.e.
// right-skewed with a long tail, which is the shape of the Azure conversation trace's length
// histograms. Its numbers are this project's own: medians and spreads are flags (defaults sized to
// a 512-token context), not values copied from a downloaded trace, and none is shipped.

import { readFileSync } from "node:fs";
import { ConfigError } from "@airm/rm-core";
import { streamedCompletion } from "./openai-stream.ts";
import { Rng } from "./rng.ts";
import type { RequestRow } from "./stats.ts";

export interface TraceEntry {
  /** Offset from the trace's first arrival (ms). */
  atMs: number;
  inputTokens: number;
  outputTokens: number;
}

const positiveInt = (v: unknown) => typeof v === "number" && Number.isInteger(v) && v > 0;

/** An Azure-style timestamp ("2023-11-16 18:15:46.6805900") or seconds, as ms. Null when it is neither. */
function timeOf(raw: string): number | null {
  const s = raw.trim();
  if (/^\d+(\.\d+)?$/.test(s)) return Number(s) * 1000;
  const m = /^(\d{4}-\d{2}-\d{2})[ T](\d{2}:\d{2}:\d{2})(\.\d+)?$/.exec(s);
  if (!m) return null;
  const base = Date.parse(`${m[1]}T${m[2]}Z`);
  return Number.isNaN(base) ? null : base + (m[3] ? Number(`0${m[3]}`) * 1000 : 0);
}

/** Parses a trace (CSV with a header, or JSONL); ConfigError names the file and the line of the first bad row. */
export function parseTrace(text: string, file = "trace"): TraceEntry[] {
  const lines = text.split(/\r?\n/);
  const bad = (n: number, why: string) => new ConfigError(`${file}:${n}`, why);
  const raw: { t: number; input: number; output: number }[] = [];
  const first = lines.findIndex((l) => l.trim() !== "");
  if (first < 0) throw new ConfigError(file, "the trace is empty");
  if (lines[first].trim().startsWith("{")) {
    lines.forEach((l, i) => {
      if (!l.trim()) return;
      let o: { t?: unknown; input_tokens?: unknown; output_tokens?: unknown };
      try {
        o = JSON.parse(l);
      } catch {
        throw bad(i + 1, "not a JSON object");
      }
      if (typeof o.t !== "number" || !(o.t >= 0)) throw bad(i + 1, "t must be a number of seconds >= 0");
      if (!positiveInt(o.input_tokens) || !positiveInt(o.output_tokens)) throw bad(i + 1, "input_tokens and output_tokens must be integers >= 1");
      raw.push({ t: o.t * 1000, input: o.input_tokens as number, output: o.output_tokens as number });
    });
  } else {
    const header = lines[first].split(",").map((h) => h.trim());
    const col = (name: string) => header.findIndex((h) => h.toLowerCase() === name.toLowerCase());
    const [ti, ci, gi] = [col("TIMESTAMP"), col("ContextTokens"), col("GeneratedTokens")];
    if (ti < 0 || ci < 0 || gi < 0) throw bad(first + 1, `the header must name TIMESTAMP, ContextTokens and GeneratedTokens (the Azure trace layout); got ${header.join(",")}`);
    for (let i = first + 1; i < lines.length; i++) {
      if (!lines[i].trim()) continue;
      const cells = lines[i].split(",");
      if (cells.length !== header.length) throw bad(i + 1, `${cells.length} fields where the header has ${header.length}`);
      const t = timeOf(cells[ti]);
      const input = Number(cells[ci]);
      const output = Number(cells[gi]);
      if (t === null) throw bad(i + 1, `TIMESTAMP ${JSON.stringify(cells[ti])} is neither "YYYY-MM-DD hh:mm:ss[.fraction]" nor seconds`);
      if (!positiveInt(input) || !positiveInt(output)) throw bad(i + 1, "ContextTokens and GeneratedTokens must be integers >= 1");
      raw.push({ t, input, output });
    }
  }
  if (raw.length === 0) throw new ConfigError(file, "the trace has a header but no rows");
  for (let i = 1; i < raw.length; i++) if (raw[i].t < raw[i - 1].t) throw new ConfigError(file, `arrivals go back in time at row ${i + 1} of the data`);
  const t0 = raw[0].t;
  return raw.map((r) => ({ atMs: r.t - t0, inputTokens: r.input, outputTokens: r.output }));
}

export function readTrace(path: string): TraceEntry[] {
  return parseTrace(readFileSync(path, "utf8"), path);
}

export interface SyntheticTrace {
  requests: number;
  /** Mean arrivals per second (Poisson). */
  rate: number;
  inputMedian: number;
  outputMedian: number;
  /** Log-normal sigma of both lengths. */
  sigma: number;
  /** Longest input + output (the served context). */
  maxTotal: number;
  seed: number;
}

/** A synthetic trace in the Azure CSV layout (TIMESTAMP as seconds from 0). */
export function syntheticTrace(o: SyntheticTrace): string {
  const rng = new Rng(o.seed);
  const normal = () => Math.sqrt(-2 * Math.log(1 - rng.next())) * Math.cos(2 * Math.PI * rng.next());
  const lognormal = (median: number) => Math.max(1, Math.round(median * Math.exp(o.sigma * normal())));
  const rows = ["TIMESTAMP,ContextTokens,GeneratedTokens"];
  let t = 0;
  for (let i = 0; i < o.requests; i++) {
    t += rng.gapMs(o.rate) / 1000;
    let input = lognormal(o.inputMedian);
    let output = lognormal(o.outputMedian);
    // keep both inside the context, shrinking the longer one
    while (input + output > o.maxTotal) {
      if (input >= output) input = Math.max(1, Math.floor(input / 2));
      else output = Math.max(1, Math.floor(output / 2));
    }
    rows.push(`${t.toFixed(3)},${input},${output}`);
  }
  return `${rows.join("\n")}\n`;
}

/** Sends every entry at its (scaled) offset, each with its own lengths; resolves with the rows in trace order. */
export async function replayTrace(o: {
  url: string;
  model: string;
  entries: TraceEntry[];
  timeScale: number;
  seed: number;
  apiKey?: string;
  onRow?(r: RequestRow): void;
}): Promise<RequestRow[]> {
  const rng = new Rng(o.seed);
  const start = performance.now();
  const pending: Promise<RequestRow>[] = [];
  for (const [i, e] of o.entries.entries()) {
    const prompt = Array.from({ length: e.inputTokens }, () => rng.int(10, 500));
    const wait = start + e.atMs / o.timeScale - performance.now();
    if (wait > 0) await new Promise((r) => setTimeout(r, wait));
    pending.push(
      streamedCompletion(i, { url: o.url, model: o.model, promptTokenIds: prompt, maxTokens: e.outputTokens, apiKey: o.apiKey }, start).then((row) => {
        o.onRow?.(row);
        return row;
      }),
    );
  }
  return Promise.all(pending);
}
