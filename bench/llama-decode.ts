// Decode (B=1, 2, 4) and prefill speed of the CPU reference model with the 135m preset shape, against a
// bandwidth roofline measured in the same run: streaming the same weight bytes with the plainest
// fast wasm read loop. Usage: pnpm bench llama-decode [--model DIR] [--threads 1|2] [--steps N]
// [--placement auto|separate] (separate: the matrices in a wasm memory of their own, as models past
// 3 GiB of weights have them; the roofline then streams that memory too)
import { execFileSync } from "node:child_process";
import { existsSync, renameSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { LlamaModel, ACTIVATIONS_MODES, DEFAULT_ACTIVATIONS, type ActivationsMode } from "../packages/llama/src/model/llama-model.ts";
import type { Checkpoint } from "../packages/llama/src/checkpoint-types.ts";
import { flagOf, int, oneOf, text } from "../packages/rm-core/src/index.ts";
import { benchArgs, finalLine, fmt, progress, progressDone, summarize } from "./lib.ts";
import { loadCheckpoint } from "../packages/llama/src/checkpoint/load-checkpoint.ts";

const cli = fileURLToPath(new URL("../packages/llama/bin/airm-model.mjs", import.meta.url));

const args = benchArgs("llama-decode", "decode tok/s of the CPU reference model against its bandwidth roofline", {
  model: flagOf(text({ label: "path" }), { defaultText: "the generated 135m preset", doc: "model folder" }),
  threads: flagOf(int({ min: 1, max: 2 }), { default: 1, doc: "kernel threads" }),
  steps: flagOf(int({ min: 1 }), { default: 48, doc: "decode steps per repetition" }),
  reps: flagOf(int({ min: 1 }), { default: 3, doc: "repetitions" }),
  placement: flagOf(oneOf(["auto", "separate"] as const), { default: "auto", doc: "where the weight matrices live (LlamaModelOptions.placement)" }),
  activations: flagOf(oneOf(ACTIVATIONS_MODES), { default: DEFAULT_ACTIVATIONS, doc: "input width of the Q4 kernels (LlamaModelOptions.activations)" }),
});
const modelDir = args.model;
const threads = args.threads as 1 | 2;
const { steps, reps } = args;

/** The model: --model DIR, else the generator's 135m preset, made once into the temp folder. */
async function checkpoint(): Promise<{ ckpt: Checkpoint; source: string }> {
  let dir = modelDir;
  if (!dir) {
    dir = join(tmpdir(), "airm-bench-135m-preset");
    if (!existsSync(join(dir, "model.safetensors"))) {
      progress("generating the 135m preset model (airm-model make-tiny --preset 135m)");
      const partial = `${dir}.partial-${process.pid}`;
      execFileSync(process.execPath, [cli, "make-tiny", "--arch", "llama", "--preset", "135m", "--out", partial], { stdio: "pipe" });
      rmSync(dir, { recursive: true, force: true });
      renameSync(partial, dir);
      progressDone();
    }
  }
  return { ckpt: await loadCheckpoint(dir), source: modelDir ? dir : `${dir} (airm-model make-tiny --preset 135m)` };
}

const { ckpt, source } = await checkpoint();
progress("loading weights");
const model = await LlamaModel.load(ckpt, { threads, placement: args.placement, activations: args.activations as ActivationsMode });
progressDone();
const c = model.config;
console.log(
  `model: ${source} (${c.numLayers} layers, hidden ${c.hiddenSize}, vocab ${c.vocabSize}), threads ${threads}, matrices in ${model.separateWeightBytes > 0 ? "weight memories of their own" : "the main memory"}`,
);
console.log(`weight bytes streamed per decode step: ${(model.weightBytesPerToken / 1e6).toFixed(1)} MB; activations ${model.activations}: ${model.weightsSummary()}`);

const S = 512;
const prompt = Array.from({ length: 256 }, (_, i) => (i * 7919 + 13) % c.vocabSize);

// Prefill of a 256-token prompt.
const prefillMs: number[] = [];
for (let r = 0; r < reps; r++) {
  progress(`prefill ${r + 1}/${reps}`);
  const cache = model.newCache(S);
  const t0 = performance.now();
  model.prefill(prompt, cache);
  prefillMs.push(performance.now() - t0);
  model.freeCache(cache);
}

// Decode at B=1 and B=4 and the roofline, interleaved step by step so that a change in machine
// load hits all three alike (positions 16..16+steps).
const one = model.newCache(S);
model.prefill(prompt.slice(0, 16), one);
const two = Array.from({ length: 2 }, (_, i) => {
  const cache = model.newCache(S);
  model.prefill(prompt.slice(i, i + 16), cache);
  return cache;
});
const four = Array.from({ length: 4 }, (_, i) => {
  const cache = model.newCache(S);
  model.prefill(prompt.slice(i, i + 16), cache);
  return cache;
});
// Wall time is what tokens/s means; the process's CPU time per step (process.cpuUsage) is
// recorded too, since on a shared machine other processes' load stretches wall time unevenly.
const b1: number[] = [],
  b2: number[] = [],
  b4: number[] = [],
  roof: number[] = [];
const b1Cpu: number[] = [],
  b2Cpu: number[] = [],
  b4Cpu: number[] = [],
  roofCpu: number[] = [];
const cpuMs = (): number => {
  const u = process.cpuUsage();
  return (u.user + u.system) / 1000;
};
const timed = (wall: number[], cpu: number[], run: () => unknown): void => {
  const c0 = cpuMs();
  const t0 = performance.now();
  run();
  wall.push(performance.now() - t0);
  cpu.push(cpuMs() - c0);
};
model.streamWeights(); // warm
for (let s = 0; s < steps; s++) {
  progress(`decode step ${s + 1}/${steps}`);
  timed(b1, b1Cpu, () => model.decode([{ cache: one, token: (s * 31) % c.vocabSize }]));
  timed(roof, roofCpu, () => model.streamWeights());
  timed(b2, b2Cpu, () => model.decode(two.map((cache, i) => ({ cache, token: (s * 31 + i) % c.vocabSize }))));
  timed(b4, b4Cpu, () => model.decode(four.map((cache, i) => ({ cache, token: (s * 31 + i) % c.vocabSize }))));
}
progressDone();
model.close();

const step1 = summarize(b1),
  step2 = summarize(b2),
  step4 = summarize(b4),
  roofS = summarize(roof),
  pre = summarize(prefillMs);
const decodeTokS = 1000 / step1.median;
const decodeB4TokS = 4000 / step4.median;
const rooflineTokS = 1000 / roofS.median;
const prefillTokS = (prompt.length * 1000) / pre.median;
console.log(`decode B=1 step: ${fmt(step1)} -> ${decodeTokS.toFixed(1)} tok/s`);
console.log(`decode B=2 step: ${fmt(step2)} -> ${(2000 / step2.median).toFixed(1)} tok/s`);
console.log(`decode B=4 step: ${fmt(step4)} -> ${decodeB4TokS.toFixed(1)} tok/s`);
console.log(
  `roofline (stream ${(model.weightBytesPerToken / 1e6).toFixed(1)} MB): ${fmt(roofS)} -> ${rooflineTokS.toFixed(1)} tok/s, ${(model.weightBytesPerToken / roofS.median / 1e6).toFixed(2)} GB/s`,
);
console.log(`prefill 256 tokens: ${fmt(pre)} -> ${prefillTokS.toFixed(1)} tok/s`);
const c1 = summarize(b1Cpu),
  c4 = summarize(b4Cpu),
  cr = summarize(roofCpu);
console.log(`CPU time per step: B=1 ${fmt(c1)}, B=4 ${fmt(c4)}, roofline ${fmt(cr)}`);
finalLine({
  bench: "llama-decode",
  threads,
  placement: args.placement,
  decode_tok_s: decodeTokS,
  decode_b2_tok_s: 2000 / step2.median,
  decode_b4_tok_s: decodeB4TokS,
  prefill_tok_s: prefillTokS,
  roofline_tok_s: rooflineTokS,
  ratio: decodeTokS / rooflineTokS,
  b4_over_b1: decodeB4TokS / decodeTokS,
  // the same two ratios from the fastest step of each series and (one thread only: with two the
  // process's CPU time counts both) from the median CPU time per step
  ratio_fastest: roofS.min / step1.min,
  b4_over_b1_fastest: (4 * step1.min) / step4.min,
  ...(threads === 1 ? { ratio_cpu: cr.median / c1.median, b4_over_b1_cpu: (4 * c1.median) / c4.median } : {}),
});
