// Dequantises GGML tensor data (F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL, MXFP4 and the
// K-quants Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_XS) into bf16 bits.
// Block layouts follow ggml: 32 elements per block; Q8_0 = f16 scale d + 32 int8; Q4_0 = f16 d +
// 16 bytes of nibbles (value = (q - 8) * d); Q4_1 = f16 d, f16 min m + 16 bytes (value = q * d +
// m). In each nibble byte j, the low nibble is element j and the high nibble element j + 16. The
// K-quants take 256 elements per block (see quant-image.ts for their layouts). Values are
// computed in f32 as ggml does, then rounded to bf16 (nearest even). The model keeps quantized
// blocks resident instead (quant-image.ts); this path serves `weights: "bf16"` and mixed groups.

import { F16_TO_F32 as f16Table, convertToBf16, f32ToBf16 } from "./bf16-convert.ts";

/** Type names this module converts. */
export const DEQUANT_TYPES = ["F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "IQ4_NL", "MXFP4", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "IQ4_XS"] as const;
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
  if (type !== "Q8_0" && type !== "Q4_0" && type !== "Q4_1") {
    dequantMore(type, src, count, dst, dstOffset);
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

const kScale = new Uint8Array(8);
const kMin = new Uint8Array(8);
const k16 = new Int8Array(16);

/** The 8 6-bit scales and mins of the Q4_K super-block at `o` (Q5_K's are packed the same way). */
export function q4KScales(src: Uint8Array, o: number, sc: Uint8Array, m: Uint8Array): void {
  const S = o + 4;
  for (let j = 0; j < 8; j++) {
    sc[j] = j < 4 ? src[S + j]! & 63 : (src[S + j + 4]! & 0xf) | ((src[S + j - 4]! >> 6) << 4);
    m[j] = j < 4 ? src[S + j + 4]! & 63 : (src[S + j + 4]! >> 4) | ((src[S + j]! >> 6) << 4);
  }
}

/** The 16 int8 scales (one per 16 columns) of the Q6_K (scale) or Q3_K (6-bit scale - 32) super-block at `o`. */
export function k16Scales(type: "Q6_K" | "Q3_K", src: Uint8Array, o: number, out: Int8Array): void {
  for (let k = 0; k < 16; k++) {
    if (type === "Q6_K") out[k] = src[o + 192 + k]!;
    else {
      const low = k < 8 ? src[o + 96 + (k & 7)]! & 0xf : src[o + 96 + (k & 7)]! >> 4;
      const high = (src[o + 104 + (k & 3)]! >> (2 * (k >> 2))) & 3;
      out[k] = (low | (high << 4)) - 32;
    }
  }
}

/** The f16 super-block scale d of a Q4_K, Q6_K or Q3_K block at `o`, as f32. */
export function kSuperScale(type: "Q4_K" | "Q6_K" | "Q3_K", src: Uint8Array, o: number): number {
  const at = type === "Q4_K" ? o : type === "Q6_K" ? o + 208 : o + 108;
  return f16Table[src[at]! | (src[at + 1]! << 8)]!;
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
  q4KScales(src, o, kScale, kMin);
  for (let j = 0; j < 8; j++) {
    d1[j] = fround(d * kScale[j]!);
    m1[j] = fround(dmin * kMin[j]!);
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
  const d = kSuperScale("Q6_K", src, o);
  k16Scales("Q6_K", src, o, k16);
  for (let k = 0; k < 16; k++) ds[k] = fround(d * k16[k]!);
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

/** ggml's kvalues_iq4nl: the 16 int8 levels of IQ4_NL and IQ4_XS. */
export const IQ4_LEVELS = Int8Array.from([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113]);

const f16At = (src: Uint8Array, o: number): number => f16Table[src[o]! | (src[o + 1]! << 8)]!;

/**
 * One Q5_0 (22 bytes: f16 d, 32 high bits, 16 nibble bytes) or Q5_1 (24 bytes: f16 d, f16 m, then
 * the same) block at `o`, as ggml's dequantize_row_q5_0/1 read it: q[e] in 0..31 (element j < 16:
 * low nibble of byte j and bit j of the high word; j + 16: high nibble and bit j + 16), the scale,
 * and the additive min: w = d q + m, Q5_0's m = -16 d (exact in f32).
 */
export function decodeQ5(type: "Q5_0" | "Q5_1", src: Uint8Array, o: number, q: Uint8Array, qo: number): { d: number; m: number } {
  const d = f16At(src, o);
  const m = type === "Q5_1" ? f16At(src, o + 2) : fround(-16 * d);
  const h = o + (type === "Q5_1" ? 4 : 2);
  const qh = (src[h]! | (src[h + 1]! << 8) | (src[h + 2]! << 16) | (src[h + 3]! << 24)) >>> 0;
  for (let j = 0; j < 16; j++) {
    const b = src[h + 4 + j]!;
    q[qo + j] = (b & 0xf) | (((qh >>> j) & 1) << 4);
    q[qo + j + 16] = (b >> 4) | (((qh >>> (j + 16)) & 1) << 4);
  }
  return { d, m };
}

/** The 6-bit (scale, min) pair j of a Q4_K / Q5_K super-block's 12 scale bytes at `s` (ggml's get_scale_min_k4). */
function scaleMinK4(src: Uint8Array, s: number, j: number): [number, number] {
  return j < 4 ? [src[s + j]! & 63, src[s + j + 4]! & 63] : [(src[s + j + 4]! & 0xf) | ((src[s + j - 4]! >> 6) << 4), (src[s + j + 4]! >> 4) | ((src[s + j]! >> 6) << 4)];
}

/**
 * One Q5_K super-block (176 bytes at `o`: f16 d, f16 dmin, 12 scale bytes, 32 bytes of high bits,
 * 128 nibble bytes), as ggml's dequantize_row_q5_K reads it: q[e] in 0..31 and per 32 columns
 * d1 = d * scale and m1 = dmin * min (exact): w = d1 q - m1.
 */
export function decodeQ5K(src: Uint8Array, o: number, q: Uint8Array, d1: Float32Array, m1: Float32Array): void {
  const d = f16At(src, o);
  const dmin = f16At(src, o + 2);
  for (let j = 0; j < 8; j++) {
    const [sc, m] = scaleMinK4(src, o + 4, j);
    d1[j] = fround(d * sc);
    m1[j] = fround(dmin * m);
    const ql = o + 48 + 32 * (j >> 1);
    for (let l = 0; l < 32; l++) {
      const nib = j % 2 === 0 ? src[ql + l]! & 0xf : src[ql + l]! >> 4;
      q[32 * j + l] = nib | (((src[o + 16 + l]! >> j) & 1) << 4);
    }
  }
}

/**
 * One Q3_K super-block (110 bytes at `o`: 32 bytes of high-bit masks, 64 bytes of 2-bit pairs, 12
 * bytes of 6-bit scales, f16 d), as ggml's dequantize_row_q3_K reads it: q[e] in -4..3 and per 16
 * columns ds = d * (scale - 32) (exact): w = ds q.
 */
export function decodeQ3K(src: Uint8Array, o: number, q: Int8Array, ds: Float32Array): void {
  const d = kSuperScale("Q3_K", src, o);
  k16Scales("Q3_K", src, o, k16);
  for (let k = 0; k < 16; k++) ds[k] = fround(d * k16[k]!);
  for (let e = 0; e < 256; e++) {
    const n = e >> 7; // which 128
    const j = (e >> 5) & 3; // which shift within it
    const l = e & 31;
    const two = (src[o + 32 + 32 * n + l]! >> (2 * j)) & 3;
    const hm = (src[o + l]! >> (4 * n + j)) & 1;
    q[e] = two - (hm ? 0 : 4);
  }
}

/**
 * One Q2_K super-block (84 bytes at `o`: 16 bytes of 4-bit (scale, min), 64 bytes of 2-bit
 * values, f16 d, f16 dmin), as ggml's dequantize_row_q2_K reads it: q[e] in 0..3 and per 16
 * columns dl = d * scale and ml = dmin * min (exact): w = dl q - ml.
 */
export function decodeQ2K(src: Uint8Array, o: number, q: Uint8Array, dl: Float32Array, ml: Float32Array): void {
  const d = f16At(src, o + 80);
  const dmin = f16At(src, o + 82);
  for (let k = 0; k < 16; k++) {
    dl[k] = fround(d * (src[o + k]! & 0xf));
    ml[k] = fround(dmin * (src[o + k]! >> 4));
  }
  for (let e = 0; e < 256; e++) {
    const n = e >> 7;
    const j = (e >> 5) & 3;
    const l = e & 31;
    q[e] = (src[o + 16 + 32 * n + l]! >> (2 * j)) & 3;
  }
}

/**
 * One IQ4_XS super-block (136 bytes at `o`: f16 d, u16 high scale bits, 4 bytes of low scale
 * nibbles, 128 nibble bytes) as ggml's dequantize_row_iq4_xs reads it: the levels (IQ4_LEVELS) of
 * the 256 columns and per 32 columns dl = d * (scale - 32) (exact): w = dl level.
 */
export function decodeIQ4XS(src: Uint8Array, o: number, q: Int8Array, dl: Float32Array): void {
  const d = f16At(src, o);
  const sh = src[o + 2]! | (src[o + 3]! << 8);
  for (let ib = 0; ib < 8; ib++) {
    const ls = ((src[o + 4 + (ib >> 1)]! >> (4 * (ib % 2))) & 0xf) | (((sh >> (2 * ib)) & 3) << 4);
    dl[ib] = fround(d * (ls - 32));
    for (let j = 0; j < 16; j++) {
      const b = src[o + 8 + 16 * ib + j]!;
      q[32 * ib + j] = IQ4_LEVELS[b & 0xf]!;
      q[32 * ib + j + 16] = IQ4_LEVELS[b >> 4]!;
    }
  }
}

/** ggml's kvalues_mxfp4: the 16 FP4 (E2M1) values doubled to integers, -12..12. */
export const MXFP4_LEVELS = [0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12] as const;

/** ggml's e8m0_to_fp32_half: 2^(e - 128), exact in f32 (e < 2 as the denormals 2^-128, 2^-127). */
export function e8m0Half(e: number): number {
  const bits = e < 2 ? 0x00200000 << e : (e - 1) << 23;
  return new Float32Array(new Uint32Array([bits >>> 0]).buffer)[0]!;
}

/** One MXFP4 block (17 bytes at `o`: the E8M0 exponent, 16 nibble bytes): levels into q, returns d. */
export function decodeMXFP4(src: Uint8Array, o: number, q: Int8Array, qo: number): number {
  for (let j = 0; j < 16; j++) {
    const b = src[o + 1 + j]!;
    q[qo + j] = MXFP4_LEVELS[b & 0xf]!;
    q[qo + j + 16] = MXFP4_LEVELS[b >> 4]!;
  }
  return e8m0Half(src[o]!);
}

/** One IQ4_NL block (18 bytes at `o`: f16 d, 16 nibble bytes): levels into q, returns d. */
export function decodeIQ4NL(src: Uint8Array, o: number, q: Int8Array, qo: number): number {
  for (let j = 0; j < 16; j++) {
    const b = src[o + 2 + j]!;
    q[qo + j] = IQ4_LEVELS[b & 0xf]!;
    q[qo + j + 16] = IQ4_LEVELS[b >> 4]!;
  }
  return f16At(src, o);
}

/** The other block types, each value computed in f32 as ggml's dequantize_row_* does, to bf16. */
function dequantMore(type: DequantType, src: Uint8Array, count: number, dst: Uint16Array, dstOffset: number): void {
  const u = new Uint8Array(256);
  const s8 = new Int8Array(256);
  const a = new Float32Array(16);
  const b = new Float32Array(16);
  if (type === "Q5_0" || type === "Q5_1" || type === "IQ4_NL" || type === "MXFP4") {
    const bytes = type === "Q5_0" ? 22 : type === "Q5_1" ? 24 : type === "MXFP4" ? 17 : 18;
    for (let blk = 0; blk < count / 32; blk++) {
      const out = dstOffset + blk * 32;
      if (type === "IQ4_NL" || type === "MXFP4") {
        const d = type === "MXFP4" ? decodeMXFP4(src, blk * bytes, s8, 0) : decodeIQ4NL(src, blk * bytes, s8, 0);
        for (let e = 0; e < 32; e++) dst[out + e] = f32ToBf16(fround(d * s8[e]!));
        continue;
      }
      const { d, m } = decodeQ5(type, src, blk * bytes, u, 0);
      // ggml: Q5_0 (q - 16) d, Q5_1 q d + m
      for (let e = 0; e < 32; e++) dst[out + e] = f32ToBf16(type === "Q5_0" ? fround((u[e]! - 16) * d) : fround(fround(u[e]! * d) + m));
    }
    return;
  }
  const bytes = { Q2_K: 84, Q3_K: 110, Q5_K: 176, IQ4_XS: 136 }[type as "Q2_K" | "Q3_K" | "Q5_K" | "IQ4_XS"];
  for (let sb = 0; sb < count / 256; sb++) {
    const o = sb * bytes;
    const out = dstOffset + sb * 256;
    if (type === "Q5_K") {
      decodeQ5K(src, o, u, a, b);
      for (let e = 0; e < 256; e++) dst[out + e] = f32ToBf16(fround(fround(a[e >> 5]! * u[e]!) - b[e >> 5]!));
    } else if (type === "Q3_K") {
      decodeQ3K(src, o, s8, a);
      for (let e = 0; e < 256; e++) dst[out + e] = f32ToBf16(fround(a[e >> 4]! * s8[e]!));
    } else if (type === "Q2_K") {
      decodeQ2K(src, o, u, a, b);
      for (let e = 0; e < 256; e++) dst[out + e] = f32ToBf16(fround(fround(a[e >> 4]! * u[e]!) - b[e >> 4]!));
    } else {
      decodeIQ4XS(src, o, s8, a);
      for (let e = 0; e < 256; e++) dst[out + e] = f32ToBf16(fround(a[e >> 5]! * s8[e]!));
    }
  }
}
