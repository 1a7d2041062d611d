// pnpm bench lora [--model NAME|FILE] [--adapters 4] [--rank 16] [--concurrency 8] [--per-run 3] [--max-tokens 64] [--llama-server auto|off|PATH] [--seed 1]
// Serving LoRA adapters, as a user measures it: output tok/s of closed-loop streaming chat
// requests (greedy, --max-tokens new tokens each with ignore_eos, prompts from serve-load's seeded
// generator, --per-run rounds of --concurrency requests per run, the base and mixed runs' rounds
// interleaved) with --adapters generated adapters
// (makeTinyLora: rank --rank on q/k/v/o and the MLP projections, one seed each) mixed round-robin,
// against the base model alone, on `airm up --lora-modules` with its defaults on a GGUF (by default
// the one `airm up` serves with no --model); then the same on llama.cpp's llama-server (2 threads,
// --concurrency slots) with the same adapters converted to GGUF (peftToGguf), loaded with --lora
// and --lora-init-without-apply, each request naming its adapter with `lora: [{id, scale: 1}]`
// (built and cached as serve-load does, or skipped with the reason). Per run: output tok/s, TTFT
// and TPOT p50, errors, and how many answers the adapters changed; then mixed / base for both
// servers and ours / llama-server. Goal: ours mixed >= 0.85 of ours base.
import { rmSync } from "node:fs";
import { benchArgs, finalLine } from "./lib.ts";
import { type BenchAdapter, benchAdapters } from "./lora/adapters.ts";
import { changedAnswers, closedLoop, type Round, type RunResult, runResult, warmUp } from "./lora/closed-loop.ts";
import { modelId, startAirmUp, stopChild } from "./serve-load/airm-up.ts";
import { ensureLlamaServer, startLlamaServer } from "./serve-load/llama-server.ts";
import { type ChatPrompt, chatPrompts } from "./serve-load/prompts.ts";
import { flagOf, int, text } from "../packages/rm-core/src/index.ts";
import { chooseDefaultModel, resolveModelArg } from "../packages/workload-runner/src/default-model.ts";

const GOAL = 0.85;

const args = benchArgs("lora", "throughput with LoRA adapters mixed against the base model alone, on airm up and on llama-server with the same adapters", {
  model: flagOf(text({ label: "name|file" }), { default: "", doc: "the GGUF base model: a pulled model's name or a file (default: what `airm up` serves with no --model)" }),
  adapters: flagOf(int({ min: 1, max: 26 }), { default: 4, doc: "generated adapters, mixed round-robin (at most airm up's --max-loras, 4, stay resident)" }),
  rank: flagOf(int({ min: 1, max: 64 }), { default: 16, doc: "their rank r (alpha 2r)" }),
  concurrency: flagOf(int({ min: 1, max: 64 }), { default: 8, doc: "closed-loop clients (and llama-server slots)" }),
  perRun: flagOf(int({ min: 1 }), { default: 3, doc: "rounds per run, of --concurrency requests each (the base and mixed runs' rounds alternate)" }),
  maxTokens: flagOf(int({ min: 2, max: 256 }), { default: 64, doc: "new tokens per request (ignore_eos: always this many)" }),
  seed: flagOf(int({ min: 0 }), { default: 1, doc: "seed of the prompt generator" }),
  upArgs: flagOf(text({ label: "args" }), { default: "", doc: "extra `airm up` flags, space-separated (experiments; the recorded runs use none)" }),
  llamaServer: flagOf(text({ label: "auto|off|path" }), { default: "auto", doc: "llama-server: build and cache it when missing (auto), skip it (off), or this binary" }),
});

interface SystemRuns {
  base: RunResult;
  mixed: RunResult;
}

/**
 * The base run and the mixed run (request i on adapter i mod n), after one short warm-up request
 * per model and adapter, in --per-run interleaved rounds of --concurrency requests each (base then
 * mixed, mixed then base, ...: a machine whose load drifts weighs on both alike), over the same
 * prompts.
 */
async function baseAndMixed(url: string, prompts: ChatPrompt[], base: Record<string, unknown>, onAdapter: (k: number) => Record<string, unknown>, n: number): Promise<SystemRuns> {
  await warmUp(url, prompts[0]!, [base, ...Array.from({ length: n }, (_, k) => onAdapter(k))]);
  const c = args.concurrency;
  const rounds: Record<"base" | "mixed", Round[]> = { base: [], mixed: [] };
  for (let r = 0; r < args.perRun; r++) {
    const order = r % 2 === 0 ? (["base", "mixed"] as const) : (["mixed", "base"] as const);
    for (const kind of order) {
      const extras = kind === "base" ? () => base : (i: number) => onAdapter(i % n);
      rounds[kind].push(await closedLoop(url, prompts, r * c, (r + 1) * c, c, args.maxTokens, extras));
    }
  }
  return { base: runResult(rounds.base), mixed: runResult(rounds.mixed) };
}

/** Ours: `airm up --lora-modules` over the adapters' PEFT folders; the base model by its id, an adapter by its name. */
async function runOurs(gguf: string, adapters: BenchAdapter[], prompts: ChatPrompt[]): Promise<SystemRuns & { startS: number }> {
  const modules = adapters.map((a) => `${a.name}=${a.folder}`).join(",");
  const up = await startAirmUp(["--model", gguf, "--lora-modules", modules, ...args.upArgs.split(/\s+/).filter(Boolean)]);
  try {
    for (const l of up.config) console.log(l);
    console.log(`airm up: ready in ${up.startS.toFixed(1)} s`);
    const id = await modelId(up.url);
    const runs = await baseAndMixed(up.url, prompts, { model: id }, (k) => ({ model: adapters[k]!.name }), adapters.length);
    return { ...runs, startS: up.startS };
  } finally {
    await stopChild(up.child);
  }
}

/** llama-server with every adapter loaded unapplied (--lora-init-without-apply); a request picks one by `lora: [{id, scale: 1}]`. */
async function runLlamaServer(gguf: string, adapters: BenchAdapter[], prompts: ChatPrompt[]): Promise<(SystemRuns & { version: string }) | { skipped: string }> {
  const server = await ensureLlamaServer(args.llamaServer);
  if ("skipped" in server) return server;
  const flags = ["-m", gguf, "-t", "2", "-c", "4096", "-np", String(args.concurrency), "--lora", adapters.map((a) => a.gguf).join(","), "--lora-init-without-apply"];
  const { url, child, startS } = await startLlamaServer(server, flags, 120);
  try {
    console.log(
      `llama-server ${server.version} (${flags
        .slice(2)
        .join(" ")
        .replace(/--lora \S+/, "--lora <the GGUF adapters>")}): ready in ${startS.toFixed(1)} s`,
    );
    const model = "bench-model";
    const runs = await baseAndMixed(url, prompts, { model }, (k) => ({ model, lora: [{ id: k, scale: 1 }] }), adapters.length);
    return { ...runs, version: server.version };
  } finally {
    await stopChild(child);
  }
}

function row(name: string, r: RunResult, base?: RunResult): string {
  const changed = base ? changedAnswers(base, r) : undefined;
  const moved = changed ? `${changed.changed}/${changed.compared}` : "-";
  return `  ${name.padEnd(32)} ${String(r.requests).padStart(4)} ${String(r.errors).padStart(4)} ${r.tokS.toFixed(1).padStart(7)} ${r.ttftP50.toFixed(0).padStart(9)} ${r.tpotP50.toFixed(1).padStart(9)}   ${moved}`;
}

const ratio = (a: number, b: number | undefined): number | null => (b === undefined || !(b > 0) ? null : a / b);
const fmt = (x: number | null): string => (x === null ? "-" : x.toFixed(3));

const chosen = args.model ? await resolveModelArg(args.model, process.env) : await chooseDefaultModel(process.env);
const gguf = chosen.path;
if (chosen.kind !== "real" || !gguf.endsWith(".gguf")) {
  console.error(`the lora bench runs a GGUF on both servers; got ${gguf}. Pull one (pnpm exec airm model pull qwen2.5-coder-0.5b-instruct) or pass --model FILE.gguf`);
  process.exit(2);
}
console.log(`model: ${gguf}`);
const { dir, adapters } = benchAdapters(gguf, args.adapters, args.rank);
console.log(`adapters: ${adapters.map((a) => a.name).join(", ")} (rank ${args.rank}, q/k/v/o/gate/up/down of every layer) in ${dir}`);
const prompts = chatPrompts(args.seed, args.perRun * args.concurrency);
let ours: Awaited<ReturnType<typeof runOurs>>;
let llama: Awaited<ReturnType<typeof runLlamaServer>>;
try {
  ours = await runOurs(gguf, adapters, prompts);
  llama = await runLlamaServer(gguf, adapters, prompts);
} finally {
  rmSync(dir, { recursive: true, force: true });
}
console.log(`c${args.concurrency}, ${prompts.length} requests per run, ${args.maxTokens} new tokens each:`);
console.log(`  ${"run".padEnd(32)} reqs  err   tok/s  TTFT p50  TPOT p50   answers changed by the adapters`);
console.log(row("airm up, base", ours.base));
console.log(row(`airm up, ${adapters.length} adapters mixed`, ours.mixed, ours.base));
if ("skipped" in llama) console.log(`  llama-server: skipped (${llama.skipped})`);
else {
  console.log(row("llama-server, base", llama.base));
  console.log(row(`llama-server, ${adapters.length} adapters mixed`, llama.mixed, llama.base));
}
const lb = "skipped" in llama ? undefined : llama;
const checks = {
  ours_mixed_over_base: ratio(ours.mixed.tokS, ours.base.tokS),
  llama_server_mixed_over_base: lb ? ratio(lb.mixed.tokS, lb.base.tokS) : null,
  ours_over_llama_server_base: ratio(ours.base.tokS, lb?.base.tokS),
  ours_over_llama_server_mixed: ratio(ours.mixed.tokS, lb?.mixed.tokS),
};
const met = checks.ours_mixed_over_base !== null && checks.ours_mixed_over_base >= GOAL;
console.log(
  `ratios (output tok/s): ours mixed / base ${fmt(checks.ours_mixed_over_base)} (goal >= ${GOAL}: ${met ? "met" : "not met"}), llama-server mixed / base ${fmt(checks.llama_server_mixed_over_base)}, ` +
    `ours / llama-server: base ${fmt(checks.ours_over_llama_server_base)}, mixed ${fmt(checks.ours_over_llama_server_mixed)}`,
);
const summary = (r: RunResult) => ({ requests: r.requests, errors: r.errors, tok_s: r.tokS, ttft_p50_ms: r.ttftP50, tpot_p50_ms: r.tpotP50 });
finalLine({
  bench: "lora",
  model: gguf,
  adapters: adapters.length,
  rank: args.rank,
  concurrency: args.concurrency,
  requests_per_run: prompts.length,
  max_tokens: args.maxTokens,
  ours: { start_s: ours.startS, base: summary(ours.base), mixed: summary(ours.mixed), answers_changed: changedAnswers(ours.base, ours.mixed) },
  llama_server: lb
    ? { version: lb.version, base: summary(lb.base), mixed: summary(lb.mixed), answers_changed: changedAnswers(lb.base, lb.mixed) }
    : { skipped: (llama as { skipped: string }).skipped },
  errors: ours.base.errors + ours.mixed.errors,
  goal: GOAL,
  goal_met: met,
  ratio: checks.ours_mixed_over_base,
  ...checks,
});
