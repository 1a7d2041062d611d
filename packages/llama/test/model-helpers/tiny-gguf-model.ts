// A generated tiny model (make-tiny, Llama or Qwen2) as a GGUF file llama.cpp loads: the metadata
// convert_hf_to_gguf.py writes for these architectures, the byte-level BPE tokenizer as
// tokenizer.ggml.* arrays, and every tensor in F32 (bf16-exact values, so our bf16 image of them
// is exact and llama.cpp multiplies f32 by f32), q/k rows permuted for llama as its converter does.
import { readFileSync } from "node:fs";
import { join } from "node:path";
import type { ModelConfig } from "../../src/checkpoint-types.ts";
import { bf16ToF32 } from "../../src/checkpoint/bf16-convert.ts";
import { hfTensorName } from "../../src/checkpoint/gguf-checkpoint.ts";
import { loadCheckpoint } from "../../src/checkpoint/load-checkpoint.ts";
import { CHATML_TEMPLATE, makeTinyModel } from "../../src/tiny/make-tiny-model.ts";
import { TYPE_IDS, f32, type GgufTensor, i32s, type MetaValue, permuteForGguf, str, strs, u32, writeGguf } from "../fixtures/io/gguf-writer.ts";

export interface TinyGguf {
  /** The Hugging Face folder it was made from. */
  hfDir: string;
  gguf: string;
  config: ModelConfig;
}

const LAYER_PARTS = ["attn_norm", "attn_q", "attn_k", "attn_v", "attn_output", "ffn_norm", "ffn_gate", "ffn_up", "ffn_down"];

/** GGUF name of every Hugging Face tensor name of `config` (the inverse of hfTensorName). */
function ggufNames(config: ModelConfig): Map<string, string> {
  const names = ["token_embd.weight", "output_norm.weight", "output.weight"];
  for (let l = 0; l < config.numLayers; l++) for (const p of LAYER_PARTS) names.push(`blk.${l}.${p}.weight`, `blk.${l}.${p}.bias`);
  return new Map(names.map((g) => [hfTensorName(g, config.architecture), g]));
}

/** The model's hyperparameters and tokenizer as GGUF metadata. */
function metadataOf(config: ModelConfig, hfDir: string): Record<string, MetaValue> {
  const a = config.architecture;
  const tok = JSON.parse(readFileSync(join(hfDir, "tokenizer.json"), "utf8"));
  const vocab = Object.entries(tok.model.vocab as Record<string, number>)
    .sort((x, y) => x[1] - y[1])
    .map(([t]) => t);
  return {
    "general.architecture": str(a),
    "general.name": str(`tiny-${a}`),
    [`${a}.block_count`]: u32(config.numLayers),
    [`${a}.context_length`]: u32(config.maxPositionEmbeddings),
    [`${a}.embedding_length`]: u32(config.hiddenSize),
    [`${a}.feed_forward_length`]: u32(config.intermediateSize),
    [`${a}.attention.head_count`]: u32(config.numHeads),
    [`${a}.attention.head_count_kv`]: u32(config.numKvHeads),
    [`${a}.rope.freq_base`]: f32(config.ropeTheta),
    [`${a}.attention.layer_norm_rms_epsilon`]: f32(config.rmsNormEps),
    [`${a}.vocab_size`]: u32(config.vocabSize),
    "tokenizer.ggml.model": str("gpt2"),
    "tokenizer.ggml.pre": str("gpt-2"),
    "tokenizer.ggml.tokens": strs(vocab),
    "tokenizer.ggml.token_type": i32s(vocab.map((_, id) => (id < 3 ? 3 : 1))),
    "tokenizer.ggml.merges": strs((tok.model.merges as [string, string][]).map(([x, y]) => `${x} ${y}`)),
    "tokenizer.ggml.bos_token_id": u32(1),
    "tokenizer.ggml.eos_token_id": u32(2),
    "tokenizer.ggml.padding_token_id": u32(0),
    "tokenizer.chat_template": str(CHATML_TEMPLATE),
  };
}

/** Writes a make-tiny `arch` model under `dir` (hf/ and model.gguf); same arguments, same bytes. */
export async function tinyGgufModel(arch: "llama" | "qwen2", dir: string, seed = 0): Promise<TinyGguf> {
  const hfDir = join(dir, "hf");
  makeTinyModel({ arch, out: hfDir, layers: 2, hidden: 64, heads: 4, kvHeads: 2, intermediate: 128, vocab: 400, seed, dtype: "f32" });
  const hf = await loadCheckpoint(hfDir);
  try {
    const c = hf.config;
    const names = ggufNames(c);
    const tensors: GgufTensor[] = hf.tensors.list().map((t) => {
      const n = t.shape.reduce((x, y) => x * y, 1);
      const raw = new Uint16Array(n);
      hf.tensors.readBf16(t.name, raw);
      let values: Float32Array = Float32Array.from(raw, bf16ToF32);
      const rows = t.shape[0]!;
      const heads = c.architecture !== "llama" ? 0 : t.name.includes("q_proj.") ? c.numHeads : t.name.includes("k_proj.") ? c.numKvHeads : 0;
      if (heads) values = permuteForGguf(values, rows, n / rows, heads);
      const gguf = names.get(t.name);
      if (!gguf) throw new Error(`no GGUF name for ${t.name}`);
      return { name: gguf, dims: [...t.shape].reverse(), typeId: TYPE_IDS.F32, data: new Uint8Array(values.buffer) };
    });
    const gguf = join(dir, "model.gguf");
    writeGguf(gguf, { metadata: metadataOf(c, hfDir), tensors });
    return { hfDir, gguf, config: c };
  } finally {
    hf.tensors.close();
  }
}
