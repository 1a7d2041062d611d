// `airm bench sweep`: a matrix of cluster shapes (KV transport x decode batch width x P:D workers)
// and load points (closed-loop concurrencies or open-loop rates), each shape started as `airm up`
// would start it, one JSONL row per point appended as soon as it is measured. A second run with
// the same output file skips the points already there (resumable after a kill), and a shape
// whose points are all done is not started. With `url` in the config there is no cluster: only
// the load dimensions vary, against that server.

import { appendFileSync, existsSync, readFileSync } from "node:fs";
import { z } from "zod";
import { parse as parseYaml } from "yaml";
import { ConfigError } from "@airm/rm-core";
import { DEFAULT_KV_TRANSPORT } from "../defaults.ts";
import type { RunningCluster } from "../local-cluster.ts";
import { runLoad } from "./load.ts";
import { attainment, resultRow, type RequestRow, type ResultRow } from "./stats.ts";

const list = <T extends z.ZodType>(t: T) => z.union([t, z.array(t).min(1)]).transform((v) => (Array.isArray(v) ? v : [v]) as z.output<T>[]);

export const SweepConfigSchema = z
  .object({
    /** A server to sweep instead of local clusters (then no cluster dimension may vary). */
    url: z.string().url().optional(),
    transport: list(z.string().regex(/^[a-z0-9-]+$/)).default([DEFAULT_KV_TRANSPORT]),
    decodeBatch: list(z.number().int().min(1).max(256)).default([16]),
    /** "prefill:decode" worker counts, e.g. "1:2". */
    pd: list(z.string().regex(/^\d+:\d+$/, 'a P:D ratio such as "1:2"')).default(["1:2"]),
    /**
     * How requests are served: pd (KV crosses from prefill to decode), pd-local-prefill (the decode
     * workers prefill themselves: no KV crosses; the prefill workers idle), solo (as many solo
     * replicas as decode workers, each prefilling and decoding; no transport).
     */
    serve: list(z.enum(["pd", "pd-local-prefill", "solo"])).default(["pd"]),
    concurrency: list(z.number().int().min(1)).optional(),
    rate: list(z.number().positive()).optional(),
    requests: z.number().int().min(1).optional(),
    seconds: z.number().positive().optional(),
    inputTokens: z.number().int().min(1).default(128),
    outputTokens: z.number().int().min(1).default(64),
    seed: z.number().int().min(0).default(1),
    /** SLO for each point's attainment. */
    tpotSloMs: z.number().positive().default(150),
    ttftSloMs: z.number().positive().optional(),
    /** A model path for local clusters (default: airm up's). */
    model: z.string().optional(),
  })
  .strict()
  .refine((c) => (c.concurrency === undefined) !== (c.rate === undefined), { message: "give either concurrency (closed loop) or rate (open loop)" })
  .refine((c) => c.requests !== undefined || c.seconds !== undefined, { message: "give requests or seconds per point" });
export type SweepConfig = z.output<typeof SweepConfigSchema>;

/** One cluster shape of the matrix. */
export interface Shape {
  serve: "pd" | "pd-local-prefill" | "solo";
  transport: string;
  decodeBatch: number;
  prefill: number;
  decode: number;
}

/** One measured point: its shape, its load, and the figures. */
export interface SweepRow extends Shape, ResultRow {
  key: string;
  mode: "closed" | "open";
  load: number;
  attainment: number;
  inputTokens: number;
  outputTokens: number;
  /** Every request of the point, for CDFs. */
  rows?: RequestRow[];
}

/** Reads and checks a sweep file (YAML or JSON); ConfigError names the field and the file. */
export function loadSweepConfig(path: string): SweepConfig {
  let raw: unknown;
  try {
    raw = parseYaml(readFileSync(path, "utf8"));
  } catch (e) {
    throw new ConfigError(path, `cannot read the sweep: ${(e as Error).message}`);
  }
  const r = SweepConfigSchema.safeParse(raw);
  if (!r.success) {
    const i = r.error.issues[0];
    throw new ConfigError(`${path}: ${i.path.join(".") || "(top)"}`, i.message);
  }
  if (r.data.url && (r.data.transport.length > 1 || r.data.decodeBatch.length > 1 || r.data.pd.length > 1 || r.data.serve.length > 1)) {
    throw new ConfigError(`${path}: url`, "a sweep against a given server cannot vary transport, decodeBatch, pd or serve (they are that server's)");
  }
  return r.data;
}

export const shapeKey = (s: Shape) => `${s.serve === "pd" ? "" : `${s.serve}/`}${s.transport}/B${s.decodeBatch}/${s.prefill}:${s.decode}`;

/** The matrix: every shape with its points' keys, in a fixed order. */
export function sweepPoints(c: SweepConfig): { shape: Shape; points: { key: string; mode: "closed" | "open"; load: number }[] }[] {
  const shapes: Shape[] = [];
  for (const serve of c.serve) {
    for (const transport of c.transport) {
      for (const decodeBatch of c.decodeBatch) {
        for (const pd of c.pd) {
          const [prefill, decode] = pd.split(":").map(Number);
          shapes.push({ serve, transport, decodeBatch, prefill, decode });
        }
      }
    }
  }
  const mode = c.concurrency ? ("closed" as const) : ("open" as const);
  const loads = c.concurrency ?? c.rate!;
  return shapes.map((shape) => ({ shape, points: loads.map((load) => ({ key: `${shapeKey(shape)}/${mode === "closed" ? "c" : "r"}${load}`, mode, load })) }));
}

/** Keys of the rows already in `out` (a partial last line from a killed run is ignored). */
export function doneKeys(out: string): Set<string> {
  if (!existsSync(out)) return new Set();
  const keys = new Set<string>();
  for (const line of readFileSync(out, "utf8").split("\n")) {
    try {
      const row = JSON.parse(line) as { key?: string };
      if (row.key) keys.add(row.key);
    } catch {
      // a line cut by a kill, or empty
    }
  }
  return keys;
}

export interface SweepRun {
  config: SweepConfig;
  out: string;
  /** Starts the cluster of `shape` (local sweeps). */
  startCluster(shape: Shape, config: SweepConfig): Promise<RunningCluster>;
  /** The served model id at `url`. */
  modelOf(url: string): Promise<string>;
  apiKey?: string;
  /** Called before each point and after it (progress). */
  onPoint?(e: { key: string; index: number; total: number; skipped: boolean; row?: SweepRow }): void;
}

/** Runs the points not in `out` yet, appending one row each; resolves with the numbers of points run and skipped. */
export async function runSweep(s: SweepRun): Promise<{ ran: number; skipped: number }> {
  const c = s.config;
  const done = doneKeys(s.out);
  const matrix = sweepPoints(c);
  const total = matrix.reduce((a, m) => a + m.points.length, 0);
  let index = 0;
  let ran = 0;
  let skipped = 0;
  for (const { shape, points } of matrix) {
    const todo = points.filter((p) => !done.has(p.key));
    for (const p of points.filter((x) => done.has(x.key))) {
      skipped++;
      s.onPoint?.({ key: p.key, index: index++, total, skipped: true });
    }
    if (todo.length === 0) continue;
    const cluster = c.url ? null : await s.startCluster(shape, c);
    try {
      const url = c.url ?? cluster!.url;
      const model = await s.modelOf(url);
      for (const p of todo) {
        s.onPoint?.({ key: p.key, index, total, skipped: false });
        const rows = await runLoad({
          url,
          model,
          mode: p.mode === "closed" ? { kind: "closed", concurrency: p.load } : { kind: "open", rate: p.load },
          requests: c.requests,
          seconds: c.seconds,
          inputTokens: c.inputTokens,
          outputTokens: c.outputTokens,
          seed: c.seed,
          apiKey: s.apiKey,
        });
        const row: SweepRow = {
          key: p.key,
          ...shape,
          mode: p.mode,
          load: p.load,
          inputTokens: c.inputTokens,
          outputTokens: c.outputTokens,
          ...resultRow(rows),
          attainment: attainment(rows, { ttftMs: c.ttftSloMs ?? Number.POSITIVE_INFINITY, tpotMs: c.tpotSloMs }),
          rows,
        };
        appendFileSync(s.out, `${JSON.stringify(row)}\n`);
        ran++;
        s.onPoint?.({ key: p.key, index: index++, total, skipped: false, row });
      }
    } finally {
      await cluster?.stop();
    }
  }
  return { ran, skipped };
}
