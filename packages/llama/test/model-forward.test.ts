// The forward pass: agreement with an independent float64 reference, and the bit-exactness
// properties PD serving relies on: chunked = whole prefill, B=1 = inside a batch, 1 = 2 threads;
// for bf16 weights and for the integer kernels over quantized blocks (q8_0, q4_1).
import { createHash } from "node:crypto";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { isAirmError } from "@airm/rm-core";
import type { ModelConfig } from "../src/checkpoint-types.ts";
import { type ActivationsMode, LlamaModel, type WeightsMode } from "../src/model/llama-model.ts";
import { generate } from "../src/model/generate.ts";
import type { KVCache } from "../src/model/kv-cache.ts";
import { dequantizedCheckpoint, randomCheckpoint, tinyConfig, tinyGemma3Config, tinyQwen2Config } from "./model-helpers/random-checkpoint.ts";
import { referenceForward } from "./model-helpers/reference-math.ts";

const archs: Record<string, ModelConfig> = {
  llama: tinyConfig(),
  qwen2: tinyQwen2Config(),
  // Qwen3: per-head q/k norm, head_dim 32 where hidden / heads is 16 (as Qwen3-0.6B's 128 against 64)
  qwen3: tinyConfig({ architecture: "qwen3", headDim: 32, tieWordEmbeddings: true, ropeTheta: 1000000 }),
  gemma3: tinyGemma3Config(),
  llama31: tinyConfig({ ropeScaling: { type: "llama3", factor: 8, lowFreqFactor: 1, highFreqFactor: 4, originalMaxPositionEmbeddings: 64 }, ropeTheta: 500000 }),
};
// Quantized cases: every matrix quantized (intermediate 160: columns a multiple of 32), and one
// llama with intermediate 136 where down_proj cannot be and stays bf16 (both kinds in one pass).
// Their reference runs on the dequantised weights: 16-bit inputs keep the bf16 tolerance; 8-bit
// inputs (the Q4 default) add up to amax / 254 per input value, and a wider one.
const configs: Record<string, { config: ModelConfig; weights: WeightsMode; activations?: ActivationsMode; tolerance: number }> = {
  ...Object.fromEntries(Object.entries(archs).map(([k, config]) => [k, { config, weights: "auto" as const, tolerance: 2e-2 }])),
  "llama q8_0": { config: tinyConfig({ intermediateSize: 160 }), weights: "q8_0", tolerance: 2e-2 },
  "qwen2 q4_1": { config: { ...archs.qwen2, intermediateSize: 160 }, weights: "q4_1", activations: "i16", tolerance: 2e-2 },
  "qwen2 q4_1, 8-bit inputs": { config: { ...archs.qwen2, intermediateSize: 160 }, weights: "q4_1", activations: "i8", tolerance: 6e-2 },
  "qwen3 q4_1, 8-bit inputs": { config: { ...archs.qwen3, intermediateSize: 160 }, weights: "q4_1", activations: "i8", tolerance: 6e-2 },
  "gemma3 q4_1, 8-bit inputs": { config: { ...archs.gemma3, intermediateSize: 160 }, weights: "q4_1", activations: "i8", tolerance: 6e-2 },
  "llama q4_1 + bf16 down_proj": { config: tinyConfig(), weights: "q4_1", activations: "i16", tolerance: 2e-2 },
  "llama q4_1 + bf16 down_proj, 8-bit inputs": { config: tinyConfig(), weights: "q4_1", activations: "i8", tolerance: 6e-2 },
};

function kvDigest(m: LlamaModel, cache: KVCache): string {
  const h = createHash("sha256");
  for (let l = 0; l < m.config.numLayers; l++) h.update(cache.layerK(l)).update(cache.layerV(l));
  return h.digest("hex");
}

function bits(x: Float32Array): Buffer {
  return Buffer.from(x.buffer, x.byteOffset, x.byteLength);
}

const prompt = [1, 40, 41, 42, 99, 7, 250, 13, 13, 64, 200, 5, 77, 31, 18, 260, 3];

const models: Record<string, LlamaModel> = {};
beforeAll(async () => {
  for (const [k, c] of Object.entries(configs)) models[k] = await LlamaModel.load(randomCheckpoint(c.config, 3), { weights: c.weights, activations: c.activations });
});
afterAll(() => Object.values(models).forEach((m) => m.close()));

describe.each(Object.keys(configs))("%s", (arch) => {
  it("agrees with the float64 reference forward pass (quantized: within the quantization's error)", () => {
    const m = models[arch];
    const tolerance = configs[arch].tolerance;
    if (configs[arch].weights !== "auto") expect(m.weightKinds.q8 + m.weightKinds.q4 + m.weightKinds.q4a8).toBeGreaterThan(0);
    const weights = configs[arch].weights;
    const refCkpt = weights === "q8_0" ? dequantizedCheckpoint(m.checkpoint, "Q8_0") : weights === "q4_1" ? dequantizedCheckpoint(m.checkpoint, "Q4_1") : m.checkpoint;
    const ref = referenceForward(refCkpt, prompt);
    const cache = m.newCache(32);
    const logits = m.prefill(prompt, cache);
    const last = ref[ref.length - 1];
    let maxDiff = 0,
      maxRef = 0;
    for (let i = 0; i < last.length; i++) {
      maxDiff = Math.max(maxDiff, Math.abs(logits[i] - last[i]));
      maxRef = Math.max(maxRef, Math.abs(last[i]));
    }
    expect(maxRef).toBeGreaterThan(0.5);
    expect(maxDiff / maxRef).toBeLessThan(tolerance);
    // and each decode step against the reference at that position
    const d = m.decode([{ cache, token: 9 }])[0];
    const ref2 = referenceForward(refCkpt, [...prompt, 9]).at(-1)!;
    let md = 0;
    for (let i = 0; i < d.length; i++) md = Math.max(md, Math.abs(d[i] - ref2[i]));
    expect(md / maxRef).toBeLessThan(tolerance);
    m.freeCache(cache);
  });

  it("(c) chunked prefill gives the same KV bytes and logits as whole-prompt prefill", () => {
    const m = models[arch];
    const whole = m.newCache(40);
    const lw = m.prefill(prompt, whole);
    for (const chunk of [1, 3, 4, 5, 16]) {
      const c = m.newCache(40);
      const lc = m.prefillChunk(prompt, c, chunk);
      expect(c.n).toBe(prompt.length);
      expect(kvDigest(m, c)).toBe(kvDigest(m, whole));
      expect(bits(lc).equals(bits(lw))).toBe(true);
      m.freeCache(c);
    }
    // the KV is not trivially zero
    expect(whole.layerK(0).some((b) => b !== 0)).toBe(true);
    m.freeCache(whole);
  });

  it("(c) a prompt longer than one internal token block: whole = chunked = token by token", () => {
    const m = models[arch];
    const long = Array.from({ length: 300 }, (_, i) => (i * 37 + 11) % m.config.vocabSize);
    const whole = m.newCache(320);
    const lw = m.prefill(long, whole);
    for (const chunk of [7, 129]) {
      const c = m.newCache(320);
      const lc = m.prefillChunk(long, c, chunk);
      expect(kvDigest(m, c)).toBe(kvDigest(m, whole));
      expect(bits(lc).equals(bits(lw))).toBe(true);
      m.freeCache(c);
    }
    // one prompt token per decode step fills the same cache too
    const stepwise = m.newCache(320);
    let last: Float32Array | undefined;
    for (const t of long) last = m.decode([{ cache: stepwise, token: t }])[0];
    expect(kvDigest(m, stepwise)).toBe(kvDigest(m, whole));
    expect(bits(last!).equals(bits(lw))).toBe(true);
    m.freeCache(stepwise);
    m.freeCache(whole);
  });

  it("(b) prompts prefilled together in one pass get the KV bytes and logits each gets alone", async () => {
    const m = models[arch];
    // lengths that mix four-token and one-token tiles, one past the 128-token block, one cache
    // that already holds a prefix (continued at its own positions)
    const long = Array.from({ length: 150 }, (_, i) => (i * 53 + 7) % m.config.vocabSize);
    const jobs = [prompt, [1, 5, 6], prompt.slice(3, 12).reverse(), long, [9]];
    const alone = jobs.map((p) => {
      const c = m.newCache(200);
      if (p.length === 1) m.prefill(prompt.slice(0, 5), c);
      return { c, logits: m.prefill(p, c) };
    });
    const together = jobs.map((p) => {
      const c = m.newCache(200);
      if (p.length === 1) m.prefill(prompt.slice(0, 5), c);
      return c;
    });
    const layers: number[] = [];
    const logits = await m.prefillManyAsync(
      jobs.map((tokens, i) => ({ tokens, cache: together[i] })),
      { onLayer: (l) => layers.push(l) },
    );
    expect(layers).toEqual(Array.from({ length: m.config.numLayers }, (_, l) => l));
    jobs.forEach((_, i) => {
      expect(together[i].n, `job ${i}`).toBe(alone[i].c.n);
      expect(kvDigest(m, together[i]), `job ${i} KV`).toBe(kvDigest(m, alone[i].c));
      expect(bits(logits[i]).equals(bits(alone[i].logits)), `job ${i} logits`).toBe(true);
    });
    // distinct prompts give distinct logits (the check above is not comparing one row with itself)
    expect(bits(logits[0]).equals(bits(logits[1]))).toBe(false);
    // a cache used twice in one pass is refused, and so is a prompt past its cache
    await expect(
      m.prefillManyAsync([
        { tokens: [1], cache: together[0] },
        { tokens: [2], cache: together[0] },
      ]),
    ).rejects.toThrow(/its own cache/);
    const small = m.newCache(8);
    await expect(m.prefillManyAsync([{ tokens: long.slice(0, 9), cache: small }])).rejects.toThrow(/9/);
    for (const c of [...together, ...alone.map((a) => a.c), small]) m.freeCache(c);
  });

  it("(b) a stream's tokens are identical at B=1 and inside batches of 3, 4 and 7 mixed streams", () => {
    const m = models[arch];
    const four = [prompt, [1, 5, 6], prompt.slice(0, 9).reverse(), [1, 80, 81, 82, 83, 84, 85, 86, 87, 88, 89, 90, 91, 92]];
    const steps = 12;
    const soloOf = new Map(four.map((p) => [p, generate(m, p, { maxTokens: steps, S: 48 }).tokens]));
    for (const prompts of [four.slice(0, 3), four, [...four, ...four.slice(1)]]) {
      const solo = prompts.map((p) => soloOf.get(p)!);
      // batch: stagger the starts so positions differ, then decode all together (3 and 7 streams
      // mix four-token and one-token kernel tiles)
      const caches = prompts.map(() => m.newCache(48));
      const next = prompts.map((p, i) => {
        const l = m.prefill(p, caches[i]);
        return argmaxOf(l);
      });
      const got: number[][] = prompts.map((_, i) => [next[i]]);
      for (let s = 1; s < steps; s++) {
        const logits = m.decode(caches.map((cache, i) => ({ cache, token: got[i][s - 1] })));
        logits.forEach((l, i) => got[i].push(argmaxOf(l)));
      }
      expect(got, `${prompts.length} streams`).toEqual(solo);
      expect(new Set(got.map((g) => g.join())).size).toBeGreaterThan(1);
      caches.forEach((c) => m.freeCache(c));
    }
  });
});

function argmaxOf(l: Float32Array): number {
  let b = 0;
  for (let i = 1; i < l.length; i++) if (l[i] > l[b]) b = i;
  return b;
}

describe("threads", () => {
  it.each([
    ["bf16", 344],
    ["q8_0", 352],
    ["q4_1", 352],
  ] as [WeightsMode, number][])("(d) 1 and 2 threads give identical logits and KV bytes (%s weights)", async (weights, intermediateSize) => {
    const c = tinyConfig({ hiddenSize: 128, intermediateSize, numHeads: 8, numKvHeads: 2, headDim: 16, vocabSize: 1000 });
    const m1 = await LlamaModel.load(randomCheckpoint(c, 9), { threads: 1, weights });
    const m2 = await LlamaModel.load(randomCheckpoint(c, 9), { threads: 2, weights });
    try {
      expect(m2.threads).toBe(2);
      const a = m1.newCache(64),
        b = m2.newCache(64);
      expect(bits(m1.prefill(prompt, a)).equals(bits(m2.prefill(prompt, b)))).toBe(true);
      expect(kvDigest(m1, a)).toBe(kvDigest(m2, b));
      for (let s = 0; s < 5; s++) {
        const la = m1.decode([{ cache: a, token: 10 + s }])[0];
        const lb = m2.decode([{ cache: b, token: 10 + s }])[0];
        expect(bits(la).equals(bits(lb))).toBe(true);
      }
      expect(kvDigest(m1, a)).toBe(kvDigest(m2, b));
      expect(m1.numericsFingerprint).toBe(m2.numericsFingerprint);
      expect(m1.numericsFingerprint).toMatch(/^[0-9a-f]{64}$/);
    } finally {
      m1.close();
      m2.close();
    }
  });
});

describe("errors and cache API", () => {
  it("rejects a prompt + max_tokens beyond S with ContextOverflowError, never wraps", () => {
    const m = models.llama;
    const err = (() => {
      try {
        generate(m, prompt, { maxTokens: 20, S: 32 });
      } catch (e) {
        return e;
      }
    })();
    expect(isAirmError(err, "CONTEXT_OVERFLOW")).toBe(true);
    expect((err as { requested: number; limit: number }).requested).toBe(prompt.length + 20);
    expect((err as { requested: number; limit: number }).limit).toBe(32);
    const cache = m.newCache(4);
    expect(() => m.prefill(prompt, cache)).toThrow(/exceeds the cache's capacity of 4 tokens/);
    expect(cache.n).toBe(0);
    m.prefill([1, 2, 3, 4], cache);
    expect(() => m.decode([{ cache, token: 5 }])).toThrow(expect.objectContaining({ code: "CONTEXT_OVERFLOW" }));
    expect(cache.n).toBe(4);
    m.freeCache(cache);
  });

  it("types bad input: token ids, empty prompt, shared or foreign caches, freed caches", async () => {
    const m = models.llama;
    const cache = m.newCache(16);
    expect(() => m.prefill([], cache)).toThrow(expect.objectContaining({ code: "CONFIG" }));
    expect(() => m.prefill([1, 300], cache)).toThrow(/outside the vocabulary/);
    expect(() => m.prefill([1, -1], cache)).toThrow(expect.objectContaining({ code: "CONFIG" }));
    expect(() =>
      m.decode([
        { cache, token: 1 },
        { cache, token: 2 },
      ]),
    ).toThrow(/its own cache/);
    expect(() => models.qwen2.prefill([1], cache)).toThrow(/another model/);
    expect(() => m.newCache(0)).toThrow(expect.objectContaining({ code: "CONFIG" }));
    cache.n = -1;
    expect(() => m.decode([{ cache, token: 1 }])).toThrow(expect.objectContaining({ code: "CONFIG" }));
    cache.n = 2.5;
    expect(() => m.prefill([1], cache)).toThrow(/cache.n/);
    cache.n = 0;
    m.freeCache(cache);
    expect(() => m.prefill([1], cache)).toThrow(/freed/);
    expect(() => cache.layerK(0)).toThrow(/freed/);
  });

  it("a new cache holds no block; blocks come as positions are written and go back when it is freed", () => {
    const m = models.llama;
    const c = m.config;
    const pool = m.kvPool;
    const used = pool.usedBlocks;
    const a = m.newCache(200);
    expect(a.blockIds).toEqual([]);
    m.prefill(prompt, a); // 17 positions: two blocks of 16
    expect(a.blockIds).toHaveLength(2);
    expect(pool.usedBlocks).toBe(used + 2);
    for (let l = 0; l < c.numLayers; l++) expect(a.layerK(l).byteLength).toBe(2 * c.numKvHeads * c.headDim * 16 * 2);
    const ids = [...a.blockIds];
    m.freeCache(a);
    expect(pool.usedBlocks).toBe(used);
    // the last freed blocks are the next taken (memory touched follows the blocks in use at once)
    const b = m.newCache(200);
    m.prefill([1, 2, 3], b);
    expect(ids).toContain(b.blockIds[0]);
    // positions past n in an exported last block are zero, whatever the block held before
    for (let l = 0; l < c.numLayers; l++) {
      const k = new Uint16Array(b.layerK(l).buffer);
      for (let r = 0; r < c.numKvHeads * c.headDim; r++) for (let p = 3; p < 16; p++) expect(k[r * 16 + p]).toBe(0);
    }
    m.freeCache(b);
  });

  it("onLayer fires once per layer, in order, with that layer's K/V already final", () => {
    const m = models.llama;
    const cache = m.newCache(32);
    const seen: number[] = [];
    const atLayer: Uint8Array[] = [];
    m.prefill(prompt, cache, {
      onLayer(l) {
        seen.push(l);
        atLayer.push(cache.layerK(l, prompt.length));
      },
    });
    expect(seen).toEqual([0, 1]);
    atLayer.forEach((k, l) => expect(Buffer.from(k).equals(Buffer.from(cache.layerK(l)))).toBe(true));
    m.freeCache(cache);
  });

  it("a block stores K [kv_heads][head_dim][block] and V [kv_heads][block][head_dim] (layout rngd-pd/v2)", () => {
    // A cache written one position at a time must fill exactly the layout's slots for that position.
    const m = models.llama;
    const c = m.config;
    const bs = m.kvPool.blockSize;
    const cache = m.newCache(40);
    m.prefill([1, 2, 3], cache);
    const k = new Uint16Array(cache.layerK(1).slice().buffer);
    const v = new Uint16Array(cache.layerV(1).slice().buffer);
    expect(k.length).toBe(c.numKvHeads * c.headDim * bs);
    for (let g = 0; g < c.numKvHeads; g++) {
      for (let d = 0; d < c.headDim; d++) {
        for (let s = 0; s < bs; s++) {
          expect(k[(g * c.headDim + d) * bs + s] !== 0).toBe(s < 3);
          expect(v[(g * bs + s) * c.headDim + d] !== 0).toBe(s < 3);
        }
      }
    }
    m.freeCache(cache);
  });
});
