// Loading an engine's weights on the CPU reference model: warm from the packed image in the
// artifact cache when there is one (read straight into the model's memories, then CRC-checked),
// else converted from the checkpoint (cold) and the image stored for next time. Knows the
// artifact cache and the model's packed format; nothing of serving.

import { performance } from "node:perf_hooks";
import type { EngineStats } from "@airm/rm-core";
import { type ArtifactCache, artifactKey } from "./artifact-cache.ts";
import type { CpuActivationsMode, CpuCheckpoint, CpuModel, CpuWeightsMode, LlamaModule } from "./cpu-model.ts";

export interface WeightsLoadOptions {
  threads: 1 | 2;
  weights?: CpuWeightsMode;
  activations?: CpuActivationsMode;
  /** Positions per KV block of the model's pool. */
  blockSize?: number;
  /** LoRA limits of the model (adapters resident at once, largest rank); unset: the model's defaults, no adapter loaded. */
  lora?: { maxLoras?: number; maxLoraRank?: number };
}

export interface LoadedWeights {
  model: CpuModel;
  weightsFrom: EngineStats["weightsFrom"];
  loadMs: number;
  /** Why the artifact cache was not used, when it was not. */
  cacheNote: string;
}

const PACKED_KIND = "packed-weights";

/**
 * Loads the model for `ckpt`: from the packed image in `cache` when it exists (warm), else by
 * converting the checkpoint (cold), then stores the image.
 */
export async function loadWeights(llama: LlamaModule, ckpt: CpuCheckpoint, weightsFingerprint: string, cache: ArtifactCache | null, o: WeightsLoadOptions): Promise<LoadedWeights> {
  const { threads, activations, lora } = o;
  const weights = o.weights ?? "auto";
  const kv = o.blockSize ? { blockSize: o.blockSize } : undefined;
  const cls = llama.LlamaModel;
  const format = cls.packedFormatFor(weights, "auto", activations);
  const t0 = performance.now();
  if (!cache) {
    const model = await cls.load(ckpt, { threads, weights, activations, kv, lora });
    return { model, weightsFrom: "converted", loadMs: performance.now() - t0, cacheNote: "artifact cache disabled" };
  }
  const key = artifactKey({ kind: PACKED_KIND, weightsFingerprint, variant: null, kernelVersion: format });
  // Read straight into the model's memories; the CRC-32 is checked once all of it is in.
  const reader = cache.reader(key);
  let note = "";
  if (reader) {
    try {
      const model = await cls.loadPacked(ckpt, reader, { threads, weights, activations, kv, lora });
      if (reader.verify()) return { model, weightsFrom: "artifact-cache", loadMs: performance.now() - t0, cacheNote: `warm: ${key.slice(0, 12)}` };
      model.close();
      note = `; the stored image ${key.slice(0, 12)} failed its CRC-32 and was removed`;
    } finally {
      reader.close();
    }
  }
  const model = await cls.load(ckpt, { threads, weights, activations, kv, lora });
  const loadMs = performance.now() - t0;
  const packed = model.exportPackedWeights();
  if (packed.format !== format) {
    return {
      model,
      weightsFrom: "converted",
      loadMs,
      cacheNote: `packed format ${packed.format} != LlamaModel.packedFormatFor(${weights}, auto, ${activations}) ${format}; not stored`,
    };
  }
  try {
    cache.write({ kind: PACKED_KIND, weightsFingerprint, variant: null, kernelVersion: packed.format }, packed.segments);
  } catch (e) {
    // A read-only or full cache folder costs the next warm start, not this load.
    return { model, weightsFrom: "converted", loadMs, cacheNote: `cold; could not store the image in ${cache.dir}: ${(e as Error).message}` };
  }
  return { model, weightsFrom: "converted", loadMs, cacheNote: `cold: stored ${key.slice(0, 12)}${note}` };
}
