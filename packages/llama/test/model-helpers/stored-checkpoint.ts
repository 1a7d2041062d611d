// In-memory checkpoints whose matrices are stored GGUF blocks (read with readStored, as from a
// GGUF file), some layers of them all zeros. A zero layer adds exactly 0 to the residual stream
// (its o_proj and down_proj are zero: every product is +-0), so a model with zero layers between
// its real ones gives the same bits as the model of the real layers alone: tests use it to put
// real weights at any address, past 4 GiB included, and still know the right answer.
import { createHash } from "node:crypto";
import type { Checkpoint, ModelConfig, TensorInfo, TensorSource } from "../../src/checkpoint-types.ts";
import { byteTokenizer, rng } from "./random-checkpoint.ts";
import { type QuantType, randomBlocks } from "./quant-blocks.ts";

const BLOCK: Record<QuantType, { n: number; bytes: number }> = {
  Q8_0: { n: 32, bytes: 34 },
  Q4_0: { n: 32, bytes: 18 },
  Q4_1: { n: 32, bytes: 20 },
  Q4_K: { n: 256, bytes: 144 },
  Q6_K: { n: 256, bytes: 210 },
  Q5_0: { n: 32, bytes: 22 },
  Q5_1: { n: 32, bytes: 24 },
  Q5_K: { n: 256, bytes: 176 },
  Q3_K: { n: 256, bytes: 110 },
  IQ4_NL: { n: 32, bytes: 18 },
  IQ4_XS: { n: 256, bytes: 136 },
  MXFP4: { n: 32, bytes: 17 },
};

/** Each layer is a real one (weights seeded by `real`, its ordinal among the real layers) or zero. */
export type StoredLayer = { real: number } | "zero";

/**
 * A checkpoint of `c` (numLayers = layers.length) whose matrices are `type(name)` blocks: random
 * for the real layers, the embedding and the LM head (seeded by `seed` and the real ordinal, not
 * the layer index), zero for zero layers; norms are random bf16 around 1.
 */
export function storedCheckpoint(c: ModelConfig, layers: StoredLayer[], type: (name: string) => QuantType, seed = 1): Checkpoint {
  const cfg = { ...c, numLayers: layers.length, tieWordEmbeddings: false, attentionBias: false };
  const HD = cfg.numHeads * cfg.headDim;
  const KD = cfg.numKvHeads * cfg.headDim;
  const shapes: [string, number[], string][] = [["model.embed_tokens.weight", [cfg.vocabSize, cfg.hiddenSize], "embed"]];
  layers.forEach((L, l) => {
    const p = `model.layers.${l}.`;
    const key = L === "zero" ? "zero" : `real${L.real}`;
    shapes.push([`${p}input_layernorm.weight`, [cfg.hiddenSize], `${key}.in`], [`${p}post_attention_layernorm.weight`, [cfg.hiddenSize], `${key}.post`]);
    shapes.push([`${p}self_attn.q_proj.weight`, [HD, cfg.hiddenSize], `${key}.q`], [`${p}self_attn.k_proj.weight`, [KD, cfg.hiddenSize], `${key}.k`]);
    shapes.push([`${p}self_attn.v_proj.weight`, [KD, cfg.hiddenSize], `${key}.v`], [`${p}self_attn.o_proj.weight`, [cfg.hiddenSize, HD], `${key}.o`]);
    shapes.push(
      [`${p}mlp.gate_proj.weight`, [cfg.intermediateSize, cfg.hiddenSize], `${key}.gate`],
      [`${p}mlp.up_proj.weight`, [cfg.intermediateSize, cfg.hiddenSize], `${key}.up`],
    );
    shapes.push([`${p}mlp.down_proj.weight`, [cfg.hiddenSize, cfg.intermediateSize], `${key}.down`]);
  });
  shapes.push(["model.norm.weight", [cfg.hiddenSize], "final"], ["lm_head.weight", [cfg.vocabSize, cfg.hiddenSize], "head"]);
  const byName = new Map(shapes.map(([name, shape, key]) => [name, { shape, key }]));
  const infos: TensorInfo[] = shapes.map(([name, shape]) => ({ name, shape, dtype: shape.length === 2 ? type(name) : "BF16", file: "memory" }));
  const seedOf = (key: string): number => createHash("sha256").update(`${seed}/${key}`).digest().readUInt32LE(0);
  const get = (name: string) => {
    const t = byName.get(name);
    if (!t) throw new Error(`memory: tensor ${name} is missing`);
    return t;
  };
  const stored = (name: string): Uint8Array => {
    const { shape, key } = get(name);
    const t = type(name);
    if (key.startsWith("zero.")) return new Uint8Array((shape[0] * shape[1] * BLOCK[t].bytes) / BLOCK[t].n);
    return randomBlocks(t, shape[0], shape[1], rng(seedOf(key)));
  };
  const tensors: TensorSource = {
    list: () => infos,
    has: (n) => byName.has(n),
    info(n) {
      get(n);
      return infos.find((i) => i.name === n)!;
    },
    readBf16(name, dst) {
      const { shape, key } = get(name);
      if (shape.length !== 1) throw new Error(`memory: ${name} is stored as blocks; read it with readStored`);
      const r = rng(seedOf(key));
      const f = new Float32Array(1);
      const u = new Uint32Array(f.buffer);
      for (let i = 0; i < dst.length; i++) {
        f[0] = 1 + 0.2 * (r() - 0.5);
        dst[i] = u[0] >>> 16;
      }
    },
    readStored: stored,
    sha256: (name) =>
      createHash("sha256")
        .update(`${seed}/${get(name).key}`)
        .digest("hex"),
    close() {},
  };
  return {
    path: `memory:stored-${seed}`,
    id: `stored-${seed}-${layers.map((L) => (L === "zero" ? "z" : L.real)).join("")}`,
    config: cfg,
    tensors,
    tokenizer: byteTokenizer,
    generation: { eosTokenIds: cfg.eosTokenIds },
    fingerprint: createHash("sha256")
      .update(JSON.stringify(cfg) + seed + JSON.stringify(layers))
      .digest("hex"),
  };
}
