// What a LoRA adapter is once read, whatever its file format (a PEFT folder, read-adapter.ts; a
// llama.cpp GGUF file, gguf-adapter.ts): its arithmetic and each module's A and B as f32, with the
// helpers both readers share (stored values widened to f32, the fingerprint, the checkpoint
// reader's errors as LoraErrors). Knows no file layout.
import { createHash } from "node:crypto";
import { F16_TO_F32 } from "../checkpoint/bf16-convert.ts";
import { ModelLoadError } from "../checkpoint/model-load-error.ts";
import type { LoraAdapterConfig } from "./adapter-config.ts";
import { LoraError } from "./lora-error.ts";
import { LORA_PROJECTIONS, type LoraProjection } from "./projections.ts";

/** One targeted projection of one layer: A f32 [r][in] and B f32 [out][r], row-major as PEFT stores them. */
export interface LoraModuleWeights {
  layer: number;
  proj: LoraProjection;
  a: Float32Array;
  b: Float32Array;
}

export interface LoraAdapterData {
  /** The folder (PEFT) or file (GGUF) it was read from. */
  folder: string;
  config: LoraAdapterConfig;
  /** By layer, then in LORA_PROJECTIONS order (so both formats of one adapter give one fingerprint). */
  modules: LoraModuleWeights[];
  /** sha-256 hex over the arithmetic: rank, scale and every module's A and B values. */
  fingerprint: string;
}

/** The float types an adapter's A and B may be stored in: all widen to f32 exactly. */
export type LoraDtype = "F32" | "F16" | "BF16";

/**
 * `count` values of `dtype` from little-endian `bytes` as f32 (F16 and BF16 widened exactly);
 * LoraError naming `tensor` for a NaN or infinity.
 */
export function toF32(bytes: Uint8Array, dtype: LoraDtype, count: number, file: string, tensor: string): Float32Array {
  const view = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  const out = new Float32Array(count);
  if (dtype === "F32") for (let i = 0; i < count; i++) out[i] = view.getFloat32(i * 4, true);
  else if (dtype === "F16") for (let i = 0; i < count; i++) out[i] = F16_TO_F32[view.getUint16(i * 2, true)]!;
  else {
    const bits = new Uint32Array(out.buffer);
    for (let i = 0; i < count; i++) bits[i] = view.getUint16(i * 2, true) << 16;
  }
  for (let i = 0; i < count; i++) {
    if (!Number.isFinite(out[i])) throw new LoraError(file, `tensor "${tensor}" holds a non-finite value at element ${i}`, { tensor });
  }
  return out;
}

/** A checkpoint reader's error about the file (truncated, bad header) as a LoraError naming its tensor or key (or `tensor`). */
export function asLoraError(e: unknown, file: string, tensor?: string): unknown {
  if (!(e instanceof ModelLoadError)) return e;
  return new LoraError(file, e.message.startsWith(`${file}: `) ? e.message.slice(file.length + 2) : e.message, { tensor: e.item ?? tensor, cause: e });
}

/** Modules in the canonical order: by layer, then LORA_PROJECTIONS order. */
export function sortModules(modules: LoraModuleWeights[]): LoraModuleWeights[] {
  return [...modules].sort((x, y) => x.layer - y.layer || LORA_PROJECTIONS.indexOf(x.proj) - LORA_PROJECTIONS.indexOf(y.proj));
}

/** sha-256 over what the adapter computes: rank, scale, and each module's name and values. */
export function fingerprintOf(cfg: Pick<LoraAdapterConfig, "r" | "scale">, modules: LoraModuleWeights[]): string {
  const h = createHash("sha256").update(`lora r=${cfg.r} scale=${cfg.scale}\n`);
  for (const m of modules) {
    h.update(`${m.layer}.${m.proj}\n`);
    h.update(new Uint8Array(m.a.buffer, m.a.byteOffset, m.a.byteLength));
    h.update(new Uint8Array(m.b.buffer, m.b.byteOffset, m.b.byteLength));
  }
  return h.digest("hex");
}
