// What the kernels' arithmetic does to answers, through the API: for each configuration of
// `airm up` (8-bit activations, 16-bit activations, and the bf16 weights path as the closest to the
// float model), the log-likelihood of fixed continuations (bench/quality/items.ts) from
// /v1/completions with echo and logprobs, as evaluation harnesses score multiple choice: accuracy
// (the right continuation has the highest summed log-probability), accuracy normalised by token
// count, the mean log-probability of the right continuations, and the mean |difference| of every
// continuation's log-likelihood against the bf16 run. Also each configuration's greedy answer to
// the README's question. Then perplexity (bench/quality/perplexity.ts): every pulled GGUF and files
// llama-quantize makes from the pulled Qwen2.5-Coder Q4_K_Ms for the quant types none of them has
// (Q5_1, IQ4_NL from the 0.5B; Q5_K, Q3_K, Q2_K, IQ4_XS from the 1.5B, whose rows are whole
// 256-blocks), ours against llama.cpp's llama-perplexity on the same file and text (a fixed copy of
// the start of docs/decisions.md), two threads
// each. The final JSON line holds the figures per configuration and per file.
// Usage: pnpm bench quality [--parts scoring,perplexity] [--configs i8,i16,bf16] [--ppl-ctx 512] [--ppl-chunks 4]
import { resolveCachedModel } from "../packages/llama/src/model-cache/model-cache.ts";
import { flagOf, int, list, oneOf } from "../packages/rm-core/src/index.ts";
import { benchArgs, finalLine, progress, progressDone } from "./lib.ts";
import { ITEMS } from "./quality/items.ts";
import { PERPLEXITY_TEXT, llamaCppPerplexity, oursPerplexity, perplexityText, requantized } from "./quality/perplexity.ts";
import { ensureLlamaServer } from "./serve-load/llama-server.ts";
import { modelId, startAirmUp, stopChild } from "./serve-load/airm-up.ts";
import { cachedSmolLM2 } from "./serve-load/model.ts";

const CONFIGS = {
  i8: ["--activations", "i8"],
  i16: ["--activations", "i16"],
  bf16: ["--weights", "bf16"],
} as const;
type Config = keyof typeof CONFIGS;

const PARTS = ["scoring", "perplexity"] as const;
const args = benchArgs("quality", "log-likelihood scoring of fixed continuations through the API, per kernel configuration; perplexity per file against llama.cpp", {
  parts: flagOf(list(oneOf(PARTS)), { default: [...PARTS], doc: "what to measure" }),
  configs: flagOf(list(oneOf(Object.keys(CONFIGS) as Config[])), { default: ["i8", "i16", "bf16"], doc: "configurations of airm up to score" }),
  pplCtx: flagOf(int({ min: 16, max: 8192 }), { default: 512, doc: "perplexity: tokens per chunk (llama-perplexity's -c)" }),
  pplChunks: flagOf(int({ min: 1 }), { default: 4, doc: "perplexity: at most this many chunks of the text" }),
});
const pulled = cachedSmolLM2();
if (!pulled && args.parts.includes("scoring")) {
  console.error("quality needs real weights: run `airm model pull smollm2-135m-instruct` first (a generated model's answers mean nothing)");
  process.exit(2);
}
const gguf = pulled ?? "";

interface CompletionLogprobs {
  tokens: string[];
  token_logprobs: (number | null)[];
  text_offset: number[];
}

/** Summed log-probability and token count of `cont` after `context`. */
async function score(url: string, model: string, context: string, cont: string): Promise<{ lp: number; n: number }> {
  const prompt = context + cont;
  const r = await fetch(`${url}/v1/completions`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify({ model, prompt, max_tokens: 1, temperature: 0, echo: true, logprobs: 1 }),
  });
  if (!r.ok) throw new Error(`completions ${r.status}: ${await r.text()}`);
  const lp = ((await r.json()) as { choices: { logprobs: CompletionLogprobs }[] }).choices[0]!.logprobs;
  let sum = 0;
  let n = 0;
  for (let i = 0; i < lp.tokens.length; i++) {
    const at = lp.text_offset[i]!;
    // the continuation's tokens: from where it starts to the end of the prompt (not the generated one)
    if (at < context.length || at >= prompt.length) continue;
    const v = lp.token_logprobs[i];
    if (typeof v !== "number") throw new Error(`no log-probability for prompt token ${i} of ${JSON.stringify(prompt)}`);
    sum += v;
    n++;
  }
  if (n === 0) throw new Error(`no token of ${JSON.stringify(cont)} starts after ${JSON.stringify(context)}: the tokenizer merged them`);
  return { lp: sum, n };
}

async function readmeAnswer(url: string, model: string): Promise<string> {
  const r = await fetch(`${url}/v1/chat/completions`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify({ model, messages: [{ role: "user", content: "What is the capital of France?" }], max_tokens: 32, temperature: 0 }),
  });
  return ((await r.json()) as { choices: { message: { content: string } }[] }).choices[0]!.message.content;
}

const runs = new Map<Config, { lps: number[][]; ns: number[][]; answer: string; config: string[] }>();
for (const cfg of args.parts.includes("scoring") ? args.configs : []) {
  progress(`airm up ${CONFIGS[cfg].join(" ")}`);
  const up = await startAirmUp([...CONFIGS[cfg], "--model", gguf]);
  try {
    const model = await modelId(up.url);
    const lps: number[][] = [];
    const ns: number[][] = [];
    for (const [i, item] of ITEMS.entries()) {
      progress(`${cfg}: item ${i + 1}/${ITEMS.length}`);
      const s = await Promise.all(item.choices.map((c) => score(up.url, model, item.context, c)));
      lps.push(s.map((x) => x.lp));
      ns.push(s.map((x) => x.n));
    }
    runs.set(cfg, { lps, ns, answer: await readmeAnswer(up.url, model), config: up.config });
  } finally {
    await stopChild(up.child);
  }
}
progressDone();

const perplexityRows = args.parts.includes("perplexity") ? await perplexities() : [];

const argmax = (a: number[]) => a.reduce((best, v, i) => (v > a[best]! ? i : best), 0);
const rows: Record<string, unknown>[] = [];
const base = runs.get("bf16");
if (runs.size > 0) console.log(`model: ${gguf}; ${ITEMS.length} items, ${ITEMS.reduce((a, it) => a + it.choices.length, 0)} continuations`);
if (runs.size > 0) console.log("config  acc     acc/len  mean lp(right)  mean |dlp| vs bf16  max |dlp|   README answer");
for (const [cfg, r] of runs) {
  const acc = ITEMS.filter((it, i) => argmax(r.lps[i]!) === it.answer).length / ITEMS.length;
  const accNorm = ITEMS.filter((it, i) => argmax(r.lps[i]!.map((v, j) => v / r.ns[i]![j]!)) === it.answer).length / ITEMS.length;
  const right = ITEMS.reduce((a, it, i) => a + r.lps[i]![it.answer]!, 0) / ITEMS.length;
  let dSum = 0;
  let dMax = 0;
  let dN = 0;
  if (base)
    r.lps.forEach((row, i) =>
      row.forEach((v, j) => {
        const d = Math.abs(v - base.lps[i]![j]!);
        dSum += d;
        dMax = Math.max(dMax, d);
        dN++;
      }),
    );
  const dMean = base ? dSum / dN : null;
  console.log(
    `${cfg.padEnd(6)}  ${acc.toFixed(3)}   ${accNorm.toFixed(3)}    ${right.toFixed(3).padStart(8)}        ${dMean === null ? "-" : dMean.toFixed(4)}              ${base ? dMax.toFixed(4) : "-"}      ${JSON.stringify(r.answer)}`,
  );
  rows.push({
    config: cfg,
    accuracy: acc,
    accuracy_norm: accNorm,
    mean_lp_right: right,
    mean_abs_dlp_vs_bf16: dMean,
    max_abs_dlp_vs_bf16: base ? dMax : null,
    readme_answer: r.answer,
  });
}
finalLine({ bench: "quality", model: gguf, items: ITEMS.length, configs: rows, perplexity: perplexityRows });
process.exit(0);

/** The files perplexity runs on: each pulled model, then the requantized ones (name, path). */
async function perplexityFiles(server: Parameters<typeof requantized>[0]): Promise<[string, string][]> {
  const files: [string, string][] = [];
  for (const name of ["smollm2-135m-instruct", "qwen2.5-coder-0.5b-instruct", "qwen2.5-coder-1.5b-instruct", "gemma-3-270m"]) {
    const m = await resolveCachedModel(name);
    if (m) files.push([name, m.path]);
    else console.log(`perplexity: ${name} is not pulled (pnpm exec airm model pull ${name}); skipped`);
  }
  const variants: [string, string[]][] = [
    ["qwen2.5-coder-0.5b-instruct", ["Q5_1", "IQ4_NL"]],
    ["qwen2.5-coder-1.5b-instruct", ["Q5_K_M", "Q3_K_M", "Q2_K", "IQ4_XS"]],
  ];
  for (const [name, types] of variants) {
    const source = files.find(([n]) => n === name)?.[1];
    if (!source) continue;
    for (const t of types) {
      progress(`llama-quantize ${name} -> ${t}`);
      files.push([`${name} ${t}`, requantized(server, source, name, t)]);
    }
  }
  return files;
}

async function perplexities(): Promise<Record<string, unknown>[]> {
  const server = await ensureLlamaServer("auto");
  if ("skipped" in server) {
    console.log(`perplexity skipped: llama.cpp is not built (${server.skipped})`);
    return [];
  }
  const text = perplexityText();
  const out: Record<string, unknown>[] = [];
  console.log(`perplexity on ${PERPLEXITY_TEXT} (chunks of ${args.pplCtx}, at most ${args.pplChunks}; 2 threads each; ${server.version})`);
  console.log("file                                   ours PPL   llama.cpp PPL   ours/llama.cpp   matrices by type");
  for (const [name, path] of await perplexityFiles(server)) {
    progress(`perplexity: ${name} (ours)`);
    const ours = await oursPerplexity(path, text, args.pplCtx, args.pplChunks, 2);
    progress(`perplexity: ${name} (llama.cpp)`);
    const cpp = llamaCppPerplexity(server, path, PERPLEXITY_TEXT, args.pplCtx, args.pplChunks, 2);
    progressDone();
    const ratio = ours.ppl / cpp.ppl;
    const types = Object.entries(ours.dtypes)
      .map(([t, n]) => `${n} ${t}`)
      .join(", ");
    console.log(`${name.padEnd(38)} ${ours.ppl.toFixed(4).padStart(9)}   ${cpp.ppl.toFixed(4).padStart(13)}   ${ratio.toFixed(4).padStart(14)}   ${types}`);
    if (ours.count !== cpp.count) console.log(`  (scored ${ours.count} tokens, llama.cpp ${cpp.count}: the tokenizations differ in length)`);
    out.push({
      file: name,
      path,
      ours_ppl: ours.ppl,
      llamacpp_ppl: cpp.ppl,
      ratio,
      tokens: ours.count,
      llamacpp_tokens: cpp.count,
      types: ours.dtypes,
      ours_s: ours.seconds,
      llamacpp_s: cpp.seconds,
    });
  }
  return out;
}
