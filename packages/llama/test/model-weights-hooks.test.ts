// The hooks the engines use: the packed weight image (artifact cache, warm start) and in-place
// per-tensor updates (delta load). Both must give exactly the bits of a fresh load.
import { createHash } from "node:crypto";
import { describe, expect, it } from "vitest";
import type { TensorSource } from "../src/checkpoint-types.ts";
import { LlamaModel } from "../src/model/llama-model.ts";
import { randomCheckpoint, randomTensorSource, tinyConfig } from "./model-helpers/random-checkpoint.ts";

const prompt = [1, 9, 200, 33, 4, 71, 71, 150];

async function fingerprintRun(m: LlamaModel): Promise<string> {
  const cache = m.newCache(24);
  const h = createHash("sha256");
  const l = m.prefill(prompt, cache);
  h.update(new Uint8Array(l.buffer));
  for (const t of [5, 6, 7]) h.update(new Uint8Array(m.decode([{ cache, token: t }])[0].buffer));
  for (let i = 0; i < m.config.numLayers; i++) h.update(cache.layerK(i)).update(cache.layerV(i));
  m.freeCache(cache);
  return h.digest("hex");
}

/** seed-1 weights, except `changed` names taken from seed 2. */
function mixedSource(config: ReturnType<typeof tinyConfig>, changed: Set<string>): TensorSource {
  const a = randomTensorSource(config, 1);
  const b = randomTensorSource(config, 2);
  return { ...a, readBf16: (n, dst) => (changed.has(n) ? b : a).readBf16(n, dst), sha256: (n) => (changed.has(n) ? b : a).sha256(n) };
}

describe.each([
  ["llama", tinyConfig()],
  ["qwen2", tinyConfig({ architecture: "qwen2", attentionBias: true, tieWordEmbeddings: true })],
])("%s", (_arch, config) => {
  it("a model rebuilt from its packed image computes the same bits, on 1 and 2 threads", async () => {
    const ckpt = randomCheckpoint(config, 1);
    const fresh = await LlamaModel.load(ckpt);
    const packed = fresh.exportPackedWeights();
    expect(packed.format).toBe(LlamaModel.packedFormat);
    const image = Buffer.concat(packed.segments.map((s) => Buffer.from(s)));
    const warm1 = await LlamaModel.loadPacked(ckpt, image);
    const warm2 = await LlamaModel.loadPacked(ckpt, image, { threads: 2 });
    try {
      const want = await fingerprintRun(fresh);
      expect(await fingerprintRun(warm1)).toBe(want);
      expect(await fingerprintRun(warm2)).toBe(want);
      await expect(LlamaModel.loadPacked(ckpt, image.subarray(0, image.length - 64))).rejects.toMatchObject({ code: "MODEL_LOAD" });
    } finally {
      fresh.close();
      warm1.close();
      warm2.close();
    }
  });

  it("updateTensor in place equals a fresh load of the changed checkpoint", async () => {
    const changed = new Set([
      "model.layers.0.self_attn.k_proj.weight",
      "model.layers.1.mlp.up_proj.weight",
      "model.layers.1.input_layernorm.weight",
      "model.embed_tokens.weight",
      ...(config.attentionBias ? ["model.layers.0.self_attn.v_proj.bias"] : ["lm_head.weight"]),
    ]);
    const next = { ...randomCheckpoint(config, 1), tensors: mixedSource(config, changed) };
    const reference = await LlamaModel.load(next);
    const model = await LlamaModel.load(randomCheckpoint(config, 1));
    try {
      const before = await fingerprintRun(model);
      for (const name of changed) model.updateTensor(name, next.tensors);
      const after = await fingerprintRun(model);
      expect(after).not.toBe(before);
      expect(after).toBe(await fingerprintRun(reference));
      expect(() => model.updateTensor("model.layers.9.mlp.up_proj.weight", next.tensors)).toThrow(expect.objectContaining({ code: "CONFIG" }));
    } finally {
      reference.close();
      model.close();
    }
  });
});
