// pnpm bench kv-capacity [--streams 48] [--prompt 100] [--max-tokens 64] [--blocks 512] [--small-blocks 128] [--baseline DIR]
// What the paged KV cache holds, through `airm up` on the pulled SmolLM2-135M-Instruct GGUF, with
// each decode worker's KV budget set to what the compiled-context design reserved (16 slots of
// 512 positions = 512 blocks of 16, --kv-cache-memory in bytes):
//   A. `--streams` concurrent streams (prompts of about `--prompt` token ids, `--max-tokens` new
//      tokens, greedy) on airm up's two decode workers: every answer's status, the decode
//      workers' resident memory idle and at its peak, preemptions;
//   B. the same streams on one decode worker with a pool too small for those running at once
//      (`--small-blocks`; the prefill worker paces arrivals, so 512 blocks hold every stream that
//      overlaps; --max-model-len is lowered to the pool): preemptions happen, and every stream's tokens must equal run A's;
//   C. with --baseline DIR (an older checkout with its dependencies installed, e.g.
//      `git worktree add DIR 560e639 && pnpm -C DIR install --offline`), the same load on its own
//      `airm up` defaults: its decode workers' memory idle and at peak, and its statuses.
// Final line: {"bench":"kv-capacity", ...}.
import { spawn } from "node:child_process";
import { join } from "node:path";
import { performance } from "node:perf_hooks";
import { loadCheckpoint } from "../packages/llama/src/index.ts";
import { bytesPerPosition, flagOf, int, text } from "../packages/rm-core/src/index.ts";
import type { RunningCluster } from "../packages/workload-runner/src/local-cluster.ts";
import { startUpCluster } from "../packages/workload-runner/src/up-command.ts";
import { benchArgs, finalLine, progress, progressDone, sseEvents } from "./lib.ts";
import { modelId, stopChild } from "./serve-load/airm-up.ts";
import { airmPart, rssByPart } from "./serve-load/cpu-time.ts";
import { cachedSmolLM2 } from "./serve-load/model.ts";

const args = benchArgs("kv-capacity", "how many streams a decode worker's KV budget holds, preemption that keeps every token, and decode workers' memory", {
  streams: flagOf(int({ min: 1, max: 1024 }), { default: 48, doc: "concurrent streams" }),
  prompt: flagOf(int({ min: 4, max: 4000 }), { default: 100, doc: "prompt length in tokens (each stream's varies by +-2)" }),
  maxTokens: flagOf(int({ min: 1, max: 2048 }), { default: 64, doc: "new tokens per stream" }),
  blocks: flagOf(int({ min: 16 }), { default: 512, doc: "each decode worker's KV budget in blocks of 16 positions (512: 16 x 512 positions)" }),
  smallBlocks: flagOf(int({ min: 16 }), { default: 128, doc: "run B's pool on its one decode worker, in blocks of 16 (small enough that running streams must be preempted)" }),
  baseline: flagOf(text({ label: "dir" }), { defaultText: "none", doc: "an older checkout (dependencies installed) whose airm up defaults get the same load" }),
});

const gguf = cachedSmolLM2();
if (!gguf) {
  console.error("kv-capacity needs the pulled model: pnpm exec airm model pull smollm2-135m-instruct");
  process.exit(2);
}
const ckpt = await loadCheckpoint(gguf);
const c = ckpt.config;
const positionBytes = bytesPerPosition({ layers: c.numLayers, kvHeads: c.numKvHeads, headDim: c.headDim });
const budgetBytes = args.blocks * 16 * positionBytes;
const smallBytes = args.smallBlocks * 16 * positionBytes;
ckpt.tensors.close();

/** Token ids of stream i's prompt (ids 300..20299, seeded by i). */
function promptIds(i: number): number[] {
  let x = ((i + 1) * 2654435761) >>> 0;
  return Array.from({ length: args.prompt - 2 + (i % 5) }, () => {
    x ^= x << 13;
    x ^= x >>> 17;
    x ^= x << 5;
    return 300 + ((x >>> 0) % 20000);
  });
}

interface Answer {
  status: number;
  text: string;
  error?: string;
}

async function stream(url: string, model: string, i: number): Promise<Answer> {
  try {
    const r = await fetch(`${url}/v1/completions`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({ model, prompt: promptIds(i), max_tokens: args.maxTokens, temperature: 0, ignore_eos: true, stream: true }),
    });
    if (!r.ok || !r.body) return { status: r.status, text: "", error: (await r.text()).slice(0, 200) };
    let text = "";
    for await (const j of sseEvents(r.body)) {
      if (j.error) return { status: 500, text, error: j.error.message };
      text += j.choices?.[0]?.text ?? "";
    }
    return { status: r.status, text };
  } catch (e) {
    return { status: 0, text: "", error: (e as Error).message };
  }
}

/** Decode workers' resident memory (bytes, by part) under `root`, sampled every 100 ms while `work` runs; the peak per part. */
async function withPeakRss<T>(root: number, work: Promise<T>): Promise<{ result: T; peak: Record<string, number> }> {
  const peak = new Map<string, number>();
  const sample = () => {
    for (const [k, v] of rssByPart(root, decodeParts)) peak.set(k, Math.max(peak.get(k) ?? 0, v));
  };
  const timer = setInterval(sample, 100);
  try {
    const result = await work;
    sample();
    return { result, peak: Object.fromEntries(peak) };
  } finally {
    clearInterval(timer);
  }
}

/** Each decode worker by its port (`decode :8102`); other parts are not counted. */
function decodeParts(argv: string[]): string | null {
  if (airmPart(argv) !== "decode workers") return null;
  const p = argv.indexOf("--port");
  return `decode :${argv[p + 1] ?? "?"}`;
}

const mib = (x: number) => +(x / 2 ** 20).toFixed(1);
const perPart = (m: Record<string, number> | Map<string, number>) => Object.fromEntries([...(m instanceof Map ? m : Object.entries(m))].map(([k, v]) => [k, mib(v)]));

async function preemptions(cluster: RunningCluster): Promise<number> {
  let n = 0;
  for (const p of cluster.parts.filter((x) => x.spec.name.startsWith("decode"))) {
    const t = await (await fetch(`${p.spec.url}/metrics`)).text();
    n += Number(/^vllm:num_preemptions_total\S* (\S+)$/m.exec(t)?.[1] ?? 0);
  }
  return n;
}

/** airm up with the budget (and `flags`), the streams all at once: statuses, texts, memory, preemptions. */
async function runOurs(bytes: number, flags: string[], what: string) {
  const { cluster } = await startUpCluster(["--model", gguf!, "--kv-cache-memory", String(bytes), ...flags], { env: process.env });
  try {
    const id = await modelId(cluster.url);
    const idle = rssByPart(process.pid, decodeParts);
    progress(`${what}: ${args.streams} streams`);
    const t0 = performance.now();
    const { result, peak } = await withPeakRss(process.pid, Promise.all(Array.from({ length: args.streams }, (_, i) => stream(cluster.url, id, i))));
    const wallS = (performance.now() - t0) / 1000;
    progressDone();
    return { answers: result, idle: perPart(idle), peak: perPart(peak), preemptions: await preemptions(cluster), wallS };
  } finally {
    await cluster.stop();
  }
}

const statuses = (a: Answer[]) => {
  const m: Record<string, number> = {};
  for (const x of a) m[x.status] = (m[x.status] ?? 0) + 1;
  return m;
};
console.log(`each decode worker's KV budget: ${args.blocks} blocks of 16 = ${args.blocks * 16} positions = ${budgetBytes} bytes`);

const a = await runOurs(budgetBytes, [], "A (two decode workers)");
console.log(
  `A: ${args.streams} streams on two decode workers: statuses ${JSON.stringify(statuses(a.answers))}, preemptions ${a.preemptions}, ${a.wallS.toFixed(1)} s; ` +
    `decode RSS idle ${JSON.stringify(a.idle)} MiB, peak ${JSON.stringify(a.peak)} MiB`,
);
const b = await runOurs(smallBytes, ["--decode-replicas", "1", "--max-model-len", String(args.smallBlocks * 16)], "B (one decode worker, a small pool)");
for (const e of new Set(b.answers.filter((x) => x.error).map((x) => `${x.status}: ${x.error}`))) console.log(`B error: ${e}`);
const same = b.answers.filter((x, i) => x.status === 200 && x.text === a.answers[i].text).length;
console.log(
  `B: the same streams on one decode worker with ${args.smallBlocks} blocks: statuses ${JSON.stringify(statuses(b.answers))}, preemptions ${b.preemptions}, ${same}/${args.streams} texts equal A's`,
);

let baseline: Record<string, unknown> | null = null;
if (args.baseline) {
  const bin = join(args.baseline, "packages", "workload-runner", "bin", "airm.mjs");
  const child = spawn(process.execPath, [bin, "up", "--model", gguf, "--port", "0", "--prefill-port", "0", "--decode-port", "0", "--quiet"], { stdio: ["ignore", "pipe", "pipe"] });
  try {
    const url = await new Promise<string>((resolve, reject) => {
      const on = (d: Buffer) => {
        const m = /rngd-pd is up: (\S+)/.exec(d.toString());
        if (m) resolve(m[1]);
      };
      child.stdout.on("data", on);
      child.stderr.on("data", on);
      child.on("exit", (code) => reject(new Error(`the baseline's airm up exited ${code}`)));
    });
    const id = await modelId(url);
    const idle = rssByPart(child.pid!, decodeParts);
    progress(`baseline: ${args.streams} streams`);
    const { result, peak } = await withPeakRss(child.pid!, Promise.all(Array.from({ length: args.streams }, (_, i) => stream(url, id, i))));
    progressDone();
    baseline = { dir: args.baseline, statuses: statuses(result), idle: perPart(idle), peak: perPart(peak) };
    console.log(
      `baseline (${args.baseline}): statuses ${JSON.stringify(statuses(result))}; decode RSS idle ${JSON.stringify(perPart(idle))} MiB, peak ${JSON.stringify(perPart(peak))} MiB`,
    );
  } finally {
    await stopChild(child);
  }
}

finalLine({
  bench: "kv-capacity",
  streams: args.streams,
  prompt_tokens: args.prompt,
  max_tokens: args.maxTokens,
  budget_blocks: args.blocks,
  budget_bytes: budgetBytes,
  a: { statuses: statuses(a.answers), preemptions: a.preemptions, wall_s: a.wallS, decode_rss_idle_mib: a.idle, decode_rss_peak_mib: a.peak },
  b: { budget_blocks: args.smallBlocks, statuses: statuses(b.answers), preemptions: b.preemptions, texts_equal_a: same },
  baseline,
});
