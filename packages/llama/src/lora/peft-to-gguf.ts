// Converts a PEFT LoRA folder into llama.cpp's GGUF LoRA format (what convert_lora_to_gguf.py
// writes with its default --outtype f32): general.architecture of the base model, general.type
// "adapter", adapter.type "lora", adapter.lora.alpha, and per module lora_a (GGUF dims [in, r])
// and lora_b ([r, out], q/k rows in llama.cpp's rope order for the llama architecture), all F32.
// The folder is read and checked exactly as loadLora reads it, and the alpha written is the f32
// whose alpha / r is the folder's scale (so rsLoRA, which llama.cpp's converter does not know,
// keeps its scale): the file computes the folder's bits, here and in llama.cpp, whenever an f32
// alpha gives that scale (always without rsLoRA for an alpha that is an f32, as PEFT's are).
import { statSync } from "node:fs";
import { basename, resolve } from "node:path";
import type { ModelConfig } from "../checkpoint-types.ts";
import { traitsOf } from "../checkpoint/architecture-traits.ts";
import { permuteRows } from "../checkpoint/gguf-checkpoint.ts";
import { f32, type GgufTensor, type MetaValue, str, u32, writeGguf } from "../checkpoint/gguf-writer.ts";
import type { LoraModuleWeights } from "./adapter-data.ts";
import { GGUF_LORA_KEYS, ggufLoraTensorName, permutedHeads } from "./gguf-adapter.ts";
import { LoraError } from "./lora-error.ts";
import { projectionShape } from "./projections.ts";
import { readLoraAdapter } from "./read-adapter.ts";

const fr = Math.fround;
const GGML_F32 = 0;
/** llama_ftype ALL_F32, what convert_lora_to_gguf.py records for --outtype f32. */
const FILE_TYPE_ALL_F32 = 0;

export interface PeftToGgufResult {
  out: string;
  r: number;
  /** adapter.lora.alpha as written (f32). */
  alpha: number;
  /** The folder's scale (alpha / r, or alpha / sqrt(r) with rsLoRA). */
  scale: number;
  /** Whether the file's f32 alpha / r is that scale bit for bit (see ggufAlpha; false: one f32 step off). */
  exactScale: boolean;
  /** GGUF tensors written (two per module). */
  tensors: number;
}

/** The f32 next to `x` towards +infinity (`dir` 1) or -infinity (-1). */
function nextF32(x: number, dir: 1 | -1): number {
  const f = new Float32Array([x]);
  const bits = new Int32Array(f.buffer);
  if (x === 0) bits[0] = dir === 1 ? 1 : -2147483647;
  else bits[0]! += x > 0 === (dir === 1) ? 1 : -1;
  return f[0]!;
}

/**
 * The f32 alpha for which llama.cpp's f32 `alpha / r` is `scale`: `hint` (the folder's lora_alpha)
 * when it gives it, else f32(scale * r) or the nearest f32 neighbour that gives it. Some scales no
 * f32 alpha gives (alpha / r steps over them when r is no power of two: rsLoRA with r 3, say): then
 * the alpha whose alpha / r is nearest, and `exact` false. LoraError naming lora_alpha for a zero
 * scale (llama.cpp reads adapter.lora.alpha 0 as "no alpha", scale 1).
 */
export function ggufAlpha(scale: number, r: number, file: string, hint?: number): { alpha: number; exact: boolean } {
  if (scale === 0) throw new LoraError(file, "lora_alpha: 0 zeroes the update, and llama.cpp reads adapter.lora.alpha 0 as scale 1", { field: "lora_alpha" });
  const gives = (a: number) => Math.abs(fr(a / r) - scale);
  if (hint !== undefined && fr(hint) !== 0 && gives(fr(hint)) === 0) return { alpha: fr(hint), exact: true };
  let best = fr(scale * r);
  let up = best;
  let down = best;
  for (let i = 0; i < 8 && gives(best) !== 0; i++) {
    up = nextF32(up, 1);
    down = nextF32(down, -1);
    for (const a of [up, down]) if (gives(a) < gives(best)) best = a;
  }
  return { alpha: best, exact: gives(best) === 0 };
}

/** The bytes of f32 values. */
const bytesOf = (v: Float32Array): Uint8Array => new Uint8Array(v.buffer, v.byteOffset, v.byteLength);

/** A module's two GGUF tensors: A as stored ([r][in] is GGUF [in, r]), B [out][r] with its q/k rows permuted as llama.cpp's converter does. */
function moduleTensors(m: LoraModuleWeights, model: ModelConfig, r: number): GgufTensor[] {
  const s = projectionShape(model, m.proj);
  let b = m.b;
  const heads = permutedHeads(model, m.proj);
  if (heads !== undefined) {
    b = new Float32Array(m.b.length);
    permuteRows(bytesOf(m.b), new Uint8Array(b.buffer), s.out, r * 4, heads);
  }
  return [
    { name: ggufLoraTensorName(m.layer, m.proj, "A"), dims: [s.in, r], typeId: GGML_F32, data: bytesOf(m.a) },
    { name: ggufLoraTensorName(m.layer, m.proj, "B"), dims: [r, s.out], typeId: GGML_F32, data: bytesOf(b) },
  ];
}

/**
 * Writes the PEFT adapter in `folder` (for a base model of config `baseConfig`) as a llama.cpp GGUF
 * LoRA file `outFile`. Throws LoraError for a folder loadLora would refuse (any rank is accepted
 * here), naming the key or tensor.
 */
export function peftToGguf(folder: string, outFile: string, baseConfig: ModelConfig): PeftToGgufResult {
  if (!statSync(folder, { throwIfNoEntry: false })?.isDirectory())
    throw new LoraError(folder, "is not a folder: the converter reads a PEFT folder (adapter_config.json + adapter_model.safetensors)");
  const data = readLoraAdapter(folder, baseConfig, { maxRank: Number.MAX_SAFE_INTEGER, baseModelNames: [] });
  const { r, scale } = data.config;
  const { alpha, exact } = ggufAlpha(scale, r, folder, data.config.useRslora ? undefined : data.config.alpha);
  const metadata: Record<string, MetaValue> = {
    [GGUF_LORA_KEYS.architecture]: str(traitsOf(baseConfig).ggufName),
    [GGUF_LORA_KEYS.type]: str("adapter"),
    "general.name": str(basename(resolve(folder))),
    "general.file_type": u32(FILE_TYPE_ALL_F32),
    [GGUF_LORA_KEYS.adapterType]: str("lora"),
    [GGUF_LORA_KEYS.alpha]: f32(alpha),
  };
  const tensors = data.modules.flatMap((m) => moduleTensors(m, baseConfig, r));
  writeGguf(outFile, { metadata, tensors });
  return { out: outFile, r, alpha, scale, exactScale: exact, tensors: tensors.length };
}
