// `airm bench load|slo|replay|gen-trace|sweep|report`: the load generator against any OpenAI-compatible base URL
// (--url, else LLMD_GATEWAY_URL or PD_GATEWAY: a gateway in a cluster), or against `airm up`'s
// own cluster started for the run (--local). `load` runs one open-loop (--rate) or closed-loop
// (--concurrency) point; `slo` adds SLO attainment and, with --search, goodput; `replay` sends a
// trace's requests at its times (trace.ts; `gen-trace` writes a synthetic one); `sweep` runs a
// matrix of cluster shapes and load points (sweep.ts); `report` turns its rows into a page with
// plots (report.ts). Every request is a JSONL row (--out); the last stdout line is the JSON summary.

import { appendFileSync, existsSync, mkdirSync, readFileSync, writeFileSync } from "node:fs";
import { basename, dirname, join } from "node:path";
import cliProgress from "cli-progress";
import { defineCommand, defineConfig, flagOf, num, opt, switchOf, text, UsageError, int, type ConfigValues } from "@airm/rm-core";
import { parseEnvFile } from "../k8s-command.ts";
import { firstApiKey, type ClusterOptions, type RunningCluster } from "../local-cluster.ts";
import { startUpCluster } from "../up-command.ts";
import { searchGoodput } from "./goodput.ts";
import { streamedCompletion } from "./openai-stream.ts";
import { readSweepRows, writeReport } from "./report.ts";
import { loadSweepConfig, runSweep, type Shape, type SweepConfig } from "./sweep.ts";
import { readTrace, replayTrace, syntheticTrace } from "./trace.ts";
import { runLoad, type LoadOptions } from "./load.ts";
import { attainment, resultRow, type RequestRow, type Slo } from "./stats.ts";

export const BENCH_TARGET_CONFIG = defineConfig("@airm/workload-runner", {
  gatewayUrl: opt(text({ label: "URL" }), {
    env: "LLMD_GATEWAY_URL",
    defaultText: "none",
    doc: "`airm bench`'s target when --url is not given: an llm-d gateway's base URL (cluster mode).",
  }),
  pdGateway: opt(text({ label: "URL" }), {
    env: "PD_GATEWAY",
    defaultText: "none",
    doc: "`airm bench`'s target when neither --url nor LLMD_GATEWAY_URL is given: an rngd-pd gateway's base URL.",
  }),
  apiKey: opt(text({ label: "key" }), {
    env: "AIRM_API_KEY",
    defaultText: "none",
    doc: "The key `airm bench` sends (the first of a comma-separated list), as `airm up`'s gateway asks it.",
  }),
});
type Target = ConfigValues<typeof BENCH_TARGET_CONFIG.options>;

const common = {
  url: flagOf(text({ label: "URL" }), { defaultText: "LLMD_GATEWAY_URL, else PD_GATEWAY", doc: "the server's base URL (before /v1)" }),
  local: switchOf({ doc: "start `airm up`'s cluster (its defaults, free ports) for the run and stop it after" }),
  model: flagOf(text({ label: "id" }), { defaultText: "the first of /v1/models", doc: "model id to ask for" }),
  inputTokens: flagOf(int({ min: 1 }), { default: 128, doc: "prompt length in tokens (token ids, drawn from the seeded stream)" }),
  outputTokens: flagOf(int({ min: 1 }), { default: 64, doc: "max_tokens of each request (ignore_eos is sent too)" }),
  seed: flagOf(int({ min: 0 }), { default: 1, doc: "seed of the request stream: the same seed sends the same requests" }),
  requests: flagOf(int({ min: 1 }), { defaultText: "none", doc: "requests per load point" }),
  seconds: flagOf(num({ positive: true }), { defaultText: "30 unless --requests", doc: "seconds per load point" }),
  out: flagOf(text({ label: "path" }), { defaultText: "none", doc: "write every request as a JSONL row here" }),
};

export const BENCH_LOAD_COMMAND = defineCommand({
  name: "airm bench load",
  summary: "one load point against an OpenAI-compatible server: TTFT, TPOT, e2e and throughput from the client's side",
  usage: ["airm bench load (--url URL | --local) (--rate R | --concurrency C) [options]"],
  flags: {
    ...common,
    rate: flagOf(num({ positive: true }), { defaultText: "none", doc: "open loop: Poisson arrivals at this many requests per second" }),
    concurrency: flagOf(int({ min: 1 }), { defaultText: "1 unless --rate", doc: "closed loop: this many clients back to back" }),
  },
  env: [BENCH_TARGET_CONFIG],
});

export const BENCH_SLO_COMMAND = defineCommand({
  name: "airm bench slo",
  summary: "SLO attainment at a rate (or goodput, --search): the share of requests within the TTFT and TPOT SLOs",
  usage: ["airm bench slo (--url URL | --local) [--rate R | --search] [--tpot-slo-ms 150] [--ttft-slo-ms MS] [options]"],
  flags: {
    ...common,
    rate: flagOf(num({ positive: true }), { default: 1, doc: "open-loop rate of the point (the start of --search)" }),
    ttftSloMs: flagOf(num({ positive: true }), { defaultText: "none", doc: "TTFT SLO in ms" }),
    tpotSloMs: flagOf(num({ positive: true }), { default: 150, doc: "TPOT SLO in ms (the seed's)" }),
    search: switchOf({ doc: "find the goodput: the highest rate whose attainment is >= --target (doubling, then bisection)" }),
    target: flagOf(num({ min: 0, max: 1 }), { default: 0.9, doc: "attainment a rate must reach to count for goodput" }),
    maxPoints: flagOf(int({ min: 1 }), { default: 8, doc: "most load points --search runs" }),
  },
  env: [BENCH_TARGET_CONFIG],
});

export const BENCH_REPLAY_COMMAND = defineCommand({
  name: "airm bench replay",
  summary: "a trace's requests at its arrival times (scaled), each with its own input and output lengths",
  usage: ["airm bench replay (--url URL | --local) --trace FILE [--time-scale 1] [--max-requests N]"],
  flags: {
    url: common.url,
    local: common.local,
    model: common.model,
    seed: common.seed,
    out: common.out,
    trace: flagOf(text({ label: "path" }), {
      doc: "CSV in the Azure LLM inference trace 2023 layout (TIMESTAMP,ContextTokens,GeneratedTokens) or JSONL {t, input_tokens, output_tokens}",
    }),
    timeScale: flagOf(num({ positive: true }), { default: 1, doc: "speed-up: 2 sends the trace twice as fast" }),
    maxRequests: flagOf(int({ min: 1 }), { defaultText: "all", doc: "replay only the first N entries" }),
    ttftSloMs: flagOf(num({ positive: true }), { defaultText: "none", doc: "TTFT SLO in ms" }),
    tpotSloMs: flagOf(num({ positive: true }), { default: 150, doc: "TPOT SLO in ms" }),
  },
  env: [BENCH_TARGET_CONFIG],
});

export const BENCH_GEN_TRACE_COMMAND = defineCommand({
  name: "airm bench gen-trace",
  summary: "a synthetic trace in the Azure CSV layout: Poisson arrivals, log-normal input and output lengths",
  usage: ["airm bench gen-trace [--requests 200] [--rate 1] [--input-median 256] [--output-median 64] > trace.csv"],
  flags: {
    requests: flagOf(int({ min: 1 }), { default: 200, doc: "entries" }),
    rate: flagOf(num({ positive: true }), { default: 1, doc: "mean arrivals per second" }),
    inputMedian: flagOf(int({ min: 1 }), { default: 256, doc: "median prompt length (tokens)" }),
    outputMedian: flagOf(int({ min: 1 }), { default: 64, doc: "median answer length (tokens)" }),
    sigma: flagOf(num({ positive: true }), { default: 0.6, doc: "log-normal spread of both lengths" }),
    maxTotal: flagOf(int({ min: 2 }), { default: 500, doc: "longest input + output (keep it inside the served context)" }),
    seed: flagOf(int({ min: 0 }), { default: 1, doc: "seed" }),
  },
});

export const BENCH_SWEEP_COMMAND = defineCommand({
  name: "airm bench sweep",
  summary: "a matrix of cluster shapes (transport x decode batch x P:D) and load points, one JSONL row per point, resumable",
  usage: ["airm bench sweep --local --config bench/sweeps/small.yaml [--out rows.jsonl]"],
  flags: {
    config: flagOf(text({ label: "path" }), {
      doc: "the sweep (YAML): transport, decodeBatch, pd, concurrency or rate, requests or seconds, inputTokens, outputTokens, seed, url",
    }),
    local: switchOf({ doc: "start each shape's cluster as `airm up` would (needed unless the config names a url)" }),
    out: flagOf(text({ label: "path" }), { defaultText: "bench/reports/<config name>/rows.jsonl", doc: "the rows; points already in it are skipped (resume)" }),
  },
  env: [BENCH_TARGET_CONFIG],
});

export const BENCH_REPORT_COMMAND = defineCommand({
  name: "airm bench report",
  summary: "a Markdown page with SVG plots (latency-throughput, TTFT and attainment against load, TTFT CDF) from a sweep's rows",
  usage: ["airm bench report --in rows.jsonl [--out-dir DIR] [--title TEXT]"],
  flags: {
    in: flagOf(text({ label: "path" }), { doc: "a sweep's rows (JSONL)" }),
    outDir: flagOf(text({ label: "path" }), { defaultText: "the folder of --in", doc: "where README.md and the SVGs go" }),
    title: flagOf(text({ label: "text" }), { default: "Sweep report", doc: "the page's title" }),
    note: flagOf(text({ label: "text" }), { defaultText: "none", doc: "a paragraph under the title (how the rows were made, the machine)" }),
  },
});

/** `airm up`'s cluster for one sweep shape, on free ports. */
async function startShape(shape: Shape, c: SweepConfig, env: Record<string, string | undefined>): Promise<RunningCluster> {
  const argv = [
    "--kv-transport",
    shape.transport,
    "--decode-batch",
    String(shape.decodeBatch),
    "--prefill-replicas",
    String(shape.prefill),
    "--decode-replicas",
    String(shape.decode),
  ];
  if (c.model) argv.push("--model", c.model);
  const adjust = (o: ClusterOptions): ClusterOptions =>
    shape.serve === "solo"
      ? // as many solo replicas as decode workers, with the decode workers' batch and threads
        { ...o, mode: "solo", prefill: undefined, decode: undefined, solo: o.decode!.map((d) => ({ ...d, backend: undefined })) }
      : { ...o, localPrefill: shape.serve === "pd-local-prefill" };
  return (await startUpCluster(argv, { env, adjust })).cluster;
}

async function sweepCommand(rest: string[], cfg: Target, env: Record<string, string | undefined>): Promise<number> {
  const { values: f, help } = BENCH_SWEEP_COMMAND.parse(rest);
  if (help) {
    process.stdout.write(BENCH_SWEEP_COMMAND.help());
    return 0;
  }
  if (!f.config) throw new UsageError("give --config PATH (a sweep file, e.g. bench/sweeps/small.yaml)");
  const config = loadSweepConfig(f.config);
  if (!config.url && !f.local) throw new UsageError("give --local (start each shape's cluster) or name a url in the sweep file");
  const out = f.out ?? join("bench", "reports", basename(f.config).replace(/\.[^.]+$/, ""), "rows.jsonl");
  mkdirSync(dirname(out), { recursive: true });
  const apiKey = firstApiKey(cfg.apiKey);
  const bar = process.stderr.isTTY ? new cliProgress.SingleBar({ format: "sweep [{bar}] {value}/{total} {key}", hideCursor: true }, cliProgress.Presets.shades_classic) : null;
  let started = false;
  const { ran, skipped } = await runSweep({
    config,
    out,
    apiKey,
    startCluster: (shape, c) => startShape(shape, c, env),
    modelOf: (url) => modelOf(url, undefined, apiKey),
    onPoint: (e) => {
      if (bar && !started) {
        bar.start(e.total, 0, { key: "" });
        started = true;
      }
      if (e.row || e.skipped) bar?.update(e.index + 1, { key: e.key });
      if (!bar && e.row)
        process.stdout.write(
          `${e.key}: ${e.row.ok}/${e.row.requests} ok, ${e.row.airm_tok_s.toFixed(1)} tok/s, TTFT p90 ${e.row.airm_ttft_p90_ms.toFixed(0)} ms, TPOT p90 ${e.row.airm_tpot_p90_ms.toFixed(1)} ms\n`,
        );
    },
  });
  bar?.stop();
  process.stdout.write(`${JSON.stringify({ bench: "airm-bench-sweep", out, ran, skipped })}\n`);
  return 0;
}

async function replayCommand(rest: string[], cfg: Target, env: Record<string, string | undefined>): Promise<number> {
  const { values: f, help } = BENCH_REPLAY_COMMAND.parse(rest);
  if (help) {
    process.stdout.write(BENCH_REPLAY_COMMAND.help());
    return 0;
  }
  if (!f.trace) throw new UsageError("give --trace FILE (airm bench gen-trace writes a synthetic one)");
  const entries = readTrace(f.trace).slice(0, f.maxRequests);
  const slo: Slo = { ttftMs: f.ttftSloMs ?? Number.POSITIVE_INFINITY, tpotMs: f.tpotSloMs };
  const flags = { ...f, inputTokens: 0, outputTokens: 0, requests: entries.length, seconds: undefined };
  return withTarget(flags, cfg, env, async (base) => {
    const spanS = (entries.at(-1)?.atMs ?? 0) / 1000 / f.timeScale;
    process.stdout.write(`replaying ${entries.length} entries of ${f.trace} over ${spanS.toFixed(1)} s (time scale ${f.timeScale})\n`);
    const rows = await replayTrace({ url: base.url, model: base.model, entries, timeScale: f.timeScale, seed: f.seed, apiKey: base.apiKey, onRow: base.onRow });
    return { trace: f.trace, timeScale: f.timeScale, ...printRow(`replay x${f.timeScale}`, rows, slo) };
  });
}

function reportCommand(rest: string[]): number {
  const { values: f, help } = BENCH_REPORT_COMMAND.parse(rest);
  if (help) {
    process.stdout.write(BENCH_REPORT_COMMAND.help());
    return 0;
  }
  if (!f.in) throw new UsageError("give --in PATH (a sweep's rows.jsonl)");
  const dir = f.outDir ?? dirname(f.in);
  const files = writeReport(readSweepRows(f.in), dir, { title: f.title, command: `airm bench report --in ${f.in}`, note: f.note });
  process.stdout.write(`${JSON.stringify({ bench: "airm-bench-report", dir, files })}\n`);
  return 0;
}

/** The server's own airm_* figures (our gateway serves them on /metrics), or null when it has none. */
async function serverView(url: string, apiKey?: string): Promise<Record<string, number> | null> {
  try {
    const r = await fetch(`${url}/metrics`, { headers: apiKey ? { authorization: `Bearer ${apiKey}` } : {}, signal: AbortSignal.timeout(5000) });
    if (r.status !== 200) return null;
    const out: Record<string, number> = {};
    for (const m of (await r.text()).matchAll(/^(airm_(?:ttft_p90_ms|tpot_p90_ms|tok_s|kv_transfer_ms))(?:\{[^}]*\})? (\S+)$/gm)) out[m[1]] = Number(m[2]);
    return Object.keys(out).length ? out : null;
  } catch {
    return null;
  }
}

/** Where the run goes: --url, the cluster variables, or a local cluster; throws UsageError when nothing is named. */
async function target(f: { url?: string; local: boolean }, cfg: Target, env: Record<string, string | undefined>): Promise<{ url: string; cluster: RunningCluster | null }> {
  if (f.local) {
    const { cluster } = await startUpCluster([], { env });
    return { url: cluster.url, cluster };
  }
  const url = f.url ?? cfg.gatewayUrl ?? cfg.pdGateway;
  if (!url) {
    throw new UsageError("no target: give --url URL, --local, or set LLMD_GATEWAY_URL (or PD_GATEWAY) to a gateway's base URL (exported, or in deploy/k8s/cluster.local.env)");
  }
  return { url: url.replace(/\/+$/, "").replace(/\/v1$/, ""), cluster: null };
}

/** The served model: --model, else the first /v1/models lists. Throws UsageError when the server does not answer like an OpenAI server. */
async function modelOf(url: string, given: string | undefined, apiKey?: string): Promise<string> {
  if (given) return given;
  let r: Response;
  try {
    r = await fetch(`${url}/v1/models`, { headers: apiKey ? { authorization: `Bearer ${apiKey}` } : {}, signal: AbortSignal.timeout(10_000) });
  } catch (e) {
    const cause = (e as Error & { cause?: { code?: string } }).cause?.code ?? (e as Error).message;
    throw new UsageError(`${url}/v1/models did not answer (${cause}): is the server running at that URL?`);
  }
  const body = (await r.json().catch(() => null)) as { data?: { id?: string }[] } | null;
  const id = body?.data?.[0]?.id;
  if (r.status !== 200 || !id) throw new UsageError(`${url}/v1/models answered ${r.status} without a model list: not an OpenAI-compatible server (or pass --model)`);
  return id;
}

/**
 * One tiny request before the run: a target that refuses every request (a missing API key, an
 * unknown model: 4xx) ends the run at once with its message instead of filling it with failures.
 */
async function preflight(url: string, model: string, apiKey?: string): Promise<void> {
  const row = await streamedCompletion(-1, { url, model, promptTokenIds: [11, 12, 13], maxTokens: 1, apiKey }, performance.now());
  if (row.status >= 400 && row.status < 500) throw new UsageError(`${url} refused a first request (${row.error}); fix the target (model, API key) before a run`);
}

/** Prints one load point's row the way the seed's results read. */
function printRow(label: string, rows: RequestRow[], slo: Slo | null): Record<string, number> {
  const r = resultRow(rows);
  const a = slo ? attainment(rows, slo) : null;
  const f = (x: number) => (Number.isFinite(x) ? x.toFixed(1) : "-");
  process.stdout.write(
    `${label}: ${r.requests} requests, ${r.ok} ok, ${r.failed} failed | TTFT p50/p90/p99 ${f(r.airm_ttft_p50_ms)}/${f(r.airm_ttft_p90_ms)}/${f(r.airm_ttft_p99_ms)} ms | ` +
      `TPOT p50/p90/p99 ${f(r.airm_tpot_p50_ms)}/${f(r.airm_tpot_p90_ms)}/${f(r.airm_tpot_p99_ms)} ms | ${r.airm_tok_s.toFixed(1)} tok/s, ${r.req_s.toFixed(2)} req/s` +
      `${a === null ? "" : ` | attainment ${(a * 100).toFixed(1)}%`}\n`,
  );
  const failures = rows.filter((x) => x.error !== null);
  if (failures.length) process.stdout.write(`  first failure: ${failures[0].error}\n`);
  return { ...r, ...(a === null ? {} : { attainment: a }) };
}

/** What withTarget reads of a subcommand's flags. */
interface Flags {
  url?: string;
  local: boolean;
  model?: string;
  out?: string;
  inputTokens: number;
  outputTokens: number;
  seed: number;
  requests?: number;
  seconds?: number;
}

/** Runs the load points of `body` against the target of `f`, stopping a local cluster afterwards. */
async function withTarget(
  f: Flags,
  cfg: Target,
  env: Record<string, string | undefined>,
  body: (base: Omit<LoadOptions, "mode">) => Promise<Record<string, unknown>>,
): Promise<number> {
  const apiKey = firstApiKey(cfg.apiKey);
  const t = await target(f, cfg, env);
  try {
    const model = await modelOf(t.url, f.model, apiKey);
    await preflight(t.url, model, apiKey);
    if (f.out) writeFileSync(f.out, "");
    const base = {
      url: t.url,
      model,
      inputTokens: f.inputTokens,
      outputTokens: f.outputTokens,
      seed: f.seed,
      apiKey,
      requests: f.requests,
      seconds: f.seconds ?? (f.requests === undefined ? 30 : undefined),
      onRow: f.out ? (row: RequestRow) => appendFileSync(f.out!, `${JSON.stringify(row)}\n`) : undefined,
    };
    process.stdout.write(`airm bench: ${t.cluster ? "airm up's cluster at " : ""}${t.url}, model ${model}, ${f.inputTokens} tokens in, ${f.outputTokens} out, seed ${f.seed}\n`);
    const summary = await body(base);
    const server = await serverView(t.url, apiKey);
    process.stdout.write(`${JSON.stringify({ bench: "airm-bench", url: t.url, model, ...summary, ...(server ? { server } : {}) })}\n`);
    return 0;
  } finally {
    await t.cluster?.stop();
  }
}

/** `airm bench <load|slo> ...`; resolves with the exit code. Throws UsageError for a bad command line or target. */
export async function benchCommand(argv: string[], env: Record<string, string | undefined> = process.env, siteEnv = "deploy/k8s/cluster.local.env"): Promise<number> {
  const [sub, ...rest] = argv;
  // cluster mode's target from the site file (never committed), the shell's variables winning
  const fromFile = existsSync(siteEnv) ? parseEnvFile(readFileSync(siteEnv, "utf8")) : {};
  const cfg = BENCH_TARGET_CONFIG.resolve({ env: { ...fromFile, ...env } });
  if (sub === "load") {
    const { values: f, help } = BENCH_LOAD_COMMAND.parse(rest);
    if (help) {
      process.stdout.write(BENCH_LOAD_COMMAND.help());
      return 0;
    }
    if (f.rate !== undefined && f.concurrency !== undefined) throw new UsageError("give --rate (open loop) or --concurrency (closed loop), not both");
    const mode: LoadOptions["mode"] = f.rate !== undefined ? { kind: "open", rate: f.rate } : { kind: "closed", concurrency: f.concurrency ?? 1 };
    return withTarget(f, cfg, env, async (base) => {
      const rows = await runLoad({ ...base, mode });
      return {
        mode: mode.kind,
        ...(mode.kind === "open" ? { rate: mode.rate } : { concurrency: mode.concurrency }),
        ...printRow(mode.kind === "open" ? `rate ${mode.rate}/s` : `concurrency ${mode.concurrency}`, rows, null),
      };
    });
  }
  if (sub === "slo") {
    const { values: f, help } = BENCH_SLO_COMMAND.parse(rest);
    if (help) {
      process.stdout.write(BENCH_SLO_COMMAND.help());
      return 0;
    }
    const slo: Slo = { ttftMs: f.ttftSloMs ?? Number.POSITIVE_INFINITY, tpotMs: f.tpotSloMs };
    process.stdout.write(`SLO: TTFT ${f.ttftSloMs === undefined ? "none" : `<= ${f.ttftSloMs} ms`}, TPOT <= ${f.tpotSloMs} ms\n`);
    return withTarget(f, cfg, env, async (base) => {
      const point = async (rate: number) => printRow(`rate ${rate.toFixed(2)}/s`, await runLoad({ ...base, mode: { kind: "open", rate } }), slo);
      if (!f.search) return { rate: f.rate, ...(await point(f.rate)) };
      const rows: Record<string, number>[] = [];
      const { goodput, points } = await searchGoodput({
        startRate: f.rate,
        target: f.target,
        maxPoints: f.maxPoints,
        measure: async (rate) => {
          const row = await point(rate);
          rows.push({ rate, ...row });
          return row.attainment;
        },
      });
      process.stdout.write(`goodput: ${goodput.toFixed(2)} requests/s at attainment >= ${(f.target * 100).toFixed(0)}% (${points.length} points)\n`);
      const best = rows.filter((r) => r.rate === goodput)[0] ?? rows[0];
      return { goodput, target: f.target, points, ...best };
    });
  }
  if (sub === "sweep") return sweepCommand(rest, cfg, env);
  if (sub === "replay") return replayCommand(rest, cfg, env);
  if (sub === "gen-trace") {
    const { values: f, help } = BENCH_GEN_TRACE_COMMAND.parse(rest);
    process.stdout.write(help ? BENCH_GEN_TRACE_COMMAND.help() : syntheticTrace(f));
    return 0;
  }
  if (sub === "report") return reportCommand(rest);
  throw new UsageError(
    `airm bench: ${sub === undefined ? "give a subcommand" : `unknown subcommand ${JSON.stringify(sub)}`}: load, slo, replay, gen-trace, sweep or report ("airm bench load --help")`,
  );
}
