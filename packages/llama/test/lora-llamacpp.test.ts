// GGUF LoRA adapters in llama.cpp itself (node-llama-cpp 3.21.1, prebuilt, CPU, one thread, as
// parity-llamacpp.test.ts; skipped with the reason when its binary does not load): a generated tiny
// Llama and Qwen2 written as GGUF base models (F32), three adapters made by makeTinyLora and
// converted by peftToGguf, loaded by llama.cpp with its own LoRA reader (`lora` of the context, as
// llama-server's --lora) and by our engine from the same files. Per model and adapter, as the
// parity test bounds the base model: teacher-forced argmax agreement and centred logits over
// llama.cpp's top 64 at every position within its bounds, and the same greedy tokens. The adapters
// move llama.cpp's own logits by more than that bound, and the Llama adapter with its q/k rows left
// in Hugging Face order (the converter's permutation skipped) falls outside it: the bounds tell a
// wrong file from a right one. (What differences remain come from our K/V cache in bf16, llama.cpp's
// in f16: measured on the all-linear adapter, ours equals a float64 forward pass with bf16-rounded
// K/V to 1e-3, llama.cpp one with unrounded K/V.)
import { mkdirSync, mkdtempSync, readSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { Checkpoint } from "../src/checkpoint-types.ts";
import { unpermuteRows } from "../src/checkpoint/gguf-checkpoint.ts";
import { closeGguf, openGguf } from "../src/checkpoint/gguf-file.ts";
import { f32, str, writeGguf } from "../src/checkpoint/gguf-writer.ts";
import { loadCheckpoint } from "../src/checkpoint/load-checkpoint.ts";
import type { LoraHandle } from "../src/lora/lora-registry.ts";
import { peftToGguf } from "../src/lora/peft-to-gguf.ts";
import { generate } from "../src/model/generate.ts";
import { LlamaModel } from "../src/model/llama-model.ts";
import { makeTinyLora, type TinyLoraOptions } from "../src/tiny/make-tiny-lora.ts";
import { agreement, MAX_LOGIT_DIFF, MIN_NEAR_TIE_AGREEMENT, MIN_STRICT_AGREEMENT } from "./fixtures/parity/llamacpp-agreement.ts";
import { type CentredTop, type LlamaCpp, llamaCppGreedy, llamaCppTeacherForced, llamaCppUnavailable, openLlamaCpp } from "./fixtures/parity/llamacpp-reference.ts";
import { tinyGgufModel } from "./model-helpers/tiny-gguf-model.ts";

const unavailable = await llamaCppUnavailable();
if (unavailable) console.warn(`lora-llamacpp skipped: ${unavailable}`);

/** As lora-engine.test.ts: ranks 4, 8 (rsLoRA, BF16) and 3 (layer 1 only), different targets. */
const ADAPTERS: Record<string, Omit<TinyLoraOptions, "out" | "model" | "baseModel">> = {
  qv: { r: 4, alpha: 8, targets: ["q_proj", "v_proj"], seed: 1 },
  all: { r: 8, alpha: 16, useRslora: true, targets: "all-linear", dtype: "bf16", seed: 2 },
  late: { r: 3, alpha: 4, targets: ["o_proj", "gate_proj", "up_proj", "down_proj"], layers: [1], seed: 3 },
};

/** 48 token ids of the tiny vocabulary (400: 3 special, 256 bytes, merges and fillers). */
const IDS = Array.from({ length: 48 }, (_, i) => ((i * 37 + 11) % 390) + 3);
const GREEDY = 24;

/** Max |centred logit of `a` - of `b`| over the tokens both list, at every position (how far an adapter moves llama.cpp's logits). */
function moved(a: CentredTop[], b: CentredTop[]): number {
  let most = 0;
  a.forEach((top, p) => {
    const other = new Map(b[p]);
    const ref = other.get(top[0][0]);
    if (ref === undefined) return;
    for (const [t, c] of top) {
      const o = other.get(t);
      if (o !== undefined) most = Math.max(most, Math.abs(c - (o - ref)));
    }
  });
  return most;
}

/** A copy of GGUF adapter `from` whose attn_q / attn_k lora_b rows are put back in Hugging Face order (a converter that skipped llama.cpp's permutation). */
function unpermutedCopy(from: string, to: string, heads: { q: number; k: number }): void {
  const f = openGguf(from);
  try {
    const tensors = f.tensors.map((t) => {
      const data = new Uint8Array(t.byteLength);
      readSync(f.fd, data, 0, t.byteLength, t.start);
      const h = /\.attn_q\.weight\.lora_b$/.test(t.name) ? heads.q : /\.attn_k\.weight\.lora_b$/.test(t.name) ? heads.k : 0;
      if (!h) return { name: t.name, dims: t.dims, typeId: t.typeId, data };
      const out = new Uint8Array(data.length);
      unpermuteRows(data, out, t.dims[1]!, t.dims[0]! * 4, h);
      return { name: t.name, dims: t.dims, typeId: t.typeId, data: out };
    });
    const metadata = {
      "general.architecture": str("llama"),
      "general.type": str("adapter"),
      "adapter.type": str("lora"),
      "adapter.lora.alpha": f32(f.metadata.get("adapter.lora.alpha") as number),
    };
    writeGguf(to, { metadata, tensors });
  } finally {
    closeGguf(f);
  }
}

describe.skipIf(unavailable !== undefined)("GGUF LoRA adapters in llama.cpp and in our engine", () => {
  const root = mkdtempSync(join(tmpdir(), "airm-lora-llamacpp-"));
  afterAll(() => rmSync(root, { recursive: true, force: true }));

  describe.each(["llama", "qwen2"] as const)("tiny %s GGUF base model", (arch) => {
    let ckpt: Checkpoint;
    let model: LlamaModel;
    let cpp: LlamaCpp;
    let baseTop: CentredTop[];
    const files: Record<string, string> = {};
    const handles: Record<string, LoraHandle> = {};

    beforeAll(async () => {
      const dir = join(root, arch);
      mkdirSync(dir, { recursive: true });
      const tiny = await tinyGgufModel(arch, dir);
      for (const [name, o] of Object.entries(ADAPTERS)) {
        makeTinyLora({ ...o, out: join(dir, name), model: tiny.config, baseModel: tiny.gguf });
        files[name] = join(dir, `${name}.gguf`);
        peftToGguf(join(dir, name), files[name], tiny.config);
      }
      ckpt = await loadCheckpoint(tiny.gguf);
      model = await LlamaModel.load(ckpt, { threads: 1 });
      for (const [name, file] of Object.entries(files)) handles[name] = model.loadLora(name, file);
      cpp = await openLlamaCpp(tiny.gguf);
      baseTop = await llamaCppTeacherForced(cpp, IDS, 64);
    }, 180_000);

    afterAll(async () => {
      model?.close();
      ckpt?.tensors.close();
      await cpp?.model.dispose();
      await cpp?.llama.dispose();
    });

    /** The handle of adapter `name` ("base": none). */
    const on = (name: string): LoraHandle | undefined => (name === "base" ? undefined : handles[name]);

    /** Our teacher-forced logits on adapter `name`. */
    function ours(name: string): Float32Array[] {
      const cache = model.newCache(IDS.length);
      try {
        return model.prefillAllLogits(IDS, cache, { lora: on(name) });
      } finally {
        model.freeCache(cache);
      }
    }

    it.each(["base", ...Object.keys(ADAPTERS)])("%s: teacher-forced argmax and centred logits within the parity bounds, the same greedy tokens", async (name) => {
      const file = files[name];
      const theirs = name === "base" ? baseTop : await llamaCppTeacherForced(cpp, IDS, 64, 64, { lora: file });
      const r = agreement(ours(name), theirs);
      const prompt = IDS.slice(0, 12);
      const ourTokens = generate(model, prompt, { maxTokens: GREEDY, stopTokenIds: [], lora: on(name) }).tokens;
      const theirTokens = await llamaCppGreedy(cpp, prompt, GREEDY, [], { lora: file });
      const shift = moved(theirs, baseTop);
      console.log(
        `${arch} + ${name}: argmax ${r.strict.toFixed(3)} exact, ${r.nearTie.toFixed(3)} with near ties; max |dlogit| ${r.maxAbsDiff.toFixed(4)}, mean ${r.meanAbsDiff.toFixed(4)}; ` +
          `llama.cpp's logits moved from its base by ${shift.toFixed(3)}; greedy ${ourTokens.join(",")}`,
      );
      expect(r.nearTie).toBeGreaterThanOrEqual(MIN_NEAR_TIE_AGREEMENT);
      expect(r.strict).toBeGreaterThanOrEqual(MIN_STRICT_AGREEMENT);
      expect(r.maxAbsDiff).toBeLessThan(MAX_LOGIT_DIFF);
      expect(ourTokens).toHaveLength(GREEDY);
      expect(theirTokens).toEqual(ourTokens);
      // llama.cpp applied the adapter: it moves its logits by more than the bound above
      if (name !== "base") expect(shift).toBeGreaterThan(MAX_LOGIT_DIFF);
    });

    // only llama.cpp's llama architecture permutes q/k rows
    if (arch !== "llama") return;
    it("the q/v and all-linear adapters with their q/k rows in Hugging Face order (no permutation) fall outside the bounds in llama.cpp", async () => {
      for (const name of ["qv", "all"]) {
        const wrong = join(root, arch, `${name}-unpermuted.gguf`);
        unpermutedCopy(files[name], wrong, { q: ckpt.config.numHeads, k: ckpt.config.numKvHeads });
        const r = agreement(ours(name), await llamaCppTeacherForced(cpp, IDS, 64, 64, { lora: wrong }));
        console.log(`${arch} + ${name} without the q/k permutation: argmax ${r.strict.toFixed(3)}, max |dlogit| ${r.maxAbsDiff.toFixed(3)}`);
        expect(r.maxAbsDiff).toBeGreaterThan(MAX_LOGIT_DIFF);
        expect(r.strict).toBeLessThan(MIN_STRICT_AGREEMENT);
      }
    });
  });
});
