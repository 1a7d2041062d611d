// Turns a Hugging Face config.json (+ generation_config.json) into our ModelConfig. Knows the
// Llama and Qwen2 field names; leaves tensors and tokenizers to others.

import type { Architecture, GenerationDefaults, ModelConfig, RopeScaling } from "../checkpoint-types.ts";
import { ModelLoadError } from "./model-load-error.ts";

const ARCHITECTURES: Record<string, Architecture> = {
  LlamaForCausalLM: "llama",
  Qwen2ForCausalLM: "qwen2",
};

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

function num(raw: Json, key: string, file: string, fallback: number): number {
  const v = raw[key];
  if (v === undefined || v === null) return fallback;
  if (typeof v !== "number" || !Number.isFinite(v)) throw new ModelLoadError(file, `"${key}" must be a number, got ${JSON.stringify(v)}`, { item: key });
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

function ropeScaling(raw: unknown, file: string): RopeScaling | null {
  if (raw === undefined || raw === null) return null;
  if (typeof raw !== "object") throw new ModelLoadError(file, `"rope_scaling" must be an object or null`, { item: "rope_scaling" });
  const r = raw as Json;
  const kind = r.rope_type ?? r.type;
  if (kind === "default") return null;
  if (kind !== "llama3") {
    throw new ModelLoadError(file, `rope_scaling type ${JSON.stringify(kind)} is not supported; supported is "llama3" (or none)`, { item: "rope_scaling" });
  }
  const scaling: RopeScaling = {
    type: "llama3",
    factor: num(r, "factor", file, NaN),
    lowFreqFactor: num(r, "low_freq_factor", file, NaN),
    highFreqFactor: num(r, "high_freq_factor", file, NaN),
    originalMaxPositionEmbeddings: int(r, "original_max_position_embeddings", file),
  };
  for (const [key, value] of [
    ["factor", scaling.factor],
    ["low_freq_factor", scaling.lowFreqFactor],
    ["high_freq_factor", scaling.highFreqFactor],
  ] as const) {
    if (!Number.isFinite(value) || value <= 0) throw new ModelLoadError(file, `rope_scaling.${key} must be a positive number`, { item: `rope_scaling.${key}` });
  }
  return scaling;
}

/**
 * Parses a config.json object. Architecture comes from `architectures[0]` (falling back to
 * `model_type`). Throws ModelLoadError naming `file` and the key for anything missing, malformed or
 * unsupported (an architecture other than LlamaForCausalLM / Qwen2ForCausalLM).
 */
export function parseHfConfig(raw: unknown, file: string): ModelConfig {
  if (typeof raw !== "object" || raw === null || Array.isArray(raw)) throw new ModelLoadError(file, `is not a JSON object`);
  const c = raw as Json;
  const archNames = Array.isArray(c.architectures) ? (c.architectures as unknown[]) : [];
  const archName = typeof archNames[0] === "string" ? (archNames[0] as string) : undefined;
  let architecture: Architecture | undefined;
  if (archName !== undefined) architecture = ARCHITECTURES[archName];
  else if (c.model_type === "llama" || c.model_type === "qwen2") architecture = c.model_type;
  if (!architecture) {
    throw new ModelLoadError(file, `architecture ${JSON.stringify(archName ?? c.model_type ?? null)} is not supported; supported are ${Object.keys(ARCHITECTURES).join(", ")}`, {
      item: "architectures",
    });
  }
  const hiddenSize = int(c, "hidden_size", file);
  const numHeads = int(c, "num_attention_heads", file);
  const numKvHeads = int(c, "num_key_value_heads", file, numHeads);
  if (numHeads % numKvHeads !== 0)
    throw new ModelLoadError(file, `num_attention_heads ${numHeads} is not a multiple of num_key_value_heads ${numKvHeads}`, { item: "num_key_value_heads" });
  if (c.head_dim === undefined && hiddenSize % numHeads !== 0)
    throw new ModelLoadError(file, `hidden_size ${hiddenSize} is not a multiple of num_attention_heads ${numHeads} and there is no head_dim`, { item: "head_dim" });
  const headDim = int(c, "head_dim", file, hiddenSize / numHeads);
  if (headDim % 2 !== 0) throw new ModelLoadError(file, `head_dim ${headDim} must be even for rotary embeddings`, { item: "head_dim" });
  const maxPositionEmbeddings = int(c, "max_position_embeddings", file, 2048);
  const bos = tokenIdList(c.bos_token_id, file, "bos_token_id");
  return {
    architecture,
    hiddenSize,
    intermediateSize: int(c, "intermediate_size", file),
    numLayers: int(c, "num_hidden_layers", file),
    numHeads,
    numKvHeads,
    headDim,
    vocabSize: int(c, "vocab_size", file),
    rmsNormEps: num(c, "rms_norm_eps", file, 1e-6),
    ropeTheta: num(c, "rope_theta", file, 10000),
    ropeScaling: ropeScaling(c.rope_scaling, file),
    maxPositionEmbeddings,
    tieWordEmbeddings: c.tie_word_embeddings === true,
    attentionBias: architecture === "qwen2" ? true : c.attention_bias === true,
    bosTokenId: bos[0] ?? null,
    eosTokenIds: tokenIdList(c.eos_token_id, file, "eos_token_id"),
  };
}

/**
 * Generation defaults from generation_config.json (may be undefined) merged with the config's eos:
 * eos ids are the union, generation_config's first.
 */
export function parseGenerationConfig(raw: unknown, file: string, config: ModelConfig): GenerationDefaults {
  const g = (raw ?? {}) as Json;
  const eos = [...tokenIdList(g.eos_token_id, file, "eos_token_id")];
  for (const id of config.eosTokenIds) if (!eos.includes(id)) eos.push(id);
  const out: GenerationDefaults = { eosTokenIds: eos };
  if (typeof g.temperature === "number") out.temperature = g.temperature;
  if (typeof g.top_p === "number") out.topP = g.top_p;
  if (typeof g.top_k === "number") out.topK = g.top_k;
  return out;
}
