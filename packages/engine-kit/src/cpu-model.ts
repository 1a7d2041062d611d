// The slice of @airm/llama the engines run on, with the package's own types: checkpoints, the
// model with its KV caches, packed weight images (artifact cache, warm start), per-tensor updates
// (delta load), the sampler, the checkpoint's sampling defaults and LoRA adapter handles. Knows
// nothing about devices or variants.

import {
  LlamaModel,
  applyTokenMask,
  checkLogitBias,
  loadCheckpoint,
  sample,
  tokenLogprobs,
  type Checkpoint,
  type KVCache,
  type LoraHandle,
  type TensorSource,
  type WeightsMode,
  type ActivationsMode,
} from "@airm/llama";

export { samplingDefaults } from "@airm/llama";

export type CpuCheckpoint = Checkpoint;
export type CpuKVCache = KVCache;
export type CpuTensorSource = TensorSource;
export type CpuModel = LlamaModel;
export type CpuWeightsMode = WeightsMode;
export type CpuActivationsMode = ActivationsMode;
/** A LoRA adapter loaded into the CPU model (LlamaModel.loadLora): what pass items name. */
export type CpuLoraHandle = LoraHandle;

/** The kernel-ready weight image of a loaded model: the bytes it keeps in its wasm memory, as views. */
export type PackedWeightImage = ReturnType<LlamaModel["exportPackedWeights"]>;

/** What the engines call in @airm/llama. */
export interface LlamaModule {
  loadCheckpoint: typeof loadCheckpoint;
  LlamaModel: typeof LlamaModel;
  sample: typeof sample;
  tokenLogprobs: typeof tokenLogprobs;
  applyTokenMask: typeof applyTokenMask;
  checkLogitBias: typeof checkLogitBias;
}

export const LLAMA: LlamaModule = { loadCheckpoint, LlamaModel, sample, tokenLogprobs, applyTokenMask, checkLogitBias };
