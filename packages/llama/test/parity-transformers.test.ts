// Our engine against Hugging Face transformers itself: tiny models written by `make-tiny` (Qwen3,
// Gemma 3, Qwen2, Llama) as Hugging Face folders are loaded by transformers' AutoConfig, AutoTokenizer and
// AutoModelForCausalLM and run by its own modeling code on CPU torch in float32
// (test/reference/transformers_reference.py, pinned in test/reference/requirements-torch.txt; the
// venv is built once with pip and cached, ~60 s and 5.3 GB: PyPI's linux torch wheel brings the
// CUDA runtime packages, which import and sit unused without a GPU). Compared: the resolved
// config, the chat prompt's text and ids, the centred logits at every position of prompt + 64
// greedy tokens, and the 64 greedy tokens themselves, against transformers with its KV cache
// storing bf16 as ours does (tight: same function, f32 summation noise) and as shipped (f32 K/V:
// the difference our bf16 cache makes, and argmax changes only at near ties).
// Skipped, with the reason, only when Python, its venv module or pip is missing; a failing pip
// install fails the test.
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { Checkpoint } from "../src/checkpoint-types.ts";
import { loadCheckpoint } from "../src/checkpoint/load-checkpoint.ts";
import { generate } from "../src/model/generate.ts";
import { LlamaModel } from "../src/model/llama-model.ts";
import { makeTinyModel, type TinyModelOptions } from "../src/tiny/make-tiny-model.ts";
import { compareCentredLogits } from "./fixtures/parity/centred-logits.ts";
import { teacherForcedLogits } from "./fixtures/parity/parity-model.ts";
import { pythonUnavailable, referencePython, transformersReference, type TransformersRun } from "./fixtures/parity/python-reference.ts";

const skipReason = pythonUnavailable();
if (skipReason) console.warn(`parity-transformers skipped: ${skipReason}`);

const QUESTION = "What is the capital of France?";
const STEPS = 64;
/** Logits compared over the reference's this-many most likely tokens at each position. */
const TOP_K = 64;
/**
 * Bound on |our centred logit - transformers'| (both centred on transformers' top token, over its
 * top 64, at every position) when transformers' KV cache stores K and V as bf16, as ours does:
 * then both compute the same function and differ only in f32 summation order (ours per the
 * kernels, torch's per its BLAS). Measured 3.5e-6 (qwen2), 8.2e-5 (qwen3) and 3.2e-3 (llama): the
 * llama figure is most likely f32 noise moving a K or V value across a bf16 rounding boundary (one bf16 step
 * is 2^-8 relative), which the float64 reference of test/model-forward.test.ts (2.2e-4 on the same
 * model) does not hit. 1e-2 bounds that and is far below what a wrong norm, head_dim, RoPE base or
 * weight layout does (whole units).
 */
const MAX_LOGIT_DIFF_BF16_KV = 1e-2;
/**
 * The same bound against transformers as shipped (K/V kept in f32). Rounding K and V to bf16
 * (relative error up to 2^-9 per value) moves these tiny models' logits, whose top 64 spread over
 * 2.5-4 units, by 1.3e-2 to 2.9e-2 (measured; the float64 reference without the rounding gives the
 * same figures to 1e-5, so the whole difference is our cache's bf16). 0.05 bounds that.
 */
const MAX_LOGIT_DIFF_F32_KV = 0.05;

const MODELS: Record<string, Omit<TinyModelOptions, "out">> = {
  qwen3: { arch: "qwen3", seed: 11, layers: 2, hidden: 64, heads: 4, kvHeads: 2 },
  // two local layers (window 8) around a global one: prompt + 64 tokens cross the window often
  gemma3: { arch: "gemma3", seed: 11, layers: 3, hidden: 64, heads: 4, kvHeads: 1, slidingWindow: 8 },
  qwen2: { arch: "qwen2", seed: 11, layers: 2, hidden: 64, heads: 4, kvHeads: 1 },
  llama: { arch: "llama", seed: 11, layers: 2, hidden: 64, heads: 4, kvHeads: 2 },
};

/** Max |centred logit difference| over the reference's top TOP_K, argmax agreement, and the reference's top-1 gap where the argmax differs. */
const compareLogits = (ours: Float32Array[], ref: Float32Array[]) => compareCentredLogits(ours, ref, TOP_K);

const root = mkdtempSync(join(tmpdir(), "airm-parity-transformers-"));

describe.skipIf(skipReason !== undefined)("parity with Hugging Face transformers (CPU torch, float32) on generated tiny models", () => {
  const refs: Record<string, TransformersRun> = {};
  const ckpts: Record<string, Checkpoint> = {};
  const models: Record<string, LlamaModel> = {};

  beforeAll(async () => {
    const python = referencePython("requirements-torch.txt");
    const jobs = Object.entries(MODELS).map(([name, opts]) => {
      makeTinyModel({ ...opts, out: join(root, name) });
      return { dir: join(root, name), out: join(root, `${name}-ref`), chat: QUESTION, steps: STEPS };
    });
    const runs = transformersReference(python, jobs, join(root, "jobs.json"));
    for (const [i, name] of Object.keys(MODELS).entries()) {
      refs[name] = runs[i]!;
      ckpts[name] = await loadCheckpoint(join(root, name));
      models[name] = await LlamaModel.load(ckpts[name]);
    }
  }, 900_000);

  afterAll(() => {
    for (const m of Object.values(models)) m.close();
    for (const c of Object.values(ckpts)) c.tensors.close();
    rmSync(root, { recursive: true, force: true });
  });

  describe.each(Object.keys(MODELS))("%s", (name) => {
    it("resolves the config as transformers' AutoConfig does", () => {
      const c = ckpts[name]!.config;
      const r = refs[name]!.config;
      expect(r.architecture.toLowerCase()).toContain(c.architecture.replace(/\d/, ""));
      const theta = (kind: string) => (r.rope_parameters[kind] as { rope_theta?: number } | undefined)?.rope_theta ?? null;
      expect({ hd: c.headDim, kv: c.numKvHeads, eps: c.rmsNormEps, theta: c.ropeTheta, tie: c.tieWordEmbeddings }).toEqual({
        hd: r.head_dim ?? c.hiddenSize / c.numHeads,
        kv: r.num_key_value_heads,
        eps: r.rms_norm_eps,
        theta: c.slidingWindow ? theta("full_attention") : r.rope_parameters.rope_theta,
        tie: r.tie_word_embeddings,
      });
      if (c.slidingWindow) {
        // Gemma 3: the local layers, their window and RoPE base, and the attention scalar
        expect(c.slidingWindow).toEqual({ window: r.sliding_window, layers: r.layer_types!.map((t) => t === "sliding_attention"), ropeTheta: theta("sliding_attention") });
        expect(c.queryPreAttnScalar).toBe(r.query_pre_attn_scalar);
        expect(c.slidingWindow.layers).toContain(false);
      }
    });

    it("renders and tokenizes the chat prompt as transformers does", () => {
      const ck = ckpts[name]!;
      const text = ck.renderChat!([{ role: "user", content: QUESTION }], { addGenerationPrompt: true });
      expect(text).toBe(refs[name]!.promptText);
      expect(ck.tokenizer.encode(text, { addSpecialTokens: false })).toEqual(refs[name]!.ids);
    });

    it(`with transformers' K/V stored as bf16 (as ours): logits at every position of prompt + ${STEPS} greedy tokens within ${MAX_LOGIT_DIFF_BF16_KV}, same argmax, same ${STEPS} greedy tokens`, () => {
      const ref = refs[name]!;
      const seq = [...ref.ids, ...ref.greedy.bf16];
      const cmp = compareLogits(teacherForcedLogits(models[name]!, seq), ref.logits.bf16);
      console.log(
        `${name}, bf16 K/V: ${seq.length} positions vs transformers ${ref.torch} float32: max |centred dlogit| ${cmp.maxAbs.toExponential(3)}, argmax agrees at ${cmp.agree}/${seq.length}`,
      );
      expect(cmp.maxAbs).toBeLessThan(MAX_LOGIT_DIFF_BF16_KV);
      expect(cmp.agree).toBe(seq.length);
      expect(generate(models[name]!, ref.ids, { maxTokens: STEPS }).tokens).toEqual(ref.greedy.bf16);
      // not degenerate: the continuation is not one token repeated
      expect(new Set(ref.greedy.bf16).size).toBeGreaterThan(2);
    });

    it(`against transformers as shipped (f32 K/V): logits within ${MAX_LOGIT_DIFF_F32_KV}, argmax different only at near ties`, () => {
      const ref = refs[name]!;
      const seq = [...ref.ids, ...ref.greedy.f32];
      const cmp = compareLogits(teacherForcedLogits(models[name]!, seq), ref.logits.f32);
      const ours = generate(models[name]!, ref.ids, { maxTokens: STEPS }).tokens;
      const same = ours.findIndex((t, i) => t !== ref.greedy.f32[i]);
      console.log(
        `${name}, f32 K/V: max |centred dlogit| ${cmp.maxAbs.toExponential(3)}, argmax agrees at ${cmp.agree}/${seq.length} (transformers' gaps at the others: [${cmp.gaps.map((g) => g.toExponential(2)).join(", ")}]); ` +
          `greedy ${same < 0 ? `equal over ${STEPS} steps` : `equal for ${same} steps`}`,
      );
      expect(cmp.maxAbs).toBeLessThan(MAX_LOGIT_DIFF_F32_KV);
      for (const gap of cmp.gaps) expect(gap).toBeLessThan(MAX_LOGIT_DIFF_F32_KV);
    });
  });
});
