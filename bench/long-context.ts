// pnpm bench long-context [--lengths 512,2048,4096,8192] [--reps 2] [--llama-server auto|off|PATH]
// Long prompts through `airm up`'s defaults (the model's whole context, a paged KV cache) on the
// pulled SmolLM2-135M-Instruct GGUF (8192 positions), against llama.cpp's llama-server on the same
// GGUF (-c 8192, 2 threads: the threads of airm up's prefill worker) in the same run:
//   1. time to first token and prefill tok/s at prompts of each length (random token ids, a fresh
//      prompt per request so no prefix cache helps; max_tokens 1);
//   2. decode TPOT of one stream at a 4k context (64 new tokens);
//   3. the TPOT of 4 running streams while a 4k-token prompt prefills, against the same streams
//      undisturbed (the mean of a window before the prompt and one after its first token: their
//      TPOT grows with their context as they decode on): (a) PD, the prompt on the prefill worker; (b) the prompt chunked on the decode
//      worker itself (--local-prefill, every request prefilled there); llama-server (4 slots + 1)
//      beside them;
//   4. a 7-token prompt's TTFT p50 with the model's full context against --max-model-len 512
//      (what the paged cache is for: a short request costs the same whatever the limit).
// Final line: {"bench":"long-context", ...} with every figure and the llama-server ratios.
import { spawn } from "node:child_process";
import { performance } from "node:perf_hooks";
import { flagOf, int, list, text } from "../packages/rm-core/src/index.ts";
import { freePort } from "../packages/workload-runner/src/cluster-plan.ts";
import { benchArgs, finalLine, progress, progressDone, sseEvents, summarize } from "./lib.ts";
import { startUpCluster } from "../packages/workload-runner/src/up-command.ts";
import type { ClusterOptions, RunningCluster } from "../packages/workload-runner/src/local-cluster.ts";
import { modelId, stopChild } from "./serve-load/airm-up.ts";

import { ensureLlamaServer } from "./serve-load/llama-server.ts";
import { cachedSmolLM2 } from "./serve-load/model.ts";

const args = benchArgs("long-context", "long prompts through airm up's defaults against llama.cpp's llama-server on the same GGUF", {
  lengths: flagOf(list(int({ min: 16, max: 8191 }), /,/), { default: [512, 2048, 4096, 8191], doc: "prompt lengths in tokens (8191: the whole context but the one new token)" }),
  reps: flagOf(int({ min: 1 }), { default: 2, doc: "requests per prompt length" }),
  decodeContext: flagOf(int({ min: 16 }), { default: 4096, doc: "prompt length of the decode TPOT and interference measurements" }),
  shortReps: flagOf(int({ min: 1 }), { default: 15, doc: "7-token requests per max_model_len setting" }),
  llamaServer: flagOf(text({ label: "auto|off|path" }), { default: "auto", doc: "llama-server: build and cache it when missing (auto), skip it (off), or this binary" }),
});

const gguf = cachedSmolLM2();
if (!gguf) {
  console.error("long-context needs the pulled model: pnpm exec airm model pull smollm2-135m-instruct");
  process.exit(2);
}

/** Token ids of a prompt, seeded (ids 300..20299: no special tokens of SmolLM2's vocabulary). */
function promptIds(seed: number, n: number): number[] {
  let x = (seed * 2654435761) >>> 0 || 1;
  return Array.from({ length: n }, () => {
    x ^= x << 13;
    x ^= x >>> 17;
    x ^= x << 5;
    return 300 + ((x >>> 0) % 20000);
  });
}

interface Stream {
  ok: boolean;
  error?: string;
  ttftMs: number;
  /** When each token arrived (performance.now()). */
  at: number[];
}

/**
 * One streamed completion of token ids; TTFT is the first token's arrival. With `signal`, an
 * abort ends it early and it resolves with the tokens so far (ok).
 */
async function complete(url: string, model: string, prompt: number[], maxTokens: number, signal?: AbortSignal): Promise<Stream> {
  const t0 = performance.now();
  const at: number[] = [];
  try {
    const r = await fetch(`${url}/v1/completions`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({ model, prompt, max_tokens: maxTokens, temperature: 0, ignore_eos: true, stream: true }),
      signal,
    });
    if (!r.ok || !r.body) return { ok: false, error: `HTTP ${r.status}: ${(await r.text()).slice(0, 300)}`, ttftMs: 0, at: [] };
    for await (const j of sseEvents(r.body)) {
      if (j.error) return { ok: false, error: j.error.message, ttftMs: 0, at };
      if (j.choices?.[0]?.text !== undefined && j.choices[0].text !== "") at.push(performance.now());
      else if (j.choices?.[0]?.finish_reason && at.length === 0) at.push(performance.now());
    }
  } catch (e) {
    if (!signal?.aborted) return { ok: false, error: (e as Error).message, ttftMs: 0, at };
  }
  if (at.length === 0) return { ok: false, error: "no token arrived", ttftMs: 0, at };
  return { ok: true, ttftMs: at[0] - t0, at };
}

const gaps = (at: number[]): number[] => at.slice(1).map((t, i) => t - at[i]);
const median = (xs: number[]): number => (xs.length ? summarize(xs).median : Number.NaN);
const mean = (xs: number[]): number => (xs.length ? xs.reduce((x, y) => x + y, 0) / xs.length : Number.NaN);
const must = (s: Stream, what: string): Stream => {
  if (!s.ok) throw new Error(`${what}: ${s.error}`);
  return s;
};

interface Sweep {
  ttftMs: Record<number, number>;
  tokS: Record<number, number>;
}

/** TTFT and prefill tok/s per prompt length (medians over `reps` fresh prompts). */
async function prefillSweep(url: string, model: string, who: string, seed0: number): Promise<Sweep> {
  const out: Sweep = { ttftMs: {}, tokS: {} };
  for (const n of args.lengths) {
    const ttfts: number[] = [];
    for (let r = 0; r < args.reps; r++) {
      progress(`${who}: prompt of ${n} tokens, ${r + 1}/${args.reps}`);
      ttfts.push(must(await complete(url, model, promptIds(seed0 + n * 10 + r, n), 1), `${who} prompt ${n}`).ttftMs);
    }
    out.ttftMs[n] = median(ttfts);
    out.tokS[n] = (n / out.ttftMs[n]) * 1000;
  }
  progressDone();
  return out;
}

/** Decode TPOT (median gap) of one stream after a prompt of `decodeContext` tokens. */
async function decodeTpot(url: string, model: string, who: string, seed: number): Promise<number> {
  progress(`${who}: decode at a ${args.decodeContext}-token context`);
  const s = must(await complete(url, model, promptIds(seed, args.decodeContext), 64), `${who} decode`);
  progressDone();
  return median(gaps(s.at));
}

/**
 * Four streams decode (short prompts, many tokens): their gaps over a quiet window, then a
 * `decodeContext`-token prompt arrives and their gaps until its first token, then a quiet window
 * after it. A stream's TPOT grows with its context, and the streams decode on through the prompt
 * (minutes when it chunks beside them), so the undisturbed reference is the mean of the windows
 * before and after: the ratio is what the prompt cost them, not what their own growth did. A
 * window's TPOT is vLLM's: each stream's mean gap in it, then the median over the streams (a
 * chunk every few passes shows in the mean, where a median of gaps would hide it).
 */
async function interference(
  url: string,
  model: string,
  who: string,
  seed: number,
): Promise<{ beforeMs: number; duringMs: number; afterMs: number; undisturbedMs: number; ratio: number; longTtftMs: number }> {
  progress(`${who}: 4 streams, then a ${args.decodeContext}-token prompt beside them`);
  const stop = new AbortController();
  const streams = Array.from({ length: 4 }, (_, i) => complete(url, model, promptIds(seed + i, 24), 8000, stop.signal));
  const t0 = performance.now();
  await new Promise((r) => setTimeout(r, 4000));
  const before = { from: t0 + 1500, to: performance.now() };
  const longStart = performance.now();
  const long = must(await complete(url, model, promptIds(seed + 100, args.decodeContext), 1), `${who} long prompt`);
  const longFirst = longStart + long.ttftMs;
  await new Promise((r) => setTimeout(r, 3000));
  const after = { from: longFirst + 500, to: performance.now() };
  stop.abort();
  const done = await Promise.all(streams);
  done.forEach((s, i) => must(s, `${who} stream ${i}`));
  // vLLM's TPOT: per stream, the mean gap between its tokens in the window; then the median of the streams
  const window = (from: number, to: number) => median(done.map((s) => mean(gaps(s.at.filter((t) => t >= from && t <= to)))).filter((x) => Number.isFinite(x)));
  const beforeMs = window(before.from, before.to);
  const afterMs = window(after.from, after.to);
  const duringMs = window(longStart, longFirst);
  const undisturbedMs = (beforeMs + afterMs) / 2;
  progressDone();
  return { beforeMs, duringMs, afterMs, undisturbedMs, ratio: duringMs / undisturbedMs, longTtftMs: long.ttftMs };
}

/** TTFT p50 of a 7-token prompt, max_tokens 1 (a fresh prompt each time). */
async function shortTtft(url: string, model: string, seed: number): Promise<number> {
  const xs: number[] = [];
  for (let i = 0; i < args.shortReps; i++) xs.push(must(await complete(url, model, promptIds(seed + i, 7), 1), "7-token prompt").ttftMs);
  return median(xs.slice(2)); // the first two warm the parts up
}

const report: Record<string, unknown> = { bench: "long-context", model: "SmolLM2-135M-Instruct.Q4_1", lengths: args.lengths };

/** airm up's cluster with its defaults and `flags` (one decode worker, so the 4 streams share it), in this process. */
async function up(flags: string[], adjust?: (c: ClusterOptions) => ClusterOptions): Promise<{ url: string; cluster: RunningCluster }> {
  const { cluster } = await startUpCluster(["--model", gguf!, "--decode-replicas", "1", ...flags], { env: process.env, adjust });
  return { url: cluster.url, cluster };
}

// --- airm up (defaults), PD
let ours = await up([]);
try {
  const id = await modelId(ours.url);
  const sweep = await prefillSweep(ours.url, id, "airm up", 1);
  const tpot = await decodeTpot(ours.url, id, "airm up", 7);
  const pd = await interference(ours.url, id, "airm up (PD)", 11);
  const fullCtx = await shortTtft(ours.url, id, 50);
  Object.assign(report, { ours: { ttft_ms: sweep.ttftMs, prefill_tok_s: sweep.tokS, decode_tpot_ms_at_context: tpot, interference_pd: pd, short_ttft_ms_full_context: fullCtx } });
  console.log(`airm up: TTFT ${JSON.stringify(sweep.ttftMs)} ms; prefill tok/s ${JSON.stringify(sweep.tokS)}; decode TPOT at ${args.decodeContext}: ${tpot.toFixed(1)} ms`);
  console.log(
    `airm up (PD): 4 streams' TPOT ${pd.duringMs.toFixed(1)} ms while a ${args.decodeContext}-token prompt prefilled, ${pd.beforeMs.toFixed(1)} before and ${pd.afterMs.toFixed(1)} after (${pd.ratio.toFixed(2)}x)`,
  );
} finally {
  await ours.cluster.stop();
}

// --- the same, max_model_len 512: a short prompt's TTFT
ours = await up(["--max-model-len", "512"]);
try {
  const id = await modelId(ours.url);
  const short512 = await shortTtft(ours.url, id, 50);
  const full = (report.ours as { short_ttft_ms_full_context: number }).short_ttft_ms_full_context;
  Object.assign(report.ours as object, { short_ttft_ms_max_model_len_512: short512, short_ttft_ratio: full / short512 });
  console.log(`airm up: a 7-token prompt's TTFT p50 ${full.toFixed(1)} ms at max_model_len 8192, ${short512.toFixed(1)} ms at 512 (${(full / short512).toFixed(2)}x)`);
} finally {
  await ours.cluster.stop();
}

// --- airm up, every request prefilled on the decode worker (the prompt chunked beside the streams)
ours = await up([], (c) => ({ ...c, localPrefill: true }));
try {
  const id = await modelId(ours.url);
  const local = await interference(ours.url, id, "airm up (local prefill)", 21);
  Object.assign(report.ours as object, { interference_local: local });
  console.log(
    `airm up (--local-prefill): 4 streams' TPOT ${local.duringMs.toFixed(1)} ms while a ${args.decodeContext}-token prompt prefilled chunked beside them, ${local.beforeMs.toFixed(1)} before and ${local.afterMs.toFixed(1)} after (${local.ratio.toFixed(2)}x; its TTFT ${(local.longTtftMs / 1000).toFixed(1)} s)`,
  );
} finally {
  await ours.cluster.stop();
}

// --- llama-server on the same GGUF
const server = await ensureLlamaServer(args.llamaServer);
if ("skipped" in server) {
  console.log(`llama-server: skipped (${server.skipped})`);
  report.llama_server = { skipped: server.skipped };
} else {
  const port = await freePort();
  const child = spawn(server.bin, ["-m", gguf, "-t", "2", "-c", String(8192 * 5), "-np", "5", "--host", "127.0.0.1", "--port", String(port)], { stdio: "ignore", env: server.env });
  try {
    const url = `http://127.0.0.1:${port}`;
    for (let i = 0; ; i++) {
      if (child.exitCode !== null) throw new Error(`llama-server exited ${child.exitCode}`);
      if (
        await fetch(`${url}/health`).then(
          (r) => r.ok,
          () => false,
        )
      )
        break;
      if (i > 600) throw new Error("llama-server not healthy after 120 s");
      await new Promise((r) => setTimeout(r, 200));
    }
    const sweep = await prefillSweep(url, "smollm2", "llama-server", 1);
    const tpot = await decodeTpot(url, "smollm2", "llama-server", 7);
    const mixed = await interference(url, "smollm2", "llama-server", 11);
    const o = report.ours as { ttft_ms: Record<number, number>; decode_tpot_ms_at_context: number };
    report.llama_server = {
      version: server.version,
      args: "-t 2 -c 40960 -np 5 (8192 per slot)",
      ttft_ms: sweep.ttftMs,
      prefill_tok_s: sweep.tokS,
      decode_tpot_ms_at_context: tpot,
      interference: mixed,
      ttft_ratio_ours_over_llama: Object.fromEntries(args.lengths.map((n) => [n, o.ttft_ms[n] / sweep.ttftMs[n]])),
      decode_tpot_ratio_ours_over_llama: o.decode_tpot_ms_at_context / tpot,
    };
    console.log(`llama-server: TTFT ${JSON.stringify(sweep.ttftMs)} ms; prefill tok/s ${JSON.stringify(sweep.tokS)}; decode TPOT at ${args.decodeContext}: ${tpot.toFixed(1)} ms`);
    console.log(
      `llama-server: 4 streams' TPOT ${mixed.duringMs.toFixed(1)} ms during the prompt, ${mixed.beforeMs.toFixed(1)} before and ${mixed.afterMs.toFixed(1)} after (${mixed.ratio.toFixed(2)}x)`,
    );
  } finally {
    await stopChild(child);
  }
}
finalLine(report);
