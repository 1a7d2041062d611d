// Dequantises GGML tensor data (F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q4_K, Q6_K) into bf16 bits.
// Block layouts follow ggml: 32 elements per block; Q8_0 = f16 scale d + 32 int8; Q4_0 = f16 d +
// 16 bytes of nibbles (value = (q - 8) * d); Q4_1 = f16 d, f16 min m + 16 bytes (value = q * d +
// m). In each nibble byte j, the low nibble is element j and the high nibble element j + 16. The
// K-quants take 256 elements per block (see quant-image.ts for their layouts). Values are
// computed in f32 as ggml does, then rounded to bf16 (nearest even). The model keeps quantized
// blocks resident instead (quant-image.ts); this path serves `weights: "bf16"` and mixed groups.

import { F16_TO_F32 as f16Table, convertToBf16, f32ToBf16 } from "./bf16-convert.ts";

/** Type names this module converts. */
export const DEQUANT_TYPES = ["F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q4_K", "Q6_K"] as const;
export type DequantType = (typeof DEQUANT_TYPES)[number];

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

/**
 * One Q4_K super-block (144 bytes at `o`: f16 d, f16 dmin, 12 bytes of 6-bit (scale, min) pairs,
 * 128 nibble bytes, each 64 columns taking 32 bytes: low nibbles the first 32, high the next 32),
 * as ggml's dequantize_row_q4_K reads it: q[e] in 0..15 for the 256 columns, and per 32 columns
 * d1 = d * scale and m1 = dmin * min (f32; exact, an f16 times a 6-bit integer): w = d1 q - m1.
 */
export function decodeQ4K(src: Uint8Array, o: number, q: Uint8Array, d1: Float32Array, m1: Float32Array): void {
  const d = f16Table[src[o]! | (src[o + 1]! << 8)]!;
  const dmin = f16Table[src[o + 2]! | (src[o + 3]! << 8)]!;
  const S = o + 4;
  for (let j = 0; j < 8; j++) {
    const sc = j < 4 ? src[S + j]! & 63 : (src[S + j + 4]! & 0xf) | ((src[S + j - 4]! >> 6) << 4);
    const m = j < 4 ? src[S + j + 4]! & 63 : (src[S + j + 4]! >> 4) | ((src[S + j]! >> 6) << 4);
    d1[j] = fround(d * sc);
    m1[j] = fround(dmin * m);
    const at = o + 16 + 32 * (j >> 1);
    for (let l = 0; l < 32; l++) q[32 * j + l] = j % 2 === 0 ? src[at + l]! & 0xf : src[at + l]! >> 4;
  }
}

/**
 * One Q6_K super-block (210 bytes at `o`: 128 bytes of low nibbles, 64 of high 2-bit pairs, 16
 * int8 scales, f16 d), as ggml's dequantize_row_q6_K reads it: q[e] = the 6-bit value - 32 for
 * the 256 columns, and per 16 columns ds = d * scale (f32, exact): w = ds q.
 */
export function decodeQ6K(src: Uint8Array, o: number, q: Int8Array, ds: Float32Array): void {
  const d = f16Table[src[o + 208]! | (src[o + 209]! << 8)]!;
  for (let k = 0; k < 16; k++) ds[k] = fround(d * ((src[o + 192 + k]! << 24) >> 24));
  for (let n = 0; n < 2; n++) {
    const ql = o + 64 * n;
    const qh = o + 128 + 32 * n;
    for (let l = 0; l < 32; l++) {
      const h = src[qh + l]!;
      q[128 * n + l] = ((src[ql + l]! & 0xf) | ((h & 3) << 4)) - 32;
      q[128 * n + l + 32] = ((src[ql + l + 32]! & 0xf) | (((h >> 2) & 3) << 4)) - 32;
      q[128 * n + l + 64] = ((src[ql + l]! >> 4) | (((h >> 4) & 3) << 4)) - 32;
      q[128 * n + l + 96] = ((src[ql + l + 32]! >> 4) | (((h >> 6) & 3) << 4)) - 32;
    }
  }
}

/** Q4_K / Q6_K blocks of 256 as ggml's dequantize_row_q4_K / _q6_K compute them, to bf16. */
function dequantK(type: "Q4_K" | "Q6_K", src: Uint8Array, count: number, dst: Uint16Array, dstOffset: number): void {
  const q4 = new Uint8Array(256);
  const q6 = new Int8Array(256);
  const d = new Float32Array(16);
  const m = new Float32Array(8);
  for (let b = 0; b < count / 256; b++) {
    const out = dstOffset + b * 256;
    if (type === "Q4_K") {
      decodeQ4K(src, b * 144, q4, d, m);
      for (let e = 0; e < 256; e++) dst[out + e] = f32ToBf16(fround(fround(d[e >> 5]! * q4[e]!) - m[e >> 5]!));
    } else {
      decodeQ6K(src, b * 210, q6, d);
      for (let e = 0; e < 256; e++) dst[out + e] = f32ToBf16(fround(d[e >> 4]! * q6[e]!));
    }
  }
}
