// The engine contract the vendor engines implement and the worker calls: rm-core's first-draft
// `Engine` extended with decode (B streams per step), KV export/import in layout rngd-pd/v1,
// variant swap and partial weight updates. Structurally compatible with rm-core's Engine, so a
// value of EngineV2 is also an Engine. Kept here until rm-core adopts it; plain types only.

import type {
  DeviceInfo,
  Engine,
  EngineLoadOptions,
  EngineVariant,
  KVBlobs,
  ModelInfo,
  PrefillResult,
  SamplingParams,
} from "@airm/rm-core";

/** A request's KV as the engine holds it: resident on the card (rngd) or host memory (atom). */
export interface KVStream {
  readonly id: string;
  /** Compiled context of the stream's cache. */
  readonly seqLen: number;
  /** Tokens whose K/V are in the cache (positions [0, length)). */
  readonly length: number;
  /** Where the cache lives: `device` (resident, decode reads it in place) or `host` (an input of every step). */
  readonly residence: "device" | "host";
}

export interface PrefillOptionsV2 {
  /** Context S of the variant to run (from pickVariant); also the S of the returned KV. */
  seqLen: number;
  sampling?: SamplingParams;
  /**
   * Called once per layer, in order, as soon as that layer's K and V for the whole prompt are
   * final. `k`/`v` are layer blobs in layout rngd-pd/v1 ([kv_heads, head_dim, S] and
   * [kv_heads, S, head_dim], bf16), the same arrays the result's `kv` holds (they stay valid).
   * Compute does not wait for a returned promise; prefill resolves after all of them settle
   * and rejects with the first rejection.
   */
  onLayer?(layer: number, k: Uint8Array, v: Uint8Array): void | Promise<void>;
  /** Keep the cache as a decode stream in this engine (solo role) and return it. */
  keepStream?: boolean;
}

export interface PrefillResultV2 extends PrefillResult {
  /** Present when `keepStream` was set. */
  stream?: KVStream;
  /** Wall time of the prefill itself (ms), without waiting on onLayer promises. */
  computeMs: number;
}

export interface DecodeStep {
  stream: KVStream;
  /** The token to append at position `stream.length`. */
  token: number;
  sampling?: SamplingParams;
}

export interface SwapResult {
  from: EngineVariant;
  to: EngineVariant;
  /** True when the variant had to be compiled (prepared) first. */
  compiled: boolean;
  ms: number;
}

export interface DeltaResult {
  /** `tensors`: only changed tensors were uploaded; `full-reload`: the plan required a reload. */
  mode: "tensors" | "full-reload" | "none";
  changedTensors: string[];
  uploadBytes: number;
  totalBytes: number;
  /** The new model fingerprint. */
  modelFingerprint: string;
  reason: string | null;
  ms: number;
}

export interface EngineStats {
  variant: EngineVariant;
  streams: number;
  /** Bytes of KV held by live streams. */
  kvBytes: number;
  /** Bytes of KV all live streams could hold at most (for kv_cache_usage_perc). */
  kvCapacityBytes: number;
  /** How the weights got ready at load: `artifact-cache` (warm), `converted` (cold) or `native`. */
  weightsFrom: "artifact-cache" | "converted" | "native";
  loadMs: number;
}

/** The text side the worker needs (it never loads the checkpoint itself). */
export interface EngineTokenizer {
  readonly vocabSize: number;
  readonly eosTokenIds: number[];
  encode(text: string, options?: { addSpecialTokens?: boolean }): number[];
  decode(ids: number[], options?: { skipSpecialTokens?: boolean }): string;
  renderChat?(messages: { role: string; content: string }[], options?: { addGenerationPrompt?: boolean }): string;
}

/** rm-core's Engine plus decode, KV exchange, swap and delta. */
export interface EngineV2 extends Engine {
  readonly model: ModelInfo;
  readonly device: DeviceInfo;
  readonly tokenizer: EngineTokenizer;
  /** The variant new requests run on. */
  readonly activeVariant: EngineVariant;
  prefill(tokens: number[], options: PrefillOptionsV2): Promise<PrefillResultV2>;
  /**
   * One decode step for up to B streams (more are run in groups of B): appends each step's token
   * and returns the next token of each stream, in order. Throws ContextOverflowError when a stream
   * is full, KVIntegrityError for a released stream.
   */
  decode(steps: DecodeStep[]): Promise<number[]>;
  /** Adopts KV from another process (layout rngd-pd/v1). Throws KVIntegrityError on a shape mismatch. */
  importKV(kv: KVBlobs): KVStream;
  /** A host copy of a stream's KV in layout rngd-pd/v1. */
  exportKV(stream: KVStream): KVBlobs;
  /** Frees a stream. Idempotent. */
  release(stream: KVStream): void;
  /** Makes `variant` active, keeping the weights resident; compiles (prepares) it when new. */
  swap(variant: EngineVariant): Promise<SwapResult>;
  /** Updates the weights to the checkpoint in `modelDir`, uploading only tensors whose bytes changed. */
  applyDelta(modelDir: string): Promise<DeltaResult>;
  stats(): EngineStats;
}

export interface EngineLoadOptionsV2 extends EngineLoadOptions {
  /** Compiled variants; default from AIRM_VARIANTS or every default batch at seqLen. */
  variants?: EngineVariant[];
}

export interface EnginePluginV2 {
  readonly kind: "engine";
  readonly name: string;
  load(options: EngineLoadOptionsV2): Promise<EngineV2>;
}
