// Our CPU engine against llama.cpp (node-llama-cpp 3.21.1, prebuilt, CPU) on the same
// SmolLM2-135M-Instruct Q4_1 GGUF in the same run, one thread each: decode tokens/s at B=1 (128
// new greedy tokens), our decode at B=4, and prefill tokens/s (the parity text, about 520
// tokens). Repetitions are interleaved so both engines see the same machine load. Also prints the
// weight bytes each engine reads per decode step and our streaming roofline (a plain read of
// every weight byte our decode step touches, as held: quantized blocks or bf16).
// Usage: pnpm bench llama-vs-llamacpp [--model FILE.gguf] [--weights auto|bf16] [--reps N] [--new-tokens N]
import { loadCheckpoint } from "../packages/llama/src/checkpoint/load-checkpoint.ts";
import { LlamaModel, WEIGHTS_MODES, type WeightsMode, ACTIVATIONS_MODES, DEFAULT_ACTIVATIONS, type ActivationsMode } from "../packages/llama/src/model/llama-model.ts";
import { argmax } from "../packages/llama/src/sampling/sample.ts";
import type { TensorInfo } from "../packages/llama/src/checkpoint-types.ts";
import { GGML_TYPES } from "../packages/llama/src/checkpoint/gguf-file.ts";
import { assertOneThread, openLlamaCpp, type LlamaCpp } from "../packages/llama/test/fixtures/parity/llamacpp-reference.ts";
import { SKIP_REASON, cachedParityModel, parityText } from "../packages/llama/test/fixtures/parity/parity-model.ts";
import { flagOf, int, oneOf, text as textType } from "../packages/rm-core/src/index.ts";
import { benchArgs, finalLine, fmt, progress, progressDone, summarize } from "./lib.ts";

const args = benchArgs("llama-vs-llamacpp", "our CPU backend against llama.cpp on the same GGUF, one thread each", {
  model: flagOf(textType({ label: "path" }), { defaultText: "the pulled SmolLM2-135M-Instruct Q4_1", doc: "a .gguf file" }),
  reps: flagOf(int({ min: 1 }), { default: 3, doc: "repetitions" }),
  newTokens: flagOf(int({ min: 1 }), { default: 128, doc: "decoded tokens per repetition" }),
  weights: flagOf(oneOf(WEIGHTS_MODES), { default: "auto", doc: "how our engine holds the matrices (auto: the file's Q8_0/Q4_x blocks)" }),
  activations: flagOf(oneOf(ACTIVATIONS_MODES), { default: DEFAULT_ACTIVATIONS, doc: "input width of the Q4 kernels (LlamaModelOptions.activations)" }),
});
const ggufPath = args.model ?? cachedParityModel();
const { reps, newTokens } = args;
if (!ggufPath) {
  console.error(`no model: ${SKIP_REASON}, or pass --model FILE.gguf`);
  process.exit(2);
}
if (!(Number.isInteger(reps) && reps >= 1 && Number.isInteger(newTokens) && newTokens >= 1)) {
  console.error("--reps and --new-tokens must be positive integers");
  process.exit(2);
}

/** Bytes of one tensor as stored in the GGUF (ggml's block size and bytes per block of its type). */
function storedBytes(t: TensorInfo): number {
  const n = t.shape.reduce((a, b) => a * b, 1);
  const type = Object.values(GGML_TYPES).find((g) => g.name === t.dtype);
  if (!type) throw new Error(`unknown stored type ${t.dtype} of ${t.name}`);
  return (n / type.blockSize) * type.typeSize;
}

progress("loading our engine");
const ckpt = await loadCheckpoint(ggufPath);
const ours = await LlamaModel.load(ckpt, { threads: 1, weights: args.weights as WeightsMode, activations: args.activations as ActivationsMode });
progress("loading llama.cpp");
const cpp: LlamaCpp = await openLlamaCpp(ggufPath);
progressDone();

const text = ckpt.tokenizer.encode(parityText(), { addSpecialTokens: false });
const decodePrompt = text.slice(0, 32);
const cppBytes = ckpt.tensors.list().reduce((a, t) => a + (t.dtype === "F32" ? 0 : storedBytes(t)), 0);
console.log(`model: ${ggufPath}`);
console.log(`threads: 1 each; llama.cpp ${cpp.llama.buildType} binary, gpu ${String(cpp.llama.gpu)}, context threads 1`);
console.log(
  `weight bytes per decode step: ours ${(ours.weightBytesPerToken / 1e6).toFixed(1)} MB (weights ${args.weights}: ${ours.weightsSummary()}), llama.cpp ~${(cppBytes / 1e6).toFixed(1)} MB (the file's blocks), ratio ${(ours.weightBytesPerToken / cppBytes).toFixed(3)}`,
);

/** Ours: prefill the whole text into a fresh cache; ms. */
function oursPrefill(): number {
  const cache = ours.newCache(text.length);
  const t0 = performance.now();
  ours.prefill(text, cache);
  const ms = performance.now() - t0;
  ours.freeCache(cache);
  return ms;
}

/** Ours: prefill all but the last prompt token (untimed), then `newTokens` greedy decode steps; ms per token. */
function oursDecode(): { msPerToken: number; tokens: number[] } {
  const cache = ours.newCache(decodePrompt.length + newTokens);
  ours.prefill(decodePrompt.slice(0, -1), cache);
  const tokens: number[] = [];
  let next = decodePrompt[decodePrompt.length - 1];
  const t0 = performance.now();
  for (let i = 0; i < newTokens; i++) {
    const [logits] = ours.decode([{ cache, token: next }]);
    next = argmax(logits);
    tokens.push(next);
  }
  const ms = performance.now() - t0;
  ours.freeCache(cache);
  return { msPerToken: ms / newTokens, tokens };
}

/** Ours at B=4: four streams (the decode prompt and three shifted copies) stepped together; ms per step. */
function oursDecodeB4(): number {
  const prompts = [0, 1, 2, 3].map((k) => text.slice(k * 8, k * 8 + decodePrompt.length));
  const steps = Math.max(8, newTokens >> 1);
  const caches = prompts.map((p) => {
    const c = ours.newCache(p.length + steps);
    ours.prefill(p.slice(0, -1), c);
    return c;
  });
  let next = prompts.map((p) => p[p.length - 1]);
  const t0 = performance.now();
  for (let i = 0; i < steps; i++) next = ours.decode(caches.map((cache, k) => ({ cache, token: next[k] }))).map((l) => argmax(l));
  const ms = performance.now() - t0;
  for (const c of caches) ours.freeCache(c);
  return ms / steps;
}

/** llama.cpp: evaluate the whole text in one batch into a fresh context; ms. */
async function cppPrefill(): Promise<number> {
  const context = await cpp.model.createContext({ contextSize: text.length + 16, batchSize: text.length, threads: 1, sequences: 1 });
  try {
    assertOneThread(context);
    const sequence = context.getSequence();
    const t0 = performance.now();
    await sequence.evaluateWithoutGeneratingNewTokens(text as never[]);
    return performance.now() - t0;
  } finally {
    await context.dispose();
  }
}

/** llama.cpp: the same split as ours: all but the last prompt token untimed, then `newTokens` greedy steps. */
async function cppDecode(): Promise<{ msPerToken: number; tokens: number[] }> {
  const context = await cpp.model.createContext({ contextSize: decodePrompt.length + newTokens + 16, batchSize: decodePrompt.length, threads: 1, sequences: 1 });
  try {
    assertOneThread(context);
    const sequence = context.getSequence();
    await sequence.evaluateWithoutGeneratingNewTokens(decodePrompt.slice(0, -1) as never[]);
    const tokens: number[] = [];
    const t0 = performance.now();
    for await (const token of sequence.evaluate([decodePrompt[decodePrompt.length - 1]] as never[], { temperature: 0 })) {
      tokens.push(token);
      if (tokens.length >= newTokens) break;
    }
    const ms = performance.now() - t0;
    return { msPerToken: ms / newTokens, tokens };
  } finally {
    await context.dispose();
  }
}

/** Our bandwidth roofline: one plain wasm read of every weight byte a decode step streams (as held); ms. */
function oursStream(): number {
  const t0 = performance.now();
  ours.streamWeights();
  return performance.now() - t0;
}

const oursPrefillMs: number[] = [],
  cppPrefillMs: number[] = [],
  oursDecodeMs: number[] = [],
  oursB4Ms: number[] = [],
  cppDecodeMs: number[] = [],
  streamMs: number[] = [];
let oursTokens: number[] = [],
  cppTokens: number[] = [];
// One untimed warm-up of each path (JIT, page cache, llama.cpp's first-context allocations).
oursDecode();
await cppDecode();
for (let r = 0; r < reps; r++) {
  progress(`prefill ${r + 1}/${reps}`);
  oursPrefillMs.push(oursPrefill());
  cppPrefillMs.push(await cppPrefill());
  progress(`decode ${r + 1}/${reps}`);
  const o = oursDecode();
  oursDecodeMs.push(o.msPerToken);
  oursTokens = o.tokens;
  oursB4Ms.push(oursDecodeB4());
  const c = await cppDecode();
  cppDecodeMs.push(c.msPerToken);
  cppTokens = c.tokens;
  for (let i = 0; i < 5; i++) streamMs.push(oursStream());
}
progressDone();

const op = summarize(oursPrefillMs),
  cp = summarize(cppPrefillMs),
  od = summarize(oursDecodeMs),
  cd = summarize(cppDecodeMs),
  sm = summarize(streamMs),
  o4 = summarize(oursB4Ms);
let common = 0;
while (common < newTokens && oursTokens[common] === cppTokens[common]) common++;
console.log(`prefill ${text.length} tokens: ours ${fmt(op)}, llama.cpp ${fmt(cp)}`);
console.log(`decode B=1, ${newTokens} new tokens after ${decodePrompt.length - 1}: ours ${fmt(od, "ms/token")}, llama.cpp ${fmt(cd, "ms/token")}`);
console.log(`decode B=4 (ours): ${fmt(o4, "ms/step")} -> ${((4 * 1000) / o4.median).toFixed(1)} tok/s, ${((4 * od.median) / o4.median).toFixed(2)}x B=1`);
console.log(
  `our roofline (plain read of the ${(ours.weightBytesPerToken / 1e6).toFixed(1)} MB held): ${fmt(sm)} = ${(ours.weightBytesPerToken / sm.median / 1e6).toFixed(2)} GB/s, at most ${(1000 / sm.median).toFixed(1)} tok/s`,
);
console.log(`greedy continuations identical for the first ${common} of ${newTokens} tokens`);
const oursTokS = 1000 / od.median,
  cppTokS = 1000 / cd.median;
const oursPrefillTokS = (1000 * text.length) / op.median,
  cppPrefillTokS = (1000 * text.length) / cp.median;
console.log(
  `decode: ours ${oursTokS.toFixed(1)} tok/s, llama.cpp ${cppTokS.toFixed(1)} tok/s, ratio ${(oursTokS / cppTokS).toFixed(3)}; prefill: ours ${oursPrefillTokS.toFixed(0)} tok/s, llama.cpp ${cppPrefillTokS.toFixed(0)} tok/s, ratio ${(oursPrefillTokS / cppPrefillTokS).toFixed(3)}`,
);

ours.close();
ckpt.tensors.close();
await cpp.model.dispose();
await cpp.llama.dispose();
finalLine({
  bench: "llama-vs-llamacpp",
  ours_tok_s: oursTokS,
  llamacpp_tok_s: cppTokS,
  ratio: oursTokS / cppTokS,
  ours_prefill_tok_s: oursPrefillTokS,
  llamacpp_prefill_tok_s: cppPrefillTokS,
  prefill_ratio: oursPrefillTokS / cppPrefillTokS,
  ours_roofline_tok_s: 1000 / sm.median,
  ours_b4_tok_s: (4 * 1000) / o4.median,
  b4_over_b1: (4 * od.median) / o4.median,
  weights: args.weights,
  activations: ours.activations,
  ours_weight_bytes: ours.weightBytesPerToken,
  llamacpp_weight_bytes: cppBytes,
  weight_bytes_ratio: ours.weightBytesPerToken / cppBytes,
  new_tokens: newTokens,
  prefill_tokens: text.length,
  threads: 1,
});
