// The slice of @airm/llama the engines run on, as structural types, and the lazy import of the
// package. Also the two optional hooks the engines light up when the model offers them: a packed
// weight image (artifact cache, warm start) and per-tensor updates (delta load). Knows nothing
// about devices or variants.

export interface CpuModelConfig {
  architecture: string;
  numLayers: number;
  numKvHeads: number;
  headDim: number;
  vocabSize: number;
}

/** Per-layer K [kv_heads, head_dim, S] and V [kv_heads, S, head_dim], bf16 (layout rngd-pd/v1). */
export interface CpuKVCache {
  readonly S: number;
  n: number;
  layerK(layer: number): Uint8Array;
  layerV(layer: number): Uint8Array;
}

export interface CpuTensorSource {
  list(): { name: string; dtype: string; shape: number[]; file: string }[];
  has(name: string): boolean;
  sha256(name: string): string;
  readBf16(name: string, dst: Uint16Array): void;
  close(): void;
}

export interface CpuCheckpoint {
  path: string;
  id: string;
  config: CpuModelConfig;
  tensors: CpuTensorSource;
  tokenizer: {
    readonly vocabSize: number;
    readonly eosTokenIds: number[];
    encode(text: string, options?: { addSpecialTokens?: boolean }): number[];
    decode(ids: number[], options?: { skipSpecialTokens?: boolean }): string;
  };
  renderChat?(messages: { role: string; content: string }[], options?: { addGenerationPrompt?: boolean }): string;
  generation: { eosTokenIds: number[] };
  fingerprint: string;
}

/**
 * The kernel-ready weight image of a loaded model (hook asked of @airm/llama): the exact bytes
 * the model keeps in its WebAssembly.Memory after converting and packing the checkpoint, as one
 * or more views (no copy), plus the id of the packing format.
 */
export interface PackedWeightImage {
  /** Packing layout + kernel version; an image is only loaded by a model that reports the same. */
  format: string;
  segments: Uint8Array[];
}

export interface CpuModel {
  readonly config: CpuModelConfig;
  readonly numericsFingerprint: string;
  newCache(S: number): CpuKVCache;
  freeCache(cache: CpuKVCache): void;
  prefill(tokens: number[], cache: CpuKVCache, options?: { onLayer?(layer: number): void }): Float32Array;
  prefillChunk(tokens: number[], cache: CpuKVCache, chunkSize: number): Float32Array;
  decode(steps: { cache: CpuKVCache; token: number }[]): Float32Array[];
  close(): void;
  /** Hook: the packed weight image (for the artifact cache). */
  exportPackedWeights?(): PackedWeightImage;
  /** Hook: re-read one tensor from `source` into the packed weights (delta load). */
  updateTensor?(name: string, source: CpuTensorSource): void;
}

export interface CpuModelClass {
  load(checkpoint: CpuCheckpoint, options?: { threads?: 1 | 2 }): Promise<CpuModel>;
  /** Hook: build a model from a packed image instead of converting the checkpoint. */
  loadPacked?(checkpoint: CpuCheckpoint, image: Uint8Array, options?: { threads?: 1 | 2 }): Promise<CpuModel>;
  /** Hook: the packing format a fresh load would produce (part of the artifact key). */
  readonly packedFormat?: string;
}

export interface LlamaModule {
  loadCheckpoint(path: string, options?: { reuseTokenizerFrom?: CpuCheckpoint }): Promise<CpuCheckpoint>;
  LlamaModel: CpuModelClass;
  sample(logits: Float32Array, params: { temperature?: number; topP?: number; topK?: number; seed?: number }, position: number): number;
}

let llamaModule: Promise<LlamaModule> | undefined;

/** Imports @airm/llama once. Throws a plain Error naming the missing export when the package lacks one. */
export function importLlama(): Promise<LlamaModule> {
  llamaModule ??= (import("@airm/llama" as string) as Promise<Record<string, unknown>>).then((m) => {
    for (const name of ["loadCheckpoint", "LlamaModel", "sample"]) {
      if (!(name in m)) throw new Error(`@airm/llama does not export ${name}; the engines need loadCheckpoint, LlamaModel and sample`);
    }
    return m as unknown as LlamaModule;
  });
  llamaModule.catch(() => (llamaModule = undefined));
  return llamaModule;
}

/** True when the model class and instance offer the packed-image hooks. */
export function supportsPackedImage(cls: CpuModelClass, model?: CpuModel): boolean {
  return typeof cls.loadPacked === "function" && typeof cls.packedFormat === "string" && (!model || typeof model.exportPackedWeights === "function");
}

/** True when the model can update one tensor in place. */
export function supportsTensorUpdate(model: CpuModel): boolean {
  return typeof model.updateTensor === "function";
}
