// Turns a Hugging Face config.json (+ generation_config.json) into our ModelConfig, as
// transformers 4.x and 5.x write them (rope_scaling / rope_parameters, torch_dtype / dtype). Knows
// the Llama, Qwen2 and Qwen3 field names and their documented defaults; refuses what it does not
// implement. Leaves tensors and tokenizers to others.

import { basename } from "node:path";
import type { Architecture, GenerationDefaults, ModelConfig, RopeScaling } from "../checkpoint-types.ts";
import { ARCHITECTURE_TRAITS } from "./architecture-traits.ts";
import { GEMMA3_DEFAULTS, gemma3Config } from "./gemma3-config.ts";
import { ModelLoadError } from "./model-load-error.ts";
import { HF_SAMPLING_KEYS, samplingDefaultsOf } from "./sampling-defaults.ts";

const ARCHITECTURES: Record<string, Architecture> = Object.fromEntries(
  (Object.entries(ARCHITECTURE_TRAITS) as [Architecture, { hfClass: string }][]).map(([arch, t]) => [t.hfClass, arch]),
);

type Json = Record<string, unknown>;

function int(raw: Json, key: string, file: string, fallback?: number): number {
  const v = raw[key];
  if (v === undefined || v === null) {
    if (fallback !== undefined) return fallback;
    throw new ModelLoadError(file, `missing required key "${key}"`, { item: key });
  }
  if (typeof v !== "number" || !Number.isInteger(v) || v <= 0) throw new ModelLoadError(file, `"${key}" must be a positive integer, got ${JSON.stringify(v)}`, { item: key });
  return v;
}

/** Token ids from an int, a list of ints, or null/absent (empty list). */
export function tokenIdList(v: unknown, file: string, key: string): number[] {
  if (v === undefined || v === null) return [];
  const list = Array.isArray(v) ? v : [v];
  for (const id of list) {
    if (typeof id !== "number" || !Number.isInteger(id) || id < 0)
      throw new ModelLoadError(file, `"${key}" must be a token id or a list of them, got ${JSON.stringify(v)}`, { item: key });
  }
  return list as number[];
}

/**
 * What each architecture takes for a key its config.json leaves out: transformers' own defaults
 * (LlamaConfig, Qwen2Config and the RoPE mixin of transformers 5; the same values as 4.x). Keys
 * that set a shape (hidden_size, heads, layers, vocab) have no default here: they are required.
 */
export const ARCHITECTURE_DEFAULTS: Record<Architecture, { rms_norm_eps: number; rope_theta: number; max_position_embeddings: number; tie_word_embeddings: boolean }> = {
  llama: { rms_norm_eps: 1e-6, rope_theta: 10000, max_position_embeddings: 2048, tie_word_embeddings: false },
  qwen2: { rms_norm_eps: 1e-6, rope_theta: 10000, max_position_embeddings: 32768, tie_word_embeddings: false },
  qwen3: { rms_norm_eps: 1e-6, rope_theta: 10000, max_position_embeddings: 32768, tie_word_embeddings: false },
  gemma3: { rms_norm_eps: 1e-6, rope_theta: GEMMA3_DEFAULTS.rope_theta, max_position_embeddings: 131072, tie_word_embeddings: true },
};

/** model_type values that name an architecture under another spelling. */
const MODEL_TYPES: Record<string, Architecture> = { gemma3_text: "gemma3" };

/** Qwen3Config's head_dim when config.json has none (a class default, not hidden_size / heads). */
const QWEN3_DEFAULT_HEAD_DIM = 128;

/** RoPE types this engine computes; anything else in a config is refused. */
export const SUPPORTED_ROPE_TYPES = ["default", "llama3"] as const;

/** Keys of a rope dict each type reads (besides the type itself); any other key is refused. */
const ROPE_KEYS: Record<(typeof SUPPORTED_ROPE_TYPES)[number], string[]> = {
  default: ["rope_theta"],
  llama3: ["rope_theta", "factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"],
};

/** A positive finite number at `where.key`; anything else is refused naming it. */
function positive(r: Json, key: string, file: string, where: string): number {
  const v = r[key];
  if (typeof v !== "number" || !Number.isFinite(v) || v <= 0)
    throw new ModelLoadError(file, `${where}.${key} must be a positive number, got ${JSON.stringify(v)}`, { item: `${where}.${key}` });
  return v;
}

/**
 * RoPE as transformers 5 resolves it: `rope_parameters` (5.x) or `rope_scaling` (4.x) gives the
 * type (`rope_type`, or the older `type`; "default" when absent) and its parameters; the theta is
 * the dict's `rope_theta`, else the top-level `rope_theta` (4.x), else the architecture's default.
 */
function resolveRope(c: Json, file: string, architecture: Architecture, defaulted: string[]): { ropeTheta: number; ropeScaling: RopeScaling | null } {
  const key = c.rope_parameters !== undefined && c.rope_parameters !== null ? "rope_parameters" : "rope_scaling";
  const raw = c[key];
  if (raw !== undefined && raw !== null && (typeof raw !== "object" || Array.isArray(raw))) throw new ModelLoadError(file, `"${key}" must be an object or null`, { item: key });
  const r = (raw ?? {}) as Json;
  const typeKey = r.rope_type !== undefined ? "rope_type" : "type";
  const kind = r[typeKey] ?? "default";
  if (!SUPPORTED_ROPE_TYPES.includes(kind as never)) {
    throw new ModelLoadError(file, `${key}.${typeKey} ${JSON.stringify(kind)} is not supported; supported are ${SUPPORTED_ROPE_TYPES.map((t) => `"${t}"`).join(", ")}`, {
      item: `${key}.${typeKey}`,
    });
  }
  const type = kind as (typeof SUPPORTED_ROPE_TYPES)[number];
  for (const k of Object.keys(r)) {
    if (k === "rope_type" || k === "type" || ROPE_KEYS[type].includes(k)) continue;
    throw new ModelLoadError(file, `${key}.${k} is not read by this engine for rope type "${type}" (it would change the rotary frequencies); remove it or use a supported model`, {
      item: `${key}.${k}`,
    });
  }
  if (c.partial_rotary_factor !== undefined && c.partial_rotary_factor !== null && c.partial_rotary_factor !== 1) {
    throw new ModelLoadError(file, `partial_rotary_factor ${JSON.stringify(c.partial_rotary_factor)} is not supported (every head dimension is rotated here)`, {
      item: "partial_rotary_factor",
    });
  }
  let ropeTheta: number;
  if (r.rope_theta !== undefined) ropeTheta = positive(r, "rope_theta", file, key);
  else if (c.rope_theta !== undefined && c.rope_theta !== null) ropeTheta = positive(c, "rope_theta", file, "config");
  else {
    ropeTheta = ARCHITECTURE_DEFAULTS[architecture].rope_theta;
    defaulted.push("rope_theta");
  }
  if (type === "default") return { ropeTheta, ropeScaling: null };
  const orig = r.original_max_position_embeddings;
  if (typeof orig !== "number" || !Number.isInteger(orig) || orig <= 0) {
    throw new ModelLoadError(file, `${key}.original_max_position_embeddings must be a positive integer, got ${JSON.stringify(orig)}`, {
      item: `${key}.original_max_position_embeddings`,
    });
  }
  return {
    ropeTheta,
    ropeScaling: {
      type: "llama3",
      factor: positive(r, "factor", file, key),
      lowFreqFactor: positive(r, "low_freq_factor", file, key),
      highFreqFactor: positive(r, "high_freq_factor", file, key),
      originalMaxPositionEmbeddings: orig,
    },
  };
}

/** A number key, or the architecture's default (noted in `defaulted`). */
function numOrDefault(c: Json, key: "rms_norm_eps", file: string, architecture: Architecture, defaulted: string[]): number {
  if (c[key] === undefined || c[key] === null) {
    defaulted.push(key);
    return ARCHITECTURE_DEFAULTS[architecture][key];
  }
  return positive(c, key, file, "config");
}

function bool(c: Json, key: string, file: string, fallback: boolean, defaulted: string[]): boolean {
  const v = c[key];
  if (v === undefined || v === null) {
    defaulted.push(key);
    return fallback;
  }
  if (typeof v !== "boolean") throw new ModelLoadError(file, `"${key}" must be true or false, got ${JSON.stringify(v)}`, { item: key });
  return v;
}

/** Refuses what changes the arithmetic and is not implemented here: other activations, MLP bias, sliding windows, quantized weights. */
function refuseUnimplemented(c: Json, file: string, architecture: Architecture): void {
  if (architecture === "gemma3") return; // gemma3-config.ts has its own (activation, window, soft-capping)
  const act = c.hidden_act ?? c.hidden_activation;
  if (act !== undefined && act !== "silu")
    throw new ModelLoadError(file, `hidden_act ${JSON.stringify(act)} is not supported; this engine computes SiLU (silu)`, { item: "hidden_act" });
  // nanotron-exported configs (SmolLM2) say how q/k pairs are laid out; only the rotate-half layout is computed here.
  if (c.rope_interleaved === true)
    throw new ModelLoadError(file, `rope_interleaved true is not supported (rotary pairs are the two halves of a head here)`, { item: "rope_interleaved" });
  if (c.mlp_bias === true) throw new ModelLoadError(file, `mlp_bias true is not supported (the MLP projections here have no bias)`, { item: "mlp_bias" });
  if (c.quantization_config !== undefined && c.quantization_config !== null) {
    throw new ModelLoadError(file, `quantization_config is not read by this loader (it reads bf16/f16/f32 safetensors); dequantise the model or use its GGUF file`, {
      item: "quantization_config",
    });
  }
  if (c.use_sliding_window === true)
    throw new ModelLoadError(file, `use_sliding_window true is not supported (every layer attends to the whole context here)`, { item: "use_sliding_window" });
  if (Array.isArray(c.layer_types)) {
    const other = (c.layer_types as unknown[]).find((t) => t !== "full_attention");
    if (other !== undefined) throw new ModelLoadError(file, `layer_types contains ${JSON.stringify(other)}; only "full_attention" layers are supported`, { item: "layer_types" });
  }
  if (architecture === "llama" && typeof c.sliding_window === "number") {
    throw new ModelLoadError(file, `sliding_window is not supported for llama (every layer attends to the whole context here)`, { item: "sliding_window" });
  }
}

/**
 * head_dim: the key, else hidden_size / heads (Llama, Qwen2), else Qwen3Config's class default
 * of 128 (noted in `defaulted`): transformers reads `config.head_dim`, which Qwen3Config always has.
 */
function resolveHeadDim(c: Json, file: string, architecture: Architecture, hiddenSize: number, numHeads: number, defaulted: string[]): number {
  const absent = c.head_dim === undefined || c.head_dim === null;
  const classDefault = architecture === "qwen3" ? QWEN3_DEFAULT_HEAD_DIM : architecture === "gemma3" ? GEMMA3_DEFAULTS.head_dim : undefined;
  if (absent && classDefault !== undefined) defaulted.push("head_dim");
  if (absent && classDefault === undefined && hiddenSize % numHeads !== 0)
    throw new ModelLoadError(file, `hidden_size ${hiddenSize} is not a multiple of num_attention_heads ${numHeads} and there is no head_dim`, { item: "head_dim" });
  const headDim = int(c, "head_dim", file, classDefault ?? hiddenSize / numHeads);
  if (headDim % 2 !== 0) throw new ModelLoadError(file, `head_dim ${headDim} must be even for rotary embeddings`, { item: "head_dim" });
  return headDim;
}

/**
 * Biases on q/k/v: Qwen2 always has them (no key); Llama reads attention_bias (default false);
 * Qwen3's and Gemma 3's attention_bias would also put a bias on o_proj, which is not computed here: refused.
 */
function resolveAttentionBias(c: Json, file: string, architecture: Architecture, defaulted: string[]): boolean {
  if (architecture === "qwen2") return true;
  const bias = bool(c, "attention_bias", file, false, defaulted);
  if (bias && architecture !== "llama")
    throw new ModelLoadError(file, `attention_bias true is not supported for ${architecture} (it adds an o_proj bias this engine does not compute)`, { item: "attention_bias" });
  return bias;
}

/** The stored dtype the config names (`dtype` in transformers 5, `torch_dtype` in 4.x), or null. */
function storedDtype(c: Json, file: string): ModelConfig["storedDtype"] | null {
  const key = c.dtype !== undefined && c.dtype !== null ? "dtype" : "torch_dtype";
  const v = c[key];
  if (v === undefined || v === null) return null;
  if (v !== "bfloat16" && v !== "float16" && v !== "float32")
    throw new ModelLoadError(file, `${key} ${JSON.stringify(v)} is not supported; supported are bfloat16, float16, float32`, { item: key });
  return v;
}

/**
 * Parses a config.json object as transformers 4.x or 5.x writes it. Architecture comes from
 * `architectures[0]` (else `model_type`). Every field that changes the arithmetic is read or taken
 * from the architecture's documented default (ARCHITECTURE_DEFAULTS; the keys taken so are pushed
 * onto `defaulted`), and what is not implemented is refused. Throws ModelLoadError naming `file`
 * and the key for anything missing, malformed or unsupported.
 */
export function parseHfConfig(raw: unknown, file: string, defaulted: string[] = []): ModelConfig {
  if (typeof raw !== "object" || raw === null || Array.isArray(raw)) throw new ModelLoadError(file, `is not a JSON object`);
  const c = raw as Json;
  const archNames = Array.isArray(c.architectures) ? (c.architectures as unknown[]) : [];
  const archName = typeof archNames[0] === "string" ? (archNames[0] as string) : undefined;
  let architecture: Architecture | undefined;
  if (archName !== undefined) architecture = ARCHITECTURES[archName];
  else if (typeof c.model_type === "string") architecture = MODEL_TYPES[c.model_type] ?? (c.model_type in ARCHITECTURE_TRAITS ? (c.model_type as Architecture) : undefined);
  if (!architecture) {
    throw new ModelLoadError(file, `architecture ${JSON.stringify(archName ?? c.model_type ?? null)} is not supported; supported are ${Object.keys(ARCHITECTURES).join(", ")}`, {
      item: "architectures",
    });
  }
  refuseUnimplemented(c, file, architecture);
  const hiddenSize = int(c, "hidden_size", file);
  const numHeads = int(c, "num_attention_heads", file);
  // Llama's default is the head count; Qwen2Config's and Qwen3Config's dataclass default (32) would be a guess: required.
  const numKvHeads = architecture === "llama" ? int(c, "num_key_value_heads", file, numHeads) : int(c, "num_key_value_heads", file);
  if (numHeads % numKvHeads !== 0)
    throw new ModelLoadError(file, `num_attention_heads ${numHeads} is not a multiple of num_key_value_heads ${numKvHeads}`, { item: "num_key_value_heads" });
  const headDim = resolveHeadDim(c, file, architecture, hiddenSize, numHeads, defaulted);
  const defaults = ARCHITECTURE_DEFAULTS[architecture];
  if (c.max_position_embeddings === undefined || c.max_position_embeddings === null) defaulted.push("max_position_embeddings");
  const maxPositionEmbeddings = int(c, "max_position_embeddings", file, defaults.max_position_embeddings);
  const rmsNormEps = numOrDefault(c, "rms_norm_eps", file, architecture, defaulted);
  const layers = int(c, "num_hidden_layers", file);
  const rope = architecture === "gemma3" ? gemma3Config(c, file, layers, defaulted) : resolveRope(c, file, architecture, defaulted);
  const tieWordEmbeddings = bool(c, "tie_word_embeddings", file, defaults.tie_word_embeddings, defaulted);
  const attentionBias = resolveAttentionBias(c, file, architecture, defaulted);
  const bos = tokenIdList(c.bos_token_id, file, "bos_token_id");
  const dtype = storedDtype(c, file);
  return {
    architecture,
    hiddenSize,
    intermediateSize: int(c, "intermediate_size", file),
    numLayers: layers,
    numHeads,
    numKvHeads,
    headDim,
    vocabSize: int(c, "vocab_size", file),
    rmsNormEps,
    ...rope,
    maxPositionEmbeddings,
    tieWordEmbeddings,
    attentionBias,
    bosTokenId: bos[0] ?? null,
    eosTokenIds: tokenIdList(c.eos_token_id, file, "eos_token_id"),
    ...(dtype ? { storedDtype: dtype } : {}),
  };
}

/**
 * Generation defaults from generation_config.json (undefined: no such file) merged with the
 * config's eos: eos ids are the union, generation_config's first. The sampling defaults are the
 * keys vLLM's --generation-config auto takes (see samplingDefaultsOf), as the file writes them.
 */
export function parseGenerationConfig(raw: unknown, file: string, config: ModelConfig): GenerationDefaults {
  const g = (raw ?? {}) as Json;
  const eos = [...tokenIdList(g.eos_token_id, file, "eos_token_id")];
  for (const id of config.eosTokenIds) if (!eos.includes(id)) eos.push(id);
  if (raw === undefined || raw === null) return { eosTokenIds: eos };
  return { eosTokenIds: eos, ...samplingDefaultsOf((k) => g[k], HF_SAMPLING_KEYS, { from: basename(file) }) };
}
