// @airm/llama: the CPU reference model. Each half adds its own exports below.

// Checkpoint I/O: loading, tokenizers, the tiny-model generator, the model cache.
export type { Architecture, Checkpoint, ChatMessage, GenerationDefaults, ModelConfig, RopeScaling, TensorInfo, TensorSource, Tokenizer } from "./checkpoint-types.ts";
export { loadCheckpoint, type LoadCheckpointOptions } from "./checkpoint/load-checkpoint.ts";
export { checkTensors } from "./checkpoint/make-checkpoint.ts";
export { ModelLoadError } from "./checkpoint/model-load-error.ts";
export { samplingDefaults, HF_SAMPLING_KEYS, GGUF_SAMPLING_KEYS } from "./checkpoint/sampling-defaults.ts";
export { expectedTensors, type ExpectedTensor } from "./checkpoint/expected-tensors.ts";
export { modelFingerprint, canonicalJson } from "./checkpoint/fingerprint.ts";
export { f32ToBf16, bf16ToF32, f16BitsToF32 } from "./checkpoint/bf16-convert.ts";
export { HfTokenizer } from "./tokenizer/hf-tokenizer.ts";
export { makeTinyModel, type TinyModelOptions, type TinyModelResult } from "./tiny/make-tiny-model.ts";
export {
  KNOWN_MODELS,
  MODEL_CACHE_CONFIG,
  ModelPullError,
  defaultCacheDir,
  listModelCatalog,
  listModels,
  modelSource,
  pullModel,
  resolveCachedModel,
  type CachedModel,
  type KnownModel,
  type ModelListing,
  type ModelPart,
  type PullOptions,
} from "./model-cache/model-cache.ts";

// The model: wasm kernels, forward pass over explicit KV caches, sampling.
export {
  LlamaModel,
  bf16Bits,
  WEIGHTS_MODES,
  ACTIVATIONS_MODES,
  DEFAULT_ACTIVATIONS,
  SHARED_WEIGHTS_MAX,
  type LlamaModelOptions,
  type PackedImageReader,
  type PrefillOptions,
  type DecodeStep,
  type PassItem,
  type WeightPlacement,
  type WeightsMode,
  type ActivationsMode,
} from "./model/llama-model.ts";
export { PagedKVCache, type KVCache } from "./model/kv-cache.ts";
export { KVBlockPool, type KVPoolOptions, type KVPoolShape } from "./model/kv-pool.ts";
export { generate, continueGeneration, continueFromToken, type GenerateOptions, type GenerateResult } from "./model/generate.ts";
export { sample, argmax, applyTokenMask, checkLogitBias, counterUniform, tokenLogprobs, type SamplingParams, type TokenLogprobs } from "./sampling/sample.ts";
export { ropeInverseFrequencies } from "./model/rope.ts";
export { KERNEL_VERSION, NUMERICS_CHOICES } from "./kernels/assemble.ts";
export { KernelRuntime, type KernelRuntimeOptions } from "./kernels/kernel-runtime.ts";
export { interleaveRows, imageIndex } from "./kernels/weight-image.ts";

// LoRA adapters (PEFT folders, llama.cpp GGUF LoRA files) on the model: LlamaModel.loadLora / unloadLora, `lora` on pass items, decode steps and prefill.
export {
  DEFAULT_MAX_LORAS,
  DEFAULT_MAX_LORA_RANK,
  type LoadLoraOptions,
  type LoraHandle,
  type LoraOptions,
} from "./lora/lora-registry.ts";
export { LoraError } from "./lora/lora-error.ts";
export { LORA_PROJECTIONS, type LoraProjection } from "./lora/projections.ts";
export { makeTinyLora, type TinyLoraOptions } from "./tiny/make-tiny-lora.ts";
export { peftToGguf, ggufAlpha, type PeftToGgufResult } from "./lora/peft-to-gguf.ts";
