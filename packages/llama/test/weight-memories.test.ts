// Weight matrices in wasm memories of their own (placement "separate", and "auto" past
// SHARED_WEIGHTS_MAX): the same bits as in the main memory, for every block type, on one and two
// threads, across several weight memories, through a packed image; and a model of more than
// 4 GiB of weights, whose real layers sit past 2 GiB in the first weight memory and in the second,
// gives the tokens of the model of its real layers alone.
import { describe, expect, it } from "vitest";
import { SHARED_WEIGHTS_MAX, LlamaModel, type LlamaModelOptions } from "../src/model/llama-model.ts";
import { argmax } from "../src/sampling/sample.ts";
import type { Checkpoint } from "../src/checkpoint-types.ts";
import { randomCheckpoint, tinyConfig } from "./model-helpers/random-checkpoint.ts";
import { type StoredLayer, storedCheckpoint } from "./model-helpers/stored-checkpoint.ts";
import type { QuantType } from "./model-helpers/quant-blocks.ts";

/** Greedy tokens and the last logits of a prompt and `steps` decode steps. */
function run(model: LlamaModel, prompt: number[], steps: number): { tokens: number[]; logits: Float32Array } {
  const cache = model.newCache(prompt.length + steps + 1);
  let logits = model.prefill(prompt, cache);
  const tokens: number[] = [];
  for (let i = 0; i < steps; i++) {
    tokens.push(argmax(logits));
    [logits] = model.decode([{ cache, token: tokens.at(-1)! }]);
  }
  model.freeCache(cache);
  return { tokens, logits };
}

async function tokensOf(ckpt: Checkpoint, opts: LlamaModelOptions, prompt: number[], steps: number) {
  const model = await LlamaModel.load(ckpt, opts);
  try {
    return { ...run(model, prompt, steps), separate: model.separateWeightBytes, fingerprint: model.numericsFingerprint };
  } finally {
    model.close();
  }
}

const PROMPT = [5, 17, 99, 42, 7, 250, 3];

describe("weight memories", () => {
  const kinds: { name: string; ckpt: () => Checkpoint; weights?: LlamaModelOptions["weights"] }[] = [
    { name: "bf16", ckpt: () => randomCheckpoint(tinyConfig({ numLayers: 4 }), 3), weights: "bf16" },
    { name: "q8_0 (quantized at load)", ckpt: () => randomCheckpoint(tinyConfig({ numLayers: 4 }), 3), weights: "q8_0" },
    { name: "q4_1 (quantized at load)", ckpt: () => randomCheckpoint(tinyConfig({ numLayers: 4 }), 3), weights: "q4_1" },
    ...(["Q4_0", "Q4_K", "Q6_K", "Q5_0"] as QuantType[]).map((t) => ({
      name: `stored ${t}`,
      ckpt: () =>
        storedCheckpoint(tinyConfig({ hiddenSize: 256, intermediateSize: 512, numHeads: 4, numKvHeads: 2, headDim: 64 }), [{ real: 0 }, { real: 1 }, { real: 2 }], () => t),
    })),
  ];
  for (const k of kinds) {
    it(`${k.name}: separate weight memories give the main memory's bits, on one and two threads`, async () => {
      const ckpt = k.ckpt();
      const main = await tokensOf(ckpt, { weights: k.weights }, PROMPT, 6);
      expect(main.separate).toBe(0);
      // Small weight memories: the matrices spread over several of them.
      const bytes = k.name.startsWith("stored") ? 512 << 10 : 160 << 10;
      for (const threads of [1, 2] as const) {
        const sep = await tokensOf(ckpt, { weights: k.weights, threads, placement: "separate", weightMemoryBytes: bytes }, PROMPT, 6);
        expect(sep.separate).toBeGreaterThan(bytes);
        expect(sep.tokens).toEqual(main.tokens);
        expect(sep.logits).toEqual(main.logits);
        expect(sep.fingerprint).toBe(main.fingerprint);
      }
    });
  }

  it("a packed image of a model in separate memories rebuilds the same model", async () => {
    const ckpt = randomCheckpoint(tinyConfig({ numLayers: 4 }), 5);
    const opts: LlamaModelOptions = { weights: "q8_0", placement: "separate", weightMemoryBytes: 160 << 10 };
    const a = await LlamaModel.load(ckpt, opts);
    const packed = a.exportPackedWeights();
    expect(packed.segments.length).toBeGreaterThan(2);
    expect(packed.format).toContain("placement=separate");
    const image = new Uint8Array(packed.segments.reduce((n, s) => n + s.length, 0));
    let at = 0;
    for (const s of packed.segments) {
      image.set(s, at);
      at += s.length;
    }
    const want = run(a, PROMPT, 5);
    a.close();
    const b = await LlamaModel.loadPacked(ckpt, image, opts);
    expect(run(b, PROMPT, 5)).toEqual(want);
    b.close();
    await expect(LlamaModel.loadPacked(ckpt, image.subarray(1), opts)).rejects.toThrow(/packs to/);
  });

  it("bad placement options are refused by name", async () => {
    const ckpt = randomCheckpoint(tinyConfig(), 1);
    await expect(LlamaModel.load(ckpt, { placement: "elsewhere" as never })).rejects.toThrow(/placement/);
    await expect(LlamaModel.load(ckpt, { placement: "separate", weightMemoryBytes: 100 })).rejects.toThrow(/weightMemoryBytes/);
  });

  it("a model whose weights do not fit the machine's free memory is refused before loading, with both numbers", async () => {
    // 64 layers of 4 x 32768 x 131072 Q8_0: about 1.2 TB, described but never read.
    const c = tinyConfig({ hiddenSize: 32768, intermediateSize: 131072, numHeads: 64, numKvHeads: 8, headDim: 512, vocabSize: 300 });
    const huge = storedCheckpoint(
      c,
      Array.from({ length: 64 }, (_, l) => ({ real: l })),
      () => "Q8_0",
    );
    const err = await LlamaModel.load(huge, {}).then(
      () => undefined,
      (e: unknown) => e as Error,
    );
    expect(err?.message).toMatch(/needs \d+ bytes for its weights .* this process can have \d+ more/);
    const [need, free] = [...err!.message.matchAll(/(\d{6,})/g)].map((m) => Number(m[1]));
    expect(need).toBeGreaterThan(1e12);
    expect(free).toBeLessThan(need);
  });

  it("more than 4 GiB of weights: real layers past 2 GiB of the first weight memory and in the second give the tokens of the real layers alone", async () => {
    // 68 layers of 64.5 MB of Q4_0 images (hidden 1024, ffn 32768): 4.39 GB of matrices.
    const c = tinyConfig({ hiddenSize: 1024, intermediateSize: 32768, numHeads: 8, numKvHeads: 2, headDim: 128, vocabSize: 300 });
    const layers: StoredLayer[] = Array.from({ length: 68 }, (_, l) => (l === 0 ? { real: 0 } : l === 40 ? { real: 1 } : l === 67 ? { real: 2 } : "zero"));
    const big = storedCheckpoint(c, layers, () => "Q4_0", 9);
    const small = storedCheckpoint(c, [{ real: 0 }, { real: 1 }, { real: 2 }], () => "Q4_0", 9);
    const want = await tokensOf(small, {}, PROMPT.slice(0, 4), 3);
    const model = await LlamaModel.load(big, {});
    try {
      expect(model.separateWeightBytes).toBeGreaterThan(4 * 2 ** 30);
      expect(model.separateWeightBytes).toBeGreaterThan(SHARED_WEIGHTS_MAX);
      const ranges = model.rt.weightRanges();
      expect(ranges.length).toBe(2);
      expect(ranges[0].end).toBeGreaterThan(4 * 2 ** 30 - 128 * 2 ** 20);
      expect(ranges[1].end).toBeGreaterThan(ranges[1].start);
      const got = run(model, PROMPT.slice(0, 4), 3);
      expect(got.tokens).toEqual(want.tokens);
      expect(got.logits).toEqual(want.logits);
    } finally {
      model.close();
    }
  }, 600_000);
});
