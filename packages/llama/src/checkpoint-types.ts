// The seam between checkpoint loading (config, tensors, tokenizer, chat template) and the model
// that runs on the wasm kernels. Loaders (HF folders, GGUF, the tiny-model generator's output)
// produce a Checkpoint; the model consumes one by Hugging Face tensor names.

import type { ChatTool, ChatTurn, VocabularyType } from "@airm/rm-core";

export type { ChatTool, VocabularyType };

export type Architecture = "llama" | "qwen2" | "qwen3" | "gemma3";

export type RopeScaling =
  | {
      /** Llama 3.1 style frequency scaling (a Hugging Face config's rope_scaling). */
      type: "llama3";
      factor: number;
      lowFreqFactor: number;
      highFreqFactor: number;
      originalMaxPositionEmbeddings: number;
    }
  | {
      /**
       * Per-pair divisors of the inverse frequencies, as GGUF files carry Llama 3.1 scaling (the
       * f32 tensor `rope_freqs.weight`, head_dim / 2 values; llama.cpp divides by them too).
       */
      type: "freq_factors";
      factors: number[];
    };

export interface ModelConfig {
  architecture: Architecture;
  hiddenSize: number;
  intermediateSize: number;
  numLayers: number;
  numHeads: number;
  numKvHeads: number;
  headDim: number;
  vocabSize: number;
  rmsNormEps: number;
  ropeTheta: number;
  ropeScaling: RopeScaling | null;
  maxPositionEmbeddings: number;
  tieWordEmbeddings: boolean;
  /** Bias on q/k/v projections (Qwen2). */
  attentionBias: boolean;
  bosTokenId: number | null;
  eosTokenIds: number[];
  /**
   * Interleaved local attention (Gemma 3): the layers marked true in `layers` attend only the last
   * `window` positions and rotate with `ropeTheta` (the local base); the others attend the whole
   * context with the config's ropeTheta. Absent: every layer attends the whole context.
   */
  slidingWindow?: { window: number; layers: boolean[]; ropeTheta: number };
  /** Attention scores are scaled by 1 / sqrt(this) (Gemma 3's query_pre_attn_scalar); absent: head_dim. */
  queryPreAttnScalar?: number;
  /** The dtype config.json says the weights were saved in (`dtype` / `torch_dtype`), when it says. Weights run as bf16 regardless. */
  storedDtype?: "bfloat16" | "float16" | "float32";
}

export interface TensorInfo {
  /** Hugging Face name, e.g. `model.layers.3.self_attn.q_proj.weight`. */
  name: string;
  /** Source dtype as stored: BF16, F16, F32 (GGUF adds Q8_0, Q4_0, Q4_1, Q4_K, Q6_K). */
  dtype: string;
  /** Row-major shape as in the HF checkpoint ([out, in] for linear weights). */
  shape: number[];
  /** The file it lives in (for error messages). */
  file: string;
}

export interface TensorSource {
  list(): TensorInfo[];
  has(name: string): boolean;
  /** Throws ModelLoadError naming the file and the tensor when it is missing. */
  info(name: string): TensorInfo;
  /** Converts the tensor to bf16 and writes all of it into `dst` (length = product of shape). */
  readBf16(name: string, dst: Uint16Array): void;
  /**
   * The tensor's bytes as stored (GGUF block types such as Q8_0, Q4_1), rows in the Hugging Face
   * order, for models that keep the blocks; absent on sources that only convert.
   */
  readStored?(name: string): Uint8Array;
  /** sha-256 hex of the tensor's stored bytes (for fingerprints and delta plans). */
  sha256(name: string): string;
  close(): void;
}

/** A chat turn (the contract's ChatTurn: role, content, tool calls or the call a tool answers). */
export type ChatMessage = ChatTurn;

export interface Tokenizer {
  readonly vocabSize: number;
  readonly bosTokenId: number | null;
  readonly eosTokenIds: number[];
  /** Ids of `text`; `addSpecialTokens` adds BOS etc. as the tokenizer's post-processor says. */
  encode(text: string, options?: { addSpecialTokens?: boolean }): number[];
  decode(ids: number[], options?: { skipSpecialTokens?: boolean }): string;
  /** The token string of an id, or undefined. */
  idToToken(id: number): string | undefined;
  /** The bytes one token stands for (a byte-level token may be part of a UTF-8 character). */
  tokenBytes?(id: number): Uint8Array;
  /** Token strings by id and how they spell bytes (for a grammar engine). */
  vocabulary?(): { tokens: string[]; type: VocabularyType };
}

/**
 * What the checkpoint says about generation: its end-of-sequence ids, and the sampling defaults it
 * recommends (generation_config.json, or a GGUF's general.sampling.* keys), in the ranges of the
 * request fields they stand for (top_k -1 or 0: off).
 */
export interface GenerationDefaults {
  eosTokenIds: number[];
  temperature?: number;
  topP?: number;
  topK?: number;
  minP?: number;
  repetitionPenalty?: number;
  /** Where the sampling defaults were looked for ("generation_config.json", "GGUF metadata"); unset: nowhere (no such file). */
  samplingFrom?: string;
  /** Sampling keys present but unusable (wrong type or out of range), left out: `key=value (why)`. */
  samplingIgnored?: string[];
}

export interface Checkpoint {
  /** Folder or file it came from. */
  path: string;
  /** A short model id, e.g. the folder name. */
  id: string;
  config: ModelConfig;
  tensors: TensorSource;
  tokenizer: Tokenizer;
  /** Renders chat messages with the checkpoint's template; undefined when it has none. */
  renderChat?(messages: ChatMessage[], options?: { addGenerationPrompt?: boolean; tools?: ChatTool[] }): string;
  generation: GenerationDefaults;
  /** sha-256 hex over config and every tensor's bytes. */
  fingerprint: string;
  /** config.json keys that were absent and took the architecture's documented default (e.g. "rms_norm_eps"). */
  configDefaults?: string[];
}
