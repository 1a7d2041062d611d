// Test-side reading of PEFT adapter files, independent of src/lora: the safetensors header parsed
// here, F32/BF16 values decoded here, and the merged weights W + scale * B A (float64) that a
// LoRA-adapted projection computes, for the float64 reference forward pass.
import { readFileSync } from "node:fs";
import { join } from "node:path";
import type { TensorToWrite } from "../../src/tiny/safetensors-writer.ts";
import { bf16ToF32 } from "./reference-math.ts";

/** The adapter's tensors as stored, in file order. */
export function storedTensors(dir: string): TensorToWrite[] {
  const buf = readFileSync(join(dir, "adapter_model.safetensors"));
  const n = Number(buf.readBigUInt64LE(0));
  const header = JSON.parse(buf.subarray(8, 8 + n).toString("utf8")) as Record<string, { dtype: "F32" | "BF16"; shape: number[]; data_offsets: [number, number] }>;
  return Object.entries(header)
    .filter(([name]) => name !== "__metadata__")
    .map(([name, t]) => ({ name, dtype: t.dtype, shape: t.shape, bytes: () => buf.subarray(8 + n + t.data_offsets[0], 8 + n + t.data_offsets[1]) }));
}

/** Every tensor's values (F32 or BF16) as float64, by PEFT name. */
function adapterValues(dir: string): Map<string, { shape: number[]; values: Float64Array }> {
  const out = new Map<string, { shape: number[]; values: Float64Array }>();
  for (const t of storedTensors(dir)) {
    const b = t.bytes();
    const view = new DataView(b.buffer, b.byteOffset, b.byteLength);
    const count = t.shape.reduce((x, y) => x * y, 1);
    const values = new Float64Array(count);
    for (let i = 0; i < count; i++) values[i] = t.dtype === "F32" ? view.getFloat32(i * 4, true) : bf16ToF32(view.getUint16(i * 2, true));
    out.set(t.name, { shape: t.shape, values });
  }
  return out;
}

/**
 * The weight getter of a model with the adapter in `dir` merged at `scale`: for each adapted
 * projection `X.weight` (PEFT's `base_model.model.X.lora_A.weight` / `lora_B.weight`),
 * W + scale * B A in float64; every other tensor as `base` gives it.
 */
export function mergedWeights(base: (name: string) => Float64Array, dir: string, scale: number): (name: string) => Float64Array {
  const values = adapterValues(dir);
  return (name: string) => {
    const w = base(name);
    const prefix = `base_model.model.${name.replace(/\.weight$/, "")}`;
    const a = values.get(`${prefix}.lora_A.weight`);
    const b = values.get(`${prefix}.lora_B.weight`);
    if (!a || !b) return w;
    const [r, cols] = a.shape;
    const rows = b.shape[0];
    const merged = Float64Array.from(w);
    for (let o = 0; o < rows; o++) {
      for (let j = 0; j < r; j++) {
        const bo = scale * b.values[o * r + j];
        for (let i = 0; i < cols; i++) merged[o * cols + i] += bo * a.values[j * cols + i];
      }
    }
    return merged;
  };
}
