// Dequantises GGML tensor data (F32, F16, BF16, Q8_0, Q4_0, Q4_1) into bf16 bits. Block layouts
// follow ggml: 32 elements per block; Q8_0 = f16 scale d + 32 int8; Q4_0 = f16 d + 16 bytes of
// nibbles (value = (q - 8) * d); Q4_1 = f16 d, f16 min m + 16 bytes (value = q * d + m). In each
// nibble byte j, the low nibble is element j and the high nibble element j + 16. Values are
// computed in f32 as ggml does, then rounded to bf16 (nearest even).

import { convertToBf16, f16BitsToF32, f32ToBf16 } from "./bf16-convert.ts";

/** Type names this module converts. */
export const DEQUANT_TYPES = ["F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1"] as const;
export type DequantType = (typeof DEQUANT_TYPES)[number];

const f16Table = new Float32Array(65536);
for (let h = 0; h < 65536; h++) f16Table[h] = f16BitsToF32(h);
const fround = Math.fround;

/**
 * Converts `count` elements of `type` from `src` (starting at a block boundary) into bf16 bits
 * at `dst[dstOffset..]`. `count` must be a multiple of 32 for the block types.
 */
export function dequantToBf16(type: DequantType, src: Uint8Array, count: number, dst: Uint16Array, dstOffset: number): void {
  if (type === "F32" || type === "F16" || type === "BF16") {
    convertToBf16(type, src, 0, count, dst, dstOffset);
    return;
  }
  const view = new DataView(src.buffer, src.byteOffset, src.byteLength);
  const blocks = count / 32;
  if (type === "Q8_0") {
    for (let b = 0; b < blocks; b++) {
      const base = b * 34;
      const d = f16Table[view.getUint16(base, true)]!;
      const out = dstOffset + b * 32;
      for (let j = 0; j < 32; j++) dst[out + j] = f32ToBf16(fround(view.getInt8(base + 2 + j) * d));
    }
  } else if (type === "Q4_0") {
    // 16 possible values per block: convert each once, then look nibbles up.
    const table = new Uint16Array(16);
    for (let b = 0; b < blocks; b++) {
      const base = b * 18;
      const d = f16Table[view.getUint16(base, true)]!;
      for (let q = 0; q < 16; q++) table[q] = f32ToBf16(fround((q - 8) * d));
      const out = dstOffset + b * 32;
      for (let j = 0; j < 16; j++) {
        const q = src[base + 2 + j]!;
        dst[out + j] = table[q & 0x0f]!;
        dst[out + j + 16] = table[q >> 4]!;
      }
    }
  } else {
    const table = new Uint16Array(16);
    for (let b = 0; b < blocks; b++) {
      const base = b * 20;
      const d = f16Table[view.getUint16(base, true)]!;
      const m = f16Table[view.getUint16(base + 2, true)]!;
      for (let q = 0; q < 16; q++) table[q] = f32ToBf16(fround(fround(q * d) + m));
      const out = dstOffset + b * 32;
      for (let j = 0; j < 16; j++) {
        const q = src[base + 4 + j]!;
        dst[out + j] = table[q & 0x0f]!;
        dst[out + j + 16] = table[q >> 4]!;
      }
    }
  }
}
