// Dequantises GGML tensor data (F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q4_K, Q6_K) into bf16 bits.
// Block layouts follow ggml: 32 elements per block; Q8_0 = f16 scale d + 32 int8; Q4_0 = f16 d +
// 16 bytes of nibbles (value = (q - 8) * d); Q4_1 = f16 d, f16 min m + 16 bytes (value = q * d +
// m). In each nibble byte j, the low nibble is element j and the high nibble element j + 16. The
// K-quants take 256 elements per block (see quant-image.ts for their layouts). Values are
// computed in f32 as ggml does, then rounded to bf16 (nearest even). The model keeps quantized
// blocks resident instead (quant-image.ts); this path serves `weights: "bf16"` and mixed groups.

import { convertToBf16, f16BitsToF32, f32ToBf16 } from "./bf16-convert.ts";

/** Type names this module converts. */
export const DEQUANT_TYPES = ["F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q4_K", "Q6_K"] as const;
export type DequantType = (typeof DEQUANT_TYPES)[number];

const f16Table = new Float32Array(65536);
for (let h = 0; h < 65536; h++) f16Table[h] = f16BitsToF32(h);
const fround = Math.fround;

/**
 * Converts `count` elements of `type` from `src` (starting at a block boundary) into bf16 bits
 * at `dst[dstOffset..]`. `count` must be a multiple of the block size (32, or 256 for K-quants).
 */
export function dequantToBf16(type: DequantType, src: Uint8Array, count: number, dst: Uint16Array, dstOffset: number): void {
  if (type === "F32" || type === "F16" || type === "BF16") {
    convertToBf16(type, src, 0, count, dst, dstOffset);
    return;
  }
  if (type === "Q4_K" || type === "Q6_K") {
    dequantK(type, src, count, dst, dstOffset);
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

/** Q4_K / Q6_K blocks of 256 as ggml's dequantize_row_q4_K / _q6_K compute them, to bf16. */
function dequantK(type: "Q4_K" | "Q6_K", src: Uint8Array, count: number, dst: Uint16Array, dstOffset: number): void {
  const h16 = (o: number): number => f16Table[src[o]! | (src[o + 1]! << 8)]!;
  for (let b = 0; b < count / 256; b++) {
    const out = dstOffset + b * 256;
    if (type === "Q4_K") {
      const o = b * 144;
      const d = h16(o);
      const dmin = h16(o + 2);
      const S = o + 4;
      for (let j = 0; j < 8; j++) {
        const sc = j < 4 ? src[S + j]! & 63 : (src[S + j + 4]! & 0xf) | ((src[S + j - 4]! >> 6) << 4);
        const m = j < 4 ? src[S + j + 4]! & 63 : (src[S + j + 4]! >> 4) | ((src[S + j]! >> 6) << 4);
        const d1 = fround(d * sc);
        const m1 = fround(dmin * m);
        const q = o + 16 + 32 * (j >> 1);
        for (let l = 0; l < 32; l++) dst[out + 32 * j + l] = f32ToBf16(fround(fround(d1 * (j % 2 === 0 ? src[q + l]! & 0xf : src[q + l]! >> 4)) - m1));
      }
      continue;
    }
    const o = b * 210;
    const d = h16(o + 208);
    for (let n = 0; n < 2; n++) {
      const ql = o + 64 * n;
      const qh = o + 128 + 32 * n;
      const sc = o + 192 + 8 * n;
      for (let l = 0; l < 32; l++) {
        const is = l >> 4;
        const h = src[qh + l]!;
        const q = [
          ((src[ql + l]! & 0xf) | ((h & 3) << 4)) - 32,
          ((src[ql + l + 32]! & 0xf) | (((h >> 2) & 3) << 4)) - 32,
          ((src[ql + l]! >> 4) | (((h >> 4) & 3) << 4)) - 32,
          ((src[ql + l + 32]! >> 4) | (((h >> 6) & 3) << 4)) - 32,
        ];
        for (let k = 0; k < 4; k++) dst[out + 128 * n + l + 32 * k] = f32ToBf16(fround(fround(d * ((src[sc + is + 2 * k]! << 24) >> 24)) * q[k]!));
      }
    }
  }
}
