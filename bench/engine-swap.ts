// pnpm bench engine-swap [--model DIR] [--reps N]
// Variant swap, partial weight update (delta) and full reload of the rngd engine in one run, with
// the 135m preset shape (SmolLM2-135M: 30 layers, hidden 576, vocab 49152) unless --model is
// given (the generated model is kept under $TMPDIR/airm-bench-models for the next run). Each is
// timed twice: the operation until the engine can serve (swap(), applyDelta(), a fresh engine:
// checkpoint opened, weights loaded, KV cache sized) and from the request to the first token
// (the operation plus a 4-token prefill, the same compute for all three). The reference is the
// full reload. Tokens are checked: every variant gives the same greedy tokens, and after the
// delta the engine gives exactly the tokens of a fresh engine on the new checkpoint.
// Final line: {"bench":"engine-swap","swap_ms","delta_ms","full_reload_ms","swap_ratio","delta_ratio",
// "swap_op_ms",...}: *_ms are request to first token (as the seed measured), *_op_ms the
// operation alone; the ratios are full_reload_ms / swap_ms and full_reload_ms / delta_ms.

import { existsSync, mkdirSync, mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { performance } from "node:perf_hooks";
import { loadCheckpoint, makeTinyModel } from "../packages/llama/src/index.ts";
import { int, openEngine, text, type Engine, type EngineVariant, flagOf } from "../packages/rm-core/src/index.ts";
import { checkpointHashes, engineTokens } from "../packages/engine-kit/src/index.ts";
import { rngdEngine } from "../packages/engine-rngd/src/index.ts";
import { editCheckpoint } from "../packages/engine-kit/test/checkpoint-edit.ts";
import { benchArgs, finalLine, fmt, progress, progressDone, summarize } from "./lib.ts";

const args = benchArgs("engine-swap", "variant swap, delta and full reload of the rngd engine in one run", {
  reps: flagOf(int({ min: 1 }), { default: 5, doc: "repetitions of each operation" }),
  model: flagOf(text({ label: "path" }), { defaultText: "the generated 135m preset", doc: "model folder" }),
});
const reps = args.reps;
const work = mkdtempSync(join(tmpdir(), "airm-engine-swap-"));
const modelDir = args.model ?? join(tmpdir(), "airm-bench-models", "llama-135m-preset");
const deltaDir = join(work, "model-delta");
const env: Record<string, string> = { AIRM_DEV_ROOT: join(work, "dev"), AIRM_ARTIFACT_CACHE: join(work, "artifacts"), AIRM_ENGINE_LOG: "0" };
mkdirSync(env.AIRM_DEV_ROOT!, { recursive: true });
// The seed's RNGD variants: B4/B8 at S512 and B4 at S256.
const variants: EngineVariant[] = [
  { batch: 4, seqLen: 256 },
  { batch: 4, seqLen: 512 },
  { batch: 8, seqLen: 512 },
];
const GREEDY = 8;

async function load(model: string): Promise<Engine> {
  return openEngine(rngdEngine, { model, variants, maxModelLen: 512, batch: 4 }, { env });
}

async function firstToken(engine: Engine, prompt: number[], _variantS: number): Promise<number> {
  return (await engine.prefill(prompt, {})).firstToken;
}

const greedy = (engine: Engine, prompt: number[], _variantS: number): Promise<number[]> => engineTokens(engine, prompt, GREEDY);

try {
  if (!existsSync(join(modelDir, "config.json"))) {
    progress(`writing the 135m preset model to ${modelDir}`);
    makeTinyModel({ arch: "llama", preset: "135m", out: modelDir, onProgress: (d, t) => progress(`make-tiny 135m: ${d}/${t}`) });
  }
  progress("writing the delta checkpoint (3 tensors changed)");
  const changed = editCheckpoint(modelDir, deltaDir, {
    "model.norm.weight": (_i, old) => old ^ 0x0001,
    "model.layers.0.self_attn.o_proj.weight": (i, old) => (i % 5 === 0 ? old ^ 0x0002 : old),
    "model.layers.29.mlp.down_proj.weight": (i, old) => (i % 3 === 0 ? old ^ 0x0001 : old),
  });
  const probe = await loadCheckpoint(modelDir);
  const text = "The engine swaps variants and weights while the weights stay resident on the card.";
  const prompt = probe.tokenizer.encode(text).slice(0, 4);
  const checkPrompt = probe.tokenizer.encode(text).slice(0, 16);
  probe.tensors.close();

  // Cold start: hash the checkpoint, convert and pack the weights, store what the cache keeps.
  progress("cold start");
  let t0 = performance.now();
  let engine = await load(modelDir);
  await firstToken(engine, prompt, 512);
  const coldMs = performance.now() - t0;
  const weightsCold = engine.stats().weightsFrom;
  await engine.close();

  // The new checkpoint's per-tensor hashes, as a delivery system (onggi) hands them over.
  progress("hashing the delta checkpoint (delivery step)");
  t0 = performance.now();
  const delta = await loadCheckpoint(deltaDir);
  checkpointHashes(delta, env.AIRM_ARTIFACT_CACHE!);
  delta.tensors.close();
  const hashNewMs = performance.now() - t0;

  // Reference: full reload (warm).
  const full: number[] = [];
  const fullFirst: number[] = [];
  let weightsWarm = "";
  for (let i = 0; i < reps; i++) {
    progress(`full reload ${i + 1}/${reps}`);
    t0 = performance.now();
    engine = await load(modelDir);
    full.push(performance.now() - t0);
    await firstToken(engine, prompt, 512);
    fullFirst.push(performance.now() - t0);
    weightsWarm = engine.stats().weightsFrom;
    await engine.close();
  }

  engine = await load(modelDir);
  const baseline = await greedy(engine, checkPrompt, 512);
  let tokensIdentical = true;

  // Swap: change the variant, the weights stay.
  const swaps: number[] = [];
  const swapsFirst: number[] = [];
  for (let i = 0; i < reps * variants.length; i++) {
    const v = variants[i % variants.length];
    progress(`swap ${i + 1}/${reps * variants.length} -> B${v.batch}xS${v.seqLen}`);
    t0 = performance.now();
    await engine.swap(v);
    swaps.push(performance.now() - t0);
    await firstToken(engine, prompt, v.seqLen);
    swapsFirst.push(performance.now() - t0);
    if (i < variants.length) tokensIdentical &&= JSON.stringify(await greedy(engine, checkPrompt, v.seqLen)) === JSON.stringify(baseline);
  }
  await engine.swap({ batch: 4, seqLen: 512 });

  // Delta: only the changed tensors go up.
  const deltas: number[] = [];
  const deltasFirst: number[] = [];
  let deltaMode = "";
  let uploadBytes = 0;
  for (let i = 0; i < reps; i++) {
    progress(`delta ${i + 1}/${reps}`);
    t0 = performance.now();
    const d = await engine.applyDelta(deltaDir);
    deltas.push(performance.now() - t0);
    await firstToken(engine, prompt, 512);
    deltasFirst.push(performance.now() - t0);
    deltaMode = d.mode;
    uploadBytes = d.uploadBytes;
    if (JSON.stringify(d.changedTensors) !== JSON.stringify(changed)) throw new Error(`delta plan ${d.changedTensors.join(",")} != ${changed.join(",")}`);
    if (i === 0) {
      const afterDelta = await greedy(engine, checkPrompt, 512);
      const fresh = await load(deltaDir);
      tokensIdentical &&= JSON.stringify(afterDelta) === JSON.stringify(await greedy(fresh, checkPrompt, 512));
      await fresh.close();
    }
    await engine.applyDelta(modelDir); // back, untimed
  }
  tokensIdentical &&= JSON.stringify(await greedy(engine, checkPrompt, 512)) === JSON.stringify(baseline);
  const stats = engine.stats();
  await engine.close();
  progressDone();

  const sFull = summarize(full);
  const sSwap = summarize(swaps);
  const sDelta = summarize(deltas);
  const fFull = summarize(fullFirst);
  const fSwap = summarize(swapsFirst);
  const fDelta = summarize(deltasFirst);
  console.log(`model           ${modelDir}`);
  console.log(`cold start      ${coldMs.toFixed(0)} ms to first token (weights ${weightsCold})`);
  console.log(`full reload     ${fmt(sFull)}; to first token ${fmt(fFull)} (weights ${weightsWarm})`);
  console.log(`swap            ${fmt(sSwap)}; to first token ${fmt(fSwap)}`);
  console.log(
    `delta           ${fmt(sDelta)}; to first token ${fmt(fDelta)} (mode ${deltaMode}, ${(uploadBytes / 1e6).toFixed(2)} MB uploaded, ${changed.length} tensors changed)`,
  );
  console.log(`hash new ckpt   ${hashNewMs.toFixed(0)} ms (delivery step, not in delta_ms)`);
  console.log(`tokens identical: ${tokensIdentical}; kv arena S=${stats.variant.seqLen}`);
  finalLine({
    bench: "engine-swap",
    model: modelDir.endsWith("llama-135m-preset") ? "135m-preset" : modelDir,
    swap_ms: fSwap.median,
    delta_ms: fDelta.median,
    full_reload_ms: fFull.median,
    swap_ratio: fFull.median / fSwap.median,
    delta_ratio: fFull.median / fDelta.median,
    swap_op_ms: sSwap.median,
    delta_op_ms: sDelta.median,
    full_reload_op_ms: sFull.median,
    cold_start_ms: coldMs,
    hash_new_checkpoint_ms: hashNewMs,
    delta_mode: deltaMode,
    weights_from: weightsWarm,
    tokens_identical: tokensIdentical,
    reps,
  });
} finally {
  rmSync(work, { recursive: true, force: true });
}
