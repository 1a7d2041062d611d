// In-memory checkpoints with seeded random bf16 weights, for model tests that must not depend on
// the file loaders. Same (config, seed) -> same bytes in every process.
import { createHash } from "node:crypto";
import type { Checkpoint, ModelConfig, TensorInfo, TensorSource, Tokenizer } from "../../src/checkpoint-types.ts";
import { dequantToBf16 } from "../../src/checkpoint/gguf-dequant.ts";
import { quantizable, quantizeBf16Rows } from "../../src/kernels/quant-image.ts";

/** mulberry32: small, fast, deterministic. */
export function rng(seed: number): () => number {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

const f32 = new Float32Array(1);
const u32 = new Uint32Array(f32.buffer);
function toBf16(x: number): number {
  f32[0] = x;
  const b = u32[0];
  return ((b + 0x7fff + ((b >>> 16) & 1)) >>> 16) & 0xffff;
}

export function tinyConfig(over: Partial<ModelConfig> = {}): ModelConfig {
  return {
    architecture: "llama",
    hiddenSize: 64,
    intermediateSize: 136,
    numLayers: 2,
    numHeads: 4,
    numKvHeads: 2,
    headDim: 16,
    vocabSize: 300,
    rmsNormEps: 1e-5,
    ropeTheta: 10000,
    ropeScaling: null,
    maxPositionEmbeddings: 2048,
    tieWordEmbeddings: false,
    attentionBias: false,
    bosTokenId: 1,
    eosTokenIds: [2],
    ...over,
  };
}

/** A tiny Qwen2: q/k/v biases, tied embeddings, one KV head, RoPE base 1e6. */
export function tinyQwen2Config(): ModelConfig {
  return tinyConfig({ architecture: "qwen2", attentionBias: true, tieWordEmbeddings: true, numKvHeads: 1, ropeTheta: 1000000 });
}

/**
 * A tiny Gemma 3: (1 + w) norms, sandwich norms, scaled embeddings, GeGLU, attention scale from
 * query_pre_attn_scalar, and a window of 5 positions on layer 0 (local RoPE base), so prompts of
 * 17 tokens cross it.
 */
export function tinyGemma3Config(): ModelConfig {
  return tinyConfig({
    architecture: "gemma3",
    headDim: 32,
    tieWordEmbeddings: true,
    ropeTheta: 1000000,
    rmsNormEps: 1e-6,
    queryPreAttnScalar: 24,
    slidingWindow: { window: 5, layers: [true, false], ropeTheta: 10000 },
  });
}

function tensorShapes(c: ModelConfig): [string, number[]][] {
  const out: [string, number[]][] = [["model.embed_tokens.weight", [c.vocabSize, c.hiddenSize]]];
  const HD = c.numHeads * c.headDim,
    KD = c.numKvHeads * c.headDim;
  for (let l = 0; l < c.numLayers; l++) {
    const p = `model.layers.${l}.`;
    out.push([`${p}input_layernorm.weight`, [c.hiddenSize]], [`${p}post_attention_layernorm.weight`, [c.hiddenSize]]);
    out.push([`${p}self_attn.q_proj.weight`, [HD, c.hiddenSize]], [`${p}self_attn.k_proj.weight`, [KD, c.hiddenSize]], [`${p}self_attn.v_proj.weight`, [KD, c.hiddenSize]]);
    if (c.attentionBias) out.push([`${p}self_attn.q_proj.bias`, [HD]], [`${p}self_attn.k_proj.bias`, [KD]], [`${p}self_attn.v_proj.bias`, [KD]]);
    if (c.architecture === "qwen3" || c.architecture === "gemma3") out.push([`${p}self_attn.q_norm.weight`, [c.headDim]], [`${p}self_attn.k_norm.weight`, [c.headDim]]);
    if (c.architecture === "gemma3") out.push([`${p}pre_feedforward_layernorm.weight`, [c.hiddenSize]], [`${p}post_feedforward_layernorm.weight`, [c.hiddenSize]]);
    out.push([`${p}self_attn.o_proj.weight`, [c.hiddenSize, HD]]);
    out.push(
      [`${p}mlp.gate_proj.weight`, [c.intermediateSize, c.hiddenSize]],
      [`${p}mlp.up_proj.weight`, [c.intermediateSize, c.hiddenSize]],
      [`${p}mlp.down_proj.weight`, [c.hiddenSize, c.intermediateSize]],
    );
  }
  out.push(["model.norm.weight", [c.hiddenSize]]);
  if (!c.tieWordEmbeddings) out.push(["lm_head.weight", [c.vocabSize, c.hiddenSize]]);
  return out;
}

/** A TensorSource whose tensors are generated on read from (seed, tensor index). */
export function randomTensorSource(c: ModelConfig, seed: number): TensorSource {
  const shapes = tensorShapes(c);
  const index = new Map(shapes.map(([n, s], i) => [n, { s, i }]));
  const infos: TensorInfo[] = shapes.map(([name, shape]) => ({ name, dtype: "BF16", shape, file: "memory" }));
  const fill = (name: string, dst: Uint16Array): void => {
    const t = index.get(name)!;
    const r = rng(seed * 7919 + t.i * 104729 + 1);
    const n = dst.length;
    const isNorm = name.endsWith("norm.weight");
    const isBias = name.endsWith(".bias");
    const scale = t.s.length === 2 ? 1.7 / Math.sqrt(t.s[1]) : 0.1;
    for (let i = 0; i < n; i++) {
      const u = r() + r() + r() - 1.5; // roughly normal, std 0.5
      dst[i] = toBf16(isNorm ? 1 + 0.2 * u : isBias ? 0.5 * u : scale * 2 * u);
    }
  };
  return {
    list: () => infos,
    has: (n) => index.has(n),
    info(n) {
      const i = infos.find((x) => x.name === n);
      if (!i) throw new Error(`memory: tensor ${n} is missing`);
      return i;
    },
    readBf16(n, dst) {
      this.info(n);
      fill(n, dst);
    },
    sha256(n) {
      const t = index.get(n)!;
      const buf = new Uint16Array(t.s.reduce((a, b) => a * b, 1));
      fill(n, buf);
      return createHash("sha256").update(new Uint8Array(buf.buffer)).digest("hex");
    },
    close() {},
  };
}

/** Byte-per-token tokenizer for tests (ids 3..258 are bytes). */
export const byteTokenizer: Tokenizer = {
  vocabSize: 300,
  bosTokenId: 1,
  eosTokenIds: [2],
  encode: (text) => [...new TextEncoder().encode(text)].map((b) => b + 3),
  decode: (ids) => new TextDecoder().decode(new Uint8Array(ids.filter((i) => i >= 3 && i < 259).map((i) => i - 3))),
  idToToken: (id) => (id >= 3 && id < 259 ? String.fromCharCode(id - 3) : undefined),
};

/** A whole Checkpoint with random weights. */
export function randomCheckpoint(c: ModelConfig, seed = 1): Checkpoint {
  return {
    path: `memory:${seed}`,
    id: `random-${c.architecture}-${seed}`,
    config: c,
    tensors: randomTensorSource(c, seed),
    tokenizer: byteTokenizer,
    generation: { eosTokenIds: c.eosTokenIds },
    fingerprint: createHash("sha256")
      .update(JSON.stringify(c) + seed)
      .digest("hex"),
  };
}

/**
 * The same checkpoint with every matrix the quantized kernels take (rows % 4 == 0, columns % 32
 * == 0) replaced by its `type` blocks dequantised (to bf16): the weights a model loaded with
 * `weights: "q8_0" | "q4_1"` computes with, for a float64 reference of that model.
 */
export function dequantizedCheckpoint(ckpt: Checkpoint, type: "Q8_0" | "Q4_1"): Checkpoint {
  const src = ckpt.tensors;
  const tensors: TensorSource = {
    ...src,
    list: () => src.list(),
    has: (n) => src.has(n),
    info: (n) => src.info(n),
    sha256: (n) => src.sha256(n),
    close: () => src.close(),
    readBf16(name, dst) {
      src.readBf16(name, dst);
      const shape = src.info(name).shape;
      if (shape.length !== 2 || !quantizable(shape[0], shape[1])) return;
      const blocks = quantizeBf16Rows(type, dst, shape[0], shape[1]);
      dequantToBf16(type, blocks, dst.length, dst, 0);
    },
  };
  return { ...ckpt, tensors };
}
