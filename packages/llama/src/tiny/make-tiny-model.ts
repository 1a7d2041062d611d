// Generates a small deterministic Llama, Qwen2, Qwen3 or Gemma 3 model in Hugging Face format: config,
// seeded bf16 (or f32) weights in one or more safetensors files, a byte-level BPE tokenizer trained
// on the embedded corpus, a chat template (ChatML; Qwen3's own for qwen3) and a generation config.
// Same options -> same bytes.

import { mkdirSync, readdirSync, rmSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import type { Architecture } from "../checkpoint-types.ts";
import { ConfigError } from "@airm/rm-core";
import { byteLevelTokenizerJson, trainByteLevelBpe } from "../tokenizer/byte-level-bpe.ts";
import { bf16ToF32 } from "../checkpoint/bf16-convert.ts";
import { constantBf16, seededNormalBf16 } from "./seeded-weights.ts";
import { writeSafetensors, tensorByteLength, type TensorToWrite } from "./safetensors-writer.ts";
import { QWEN3_CHAT_TEMPLATE } from "./qwen3-chat-template.ts";
import { TRAINING_CORPUS } from "./training-corpus.ts";

export const TINY_SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"] as const;

/** ChatML: `<|im_start|>role\ncontent<|im_end|>\n` per message, then the assistant header. */
export const CHATML_TEMPLATE =
  "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}{% endfor %}" +
  "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";

export interface TinyModelOptions {
  arch: Architecture;
  /** Output folder (created; files the generator writes are replaced). */
  out: string;
  layers?: number;
  hidden?: number;
  heads?: number;
  kvHeads?: number;
  /** Per-head width (default hidden / heads; qwen3 and gemma3: twice that, as Qwen3-0.6B's 128 against 1024 / 16). */
  headDim?: number;
  /** gemma3: the sliding window of its local layers (default 8; every other layer is global). */
  slidingWindow?: number;
  intermediate?: number;
  /** Vocabulary size including 3 special tokens and 256 byte tokens. */
  vocab?: number;
  seed?: number;
  /** Number of safetensors shards (1 = a single model.safetensors). */
  shards?: number;
  /** A named shape; explicit options override it. */
  preset?: "135m";
  /** Stored dtype of the weights (values are bf16-exact either way). */
  dtype?: "bf16" | "f32";
  /** Tie the LM head to the embeddings (default: qwen2 and the 135m preset yes, llama no). */
  tieEmbeddings?: boolean;
  maxPositionEmbeddings?: number;
  /** Called as tensors are written (done, total). */
  onProgress?: (done: number, total: number, name: string) => void;
}

export interface TinyModelResult {
  out: string;
  /** Files written, relative to `out`, sorted. */
  files: string[];
  config: Record<string, unknown>;
  /** Merged tokens the tokenizer learned (the rest above the bytes are fillers). */
  mergedTokens: number;
}

interface Shape {
  layers: number;
  hidden: number;
  heads: number;
  kvHeads: number;
  headDim: number;
  /** gemma3's sliding window. */
  window: number;
  intermediate: number;
  vocab: number;
  tie: boolean;
  ropeTheta: number;
  maxPositions: number;
}

const PRESETS: Record<"135m", Shape> = {
  "135m": { layers: 30, hidden: 576, heads: 9, kvHeads: 3, headDim: 64, window: 0, intermediate: 1536, vocab: 49152, tie: true, ropeTheta: 100000, maxPositions: 8192 },
};

function resolveShape(o: TinyModelOptions): Shape {
  const preset = o.preset ? PRESETS[o.preset] : undefined;
  if (o.preset && !preset) throw new ConfigError("preset", `unknown preset ${JSON.stringify(o.preset)}; known: ${Object.keys(PRESETS).join(", ")}`);
  const hidden = o.hidden ?? preset?.hidden ?? 64;
  const heads = o.heads ?? preset?.heads ?? 4;
  const shape: Shape = {
    layers: o.layers ?? preset?.layers ?? 2,
    hidden,
    heads,
    kvHeads: o.kvHeads ?? preset?.kvHeads ?? 2,
    headDim: o.headDim ?? (o.arch === "qwen3" || o.arch === "gemma3" ? 2 : 1) * (hidden / heads),
    window: o.slidingWindow ?? 8,
    intermediate: o.intermediate ?? preset?.intermediate ?? 128,
    vocab: o.vocab ?? preset?.vocab ?? 512,
    tie: o.tieEmbeddings ?? preset?.tie ?? o.arch !== "llama",
    ropeTheta: preset?.ropeTheta ?? (o.arch === "llama" ? 10000 : 1000000),
    maxPositions: o.maxPositionEmbeddings ?? preset?.maxPositions ?? 2048,
  };
  for (const [key, v] of Object.entries({
    layers: shape.layers,
    hidden: shape.hidden,
    heads: shape.heads,
    "kv-heads": shape.kvHeads,
    "head-dim": shape.headDim,
    "sliding-window": shape.window,
    intermediate: shape.intermediate,
    vocab: shape.vocab,
    "max-position": shape.maxPositions,
  })) {
    if (!Number.isInteger(v) || v <= 0) throw new ConfigError(key, `must be a positive integer, got ${v}`);
  }
  if (o.headDim === undefined && shape.hidden % shape.heads !== 0) throw new ConfigError("hidden", `${shape.hidden} is not a multiple of heads ${shape.heads}; pass --head-dim`);
  if (shape.headDim % 2 !== 0) throw new ConfigError("head-dim", `head_dim ${shape.headDim} must be even`);
  if (shape.heads % shape.kvHeads !== 0) throw new ConfigError("kv-heads", `heads ${shape.heads} is not a multiple of kv-heads ${shape.kvHeads}`);
  if (shape.vocab < TINY_SPECIAL_TOKENS.length + 256) throw new ConfigError("vocab", `must be at least ${TINY_SPECIAL_TOKENS.length + 256} (3 special tokens + 256 bytes)`);
  return shape;
}

function configJson(arch: Architecture, s: Shape): Record<string, unknown> {
  const headDim = s.headDim;
  if (arch === "qwen3") return qwen3ConfigJson(s);
  if (arch === "gemma3") return gemma3ConfigJson(s);
  if (arch === "llama") {
    return {
      architectures: ["LlamaForCausalLM"],
      attention_bias: false,
      attention_dropout: 0.0,
      bos_token_id: 1,
      eos_token_id: 2,
      head_dim: headDim,
      hidden_act: "silu",
      hidden_size: s.hidden,
      initializer_range: 0.02,
      intermediate_size: s.intermediate,
      max_position_embeddings: s.maxPositions,
      mlp_bias: false,
      model_type: "llama",
      num_attention_heads: s.heads,
      num_hidden_layers: s.layers,
      num_key_value_heads: s.kvHeads,
      pretraining_tp: 1,
      rms_norm_eps: 1e-5,
      rope_scaling: null,
      rope_theta: s.ropeTheta,
      tie_word_embeddings: s.tie,
      torch_dtype: "bfloat16",
      use_cache: true,
      vocab_size: s.vocab,
    };
  }
  return {
    architectures: ["Qwen2ForCausalLM"],
    attention_dropout: 0.0,
    bos_token_id: 1,
    eos_token_id: 2,
    hidden_act: "silu",
    hidden_size: s.hidden,
    initializer_range: 0.02,
    intermediate_size: s.intermediate,
    max_position_embeddings: s.maxPositions,
    max_window_layers: s.layers,
    model_type: "qwen2",
    num_attention_heads: s.heads,
    num_hidden_layers: s.layers,
    num_key_value_heads: s.kvHeads,
    rms_norm_eps: 1e-6,
    rope_scaling: null,
    rope_theta: s.ropeTheta,
    sliding_window: null,
    tie_word_embeddings: s.tie,
    torch_dtype: "bfloat16",
    use_cache: true,
    use_sliding_window: false,
    vocab_size: s.vocab,
  };
}

/** Keys as Qwen3-0.6B's config.json has them (transformers 4.51). */
function qwen3ConfigJson(s: Shape): Record<string, unknown> {
  return {
    architectures: ["Qwen3ForCausalLM"],
    attention_bias: false,
    attention_dropout: 0.0,
    bos_token_id: 1,
    eos_token_id: 2,
    head_dim: s.headDim,
    hidden_act: "silu",
    hidden_size: s.hidden,
    initializer_range: 0.02,
    intermediate_size: s.intermediate,
    max_position_embeddings: s.maxPositions,
    max_window_layers: s.layers,
    model_type: "qwen3",
    num_attention_heads: s.heads,
    num_hidden_layers: s.layers,
    num_key_value_heads: s.kvHeads,
    rms_norm_eps: 1e-6,
    rope_scaling: null,
    rope_theta: s.ropeTheta,
    sliding_window: null,
    tie_word_embeddings: s.tie,
    torch_dtype: "bfloat16",
    use_cache: true,
    use_sliding_window: false,
    vocab_size: s.vocab,
  };
}

/**
 * Keys as Gemma 3 270M's config.json has them (transformers 4.55), at this shape: local layers
 * (every other one global) with a window of `s.window`, local RoPE base 10000, global 1e6, and
 * query_pre_attn_scalar 24 (not head_dim, so a scale taken from head_dim shows).
 */
function gemma3ConfigJson(s: Shape): Record<string, unknown> {
  return {
    architectures: ["Gemma3ForCausalLM"],
    attention_bias: false,
    attention_dropout: 0.0,
    attn_logit_softcapping: null,
    bos_token_id: 1,
    eos_token_id: 2,
    final_logit_softcapping: null,
    head_dim: s.headDim,
    hidden_activation: "gelu_pytorch_tanh",
    hidden_size: s.hidden,
    initializer_range: 0.02,
    intermediate_size: s.intermediate,
    layer_types: Array.from({ length: s.layers }, (_, i) => ((i + 1) % 2 !== 0 ? "sliding_attention" : "full_attention")),
    max_position_embeddings: s.maxPositions,
    model_type: "gemma3_text",
    num_attention_heads: s.heads,
    num_hidden_layers: s.layers,
    num_key_value_heads: s.kvHeads,
    pad_token_id: 0,
    query_pre_attn_scalar: 24,
    rms_norm_eps: 1e-6,
    rope_local_base_freq: 10000.0,
    rope_scaling: null,
    rope_theta: s.ropeTheta,
    sliding_window: s.window,
    torch_dtype: "bfloat16",
    use_bidirectional_attention: false,
    use_cache: true,
    vocab_size: s.vocab,
  };
}

interface WeightSpec {
  name: string;
  shape: number[];
  /** Standard deviation, or a constant for norms. */
  std?: number;
  constant?: number;
  /** Added to the seeded values (norms of qwen3: 1 + noise, so a swapped or missing norm shows). */
  mean?: number;
}

function weightSpecs(arch: Architecture, s: Shape): WeightSpec[] {
  const hd = s.headDim;
  // Llama and Qwen2 norms are exactly 1 (their goldens depend on it); Qwen3's are 1 + N(0, 0.2),
  // Gemma 3's N(0, 0.2) (it multiplies by 1 + w)
  const norm = (name: string, n: number): WeightSpec =>
    arch === "qwen3" ? { name, shape: [n], std: 0.2, mean: 1 } : arch === "gemma3" ? { name, shape: [n], std: 0.2 } : { name, shape: [n], constant: 1 };
  const linear = (name: string, out: number, inp: number): WeightSpec => ({ name, shape: [out, inp], std: 1 / Math.sqrt(inp) });
  const specs: WeightSpec[] = [{ name: "model.embed_tokens.weight", shape: [s.vocab, s.hidden], std: 1 / Math.sqrt(s.hidden) }];
  for (let l = 0; l < s.layers; l++) {
    const p = `model.layers.${l}.`;
    specs.push(norm(`${p}input_layernorm.weight`, s.hidden));
    specs.push(linear(`${p}self_attn.q_proj.weight`, s.heads * hd, s.hidden));
    specs.push(linear(`${p}self_attn.k_proj.weight`, s.kvHeads * hd, s.hidden));
    specs.push(linear(`${p}self_attn.v_proj.weight`, s.kvHeads * hd, s.hidden));
    if (arch === "qwen2") {
      specs.push({ name: `${p}self_attn.q_proj.bias`, shape: [s.heads * hd], std: 0.02 });
      specs.push({ name: `${p}self_attn.k_proj.bias`, shape: [s.kvHeads * hd], std: 0.02 });
      specs.push({ name: `${p}self_attn.v_proj.bias`, shape: [s.kvHeads * hd], std: 0.02 });
    }
    if (arch === "qwen3" || arch === "gemma3") {
      specs.push(norm(`${p}self_attn.q_norm.weight`, hd));
      specs.push(norm(`${p}self_attn.k_norm.weight`, hd));
    }
    specs.push(linear(`${p}self_attn.o_proj.weight`, s.hidden, s.heads * hd));
    specs.push(norm(`${p}post_attention_layernorm.weight`, s.hidden));
    if (arch === "gemma3") {
      specs.push(norm(`${p}pre_feedforward_layernorm.weight`, s.hidden));
      specs.push(norm(`${p}post_feedforward_layernorm.weight`, s.hidden));
    }
    specs.push(linear(`${p}mlp.gate_proj.weight`, s.intermediate, s.hidden));
    specs.push(linear(`${p}mlp.up_proj.weight`, s.intermediate, s.hidden));
    specs.push(linear(`${p}mlp.down_proj.weight`, s.hidden, s.intermediate));
  }
  specs.push(norm("model.norm.weight", s.hidden));
  if (!s.tie) specs.push(linear("lm_head.weight", s.vocab, s.hidden));
  return specs;
}

function tensorBytes(spec: WeightSpec, seed: number, dtype: "bf16" | "f32"): Uint8Array {
  const count = spec.shape.reduce((a, b) => a * b, 1);
  const bf16 = spec.constant !== undefined ? constantBf16(spec.constant, count) : seededNormalBf16(seed, spec.name, count, spec.std!, spec.mean);
  if (dtype === "bf16") return bf16;
  const bits = new Uint16Array(bf16.buffer, bf16.byteOffset, count);
  const f32 = new Float32Array(count);
  for (let i = 0; i < count; i++) f32[i] = bf16ToF32(bits[i]!);
  return new Uint8Array(f32.buffer);
}

const GENERATED =
  /^(config\.json|generation_config\.json|tokenizer\.json|tokenizer_config\.json|model\.safetensors|model\.safetensors\.index\.json|model-\d{5}-of-\d{5}\.safetensors)$/;

/**
 * Writes a deterministic tiny model into `options.out` (see TinyModelOptions for defaults: 2 layers,
 * hidden 64, 4 heads, 2 KV heads, intermediate 128, vocab 512, seed 0, one shard, bf16). Files
 * from an earlier run in the folder are replaced, so the folder's bytes depend only on the
 * options. Throws ConfigError for shapes that do not fit together.
 */
export function makeTinyModel(options: TinyModelOptions): TinyModelResult {
  const arch = options.arch;
  if (!["llama", "qwen2", "qwen3", "gemma3"].includes(arch)) throw new ConfigError("arch", `must be llama, qwen2, qwen3 or gemma3, got ${JSON.stringify(arch)}`);
  const shape = resolveShape(options);
  const seed = options.seed ?? 0;
  if (!Number.isInteger(seed) || seed < 0 || seed > 0xffffffff) throw new ConfigError("seed", `must be an integer in [0, 2^32), got ${seed}`);
  const shards = options.shards ?? 1;
  const dtype = options.dtype ?? "bf16";
  if (dtype !== "bf16" && dtype !== "f32") throw new ConfigError("dtype", `must be bf16 or f32, got ${JSON.stringify(dtype)}`);
  const specs = weightSpecs(arch, shape);
  if (!Number.isInteger(shards) || shards < 1 || shards > specs.length) throw new ConfigError("shards", `must be an integer from 1 to ${specs.length} (the number of tensors)`);

  const out = options.out;
  mkdirSync(out, { recursive: true });
  for (const f of readdirSync(out)) if (GENERATED.test(f)) rmSync(join(out, f));

  const config = configJson(arch, shape);
  const bpe = trainByteLevelBpe(TRAINING_CORPUS, { vocabSize: shape.vocab, specialTokens: [...TINY_SPECIAL_TOKENS] });
  const files: string[] = [];
  const writeJson = (name: string, value: unknown) => {
    writeFileSync(join(out, name), `${JSON.stringify(value, null, 2)}\n`);
    files.push(name);
  };
  writeJson("config.json", config);
  writeJson("generation_config.json", { bos_token_id: 1, eos_token_id: [2, 0], pad_token_id: 0 });
  writeJson("tokenizer.json", byteLevelTokenizerJson(bpe));
  writeJson("tokenizer_config.json", {
    add_bos_token: false,
    add_eos_token: false,
    added_tokens_decoder: Object.fromEntries(
      TINY_SPECIAL_TOKENS.map((content, id) => [String(id), { content, lstrip: false, normalized: false, rstrip: false, single_word: false, special: true }]),
    ),
    additional_special_tokens: ["<|im_start|>", "<|im_end|>"],
    bos_token: "<|im_start|>",
    chat_template: arch === "qwen3" ? QWEN3_CHAT_TEMPLATE : CHATML_TEMPLATE,
    clean_up_tokenization_spaces: false,
    eos_token: "<|im_end|>",
    model_max_length: shape.maxPositions,
    pad_token: "<|endoftext|>",
    tokenizer_class: "GPT2Tokenizer",
    unk_token: null,
  });

  const stDtype = dtype === "bf16" ? "BF16" : "F32";
  const tensors: TensorToWrite[] = specs.map((spec) => ({ name: spec.name, dtype: stDtype, shape: spec.shape, bytes: () => tensorBytes(spec, seed, dtype) }));
  let done = 0;
  const withProgress = tensors.map((t) => ({
    ...t,
    bytes: () => {
      const b = t.bytes();
      options.onProgress?.(++done, tensors.length, t.name);
      return b;
    },
  }));
  if (shards === 1) {
    writeSafetensors(join(out, "model.safetensors"), withProgress, { format: "pt" });
    files.push("model.safetensors");
  } else {
    // Split by bytes: each shard gets consecutive tensors up to about total/shards bytes.
    const total = tensors.reduce((a, t) => a + tensorByteLength(t), 0);
    const target = total / shards;
    const groups: TensorToWrite[][] = [[]];
    let acc = 0;
    withProgress.forEach((t, i) => {
      const remainingTensors = withProgress.length - i;
      const remainingShards = shards - groups.length;
      if (groups.at(-1)!.length > 0 && (acc >= target * groups.length || remainingTensors === remainingShards) && groups.length < shards) groups.push([]);
      groups.at(-1)!.push(t);
      acc += tensorByteLength(t);
    });
    const weightMap: Record<string, string> = {};
    groups.forEach((group, s) => {
      const file = `model-${String(s + 1).padStart(5, "0")}-of-${String(shards).padStart(5, "0")}.safetensors`;
      writeSafetensors(join(out, file), group, { format: "pt" });
      for (const t of group) weightMap[t.name] = file;
      files.push(file);
    });
    writeJson("model.safetensors.index.json", { metadata: { total_size: total }, weight_map: weightMap });
  }
  return { out, files: files.sort(), config, mergedTokens: bpe.mergedCount };
}
