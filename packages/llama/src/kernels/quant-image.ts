// The kernel-ready images of quantized weight matrices ("4-row groups", see wat/kernels.wat):
// GGUF Q8_0 / Q4_0 / Q4_1 blocks repacked (never converted) so one pointer walks four rows, and
// the quantizers that make such blocks from bf16 rows (for `weights: "q8_0" | "q4_1"`). Knows
// the block layouts; the model decides which matrix gets which.
import { f16BitsToF32 } from "../checkpoint/bf16-convert.ts";
import { ModelLoadError } from "../checkpoint/model-load-error.ts";

/** Kernel ids of the weight formats (0 is the bf16 image of weight-image.ts). */
export const KIND = { bf16: 0, q8: 1, q4: 2 } as const;
export type WeightKind = keyof typeof KIND;

/** Bytes per block of 32 columns of a 4-row group (q8: 4 x 32 int8 + 4 f32 scales; q4: 4 x 16 nibble bytes + 4 f16 d + 4 f16 m). */
export const GROUP_BLOCK_BYTES = { q8: 144, q4: 80 } as const;

/** GGUF block types each quantized kind holds as stored. */
export const STORED_TYPES = { q8: ["Q8_0"], q4: ["Q4_0", "Q4_1"] } as const;

/** Bytes of one stored GGUF block of 32 elements. */
const STORED_BLOCK = { Q8_0: 34, Q4_0: 18, Q4_1: 20 } as Record<string, number>;

/** Whether a [rows][cols] matrix fits the quantized kernels (else it stays bf16). */
export function quantizable(rows: number, cols: number): boolean {
  return rows % 4 === 0 && cols % 32 === 0;
}

/** Bytes of the image of a [rows][cols] matrix of `kind`. */
export function quantImageBytes(kind: "q8" | "q4", rows: number, cols: number): number {
  return (rows / 4) * (cols / 32) * GROUP_BLOCK_BYTES[kind];
}

const f32s = new Float32Array(1);
const u32s = new Uint32Array(f32s.buffer);

/** f16 bits of an f32 value that f16 holds exactly, or -1 when it does not. */
export function exactF16Bits(v: number): number {
  f32s[0] = v;
  const bits = u32s[0]!;
  const sign = (bits >>> 16) & 0x8000;
  const a = Math.abs(f32s[0]!);
  if (a === 0) return sign;
  if (!Number.isFinite(a) || a > 65504) return -1;
  let h: number;
  if (a < 2 ** -14) {
    const m = a / 2 ** -24;
    if (!Number.isInteger(m)) return -1;
    h = m;
  } else {
    const e = Math.floor(Math.log2(a));
    const ee = a >= 2 ** (e + 1) ? e + 1 : a < 2 ** e ? e - 1 : e;
    const m = (a / 2 ** ee - 1) * 1024;
    if (!Number.isInteger(m)) return -1;
    h = ((ee + 15) << 10) | m;
  }
  return sign | h;
}

/** f16 bits of v rounded to nearest even (ggml's GGML_FP32_TO_FP16 on the value's f32). */
export function f16Round(v: number): number {
  f32s[0] = v;
  const x = f32s[0]!;
  const sign = x < 0 || Object.is(x, -0) ? 0x8000 : 0;
  const a = Math.abs(x);
  if (Number.isNaN(a)) return 0x7e00;
  if (a >= 65520) return sign | 0x7c00;
  if (a < 2 ** -14) {
    // subnormal: multiples of 2^-24, ties to even (1024 becomes the smallest normal, 0x0400)
    const s = a / 2 ** -24;
    let q = Math.floor(s);
    if (s - q > 0.5 || (s - q === 0.5 && (q & 1) === 1)) q++;
    return sign | q;
  }
  let e = Math.floor(Math.log2(a));
  if (a >= 2 ** (e + 1)) e++;
  if (a < 2 ** e) e--;
  const scaled = (a / 2 ** e - 1) * 1024;
  let m = Math.floor(scaled);
  const rest = scaled - m;
  if (rest > 0.5 || (rest === 0.5 && (m & 1) === 1)) m++;
  if (m === 1024) {
    m = 0;
    e++;
  }
  return sign | ((e + 15) << 10) | m;
}

/** C's roundf: half away from zero. */
function roundf(v: number): number {
  return Math.sign(v) * Math.round(Math.abs(v));
}

const f16Table = new Float32Array(65536);
for (let h = 0; h < 65536; h++) f16Table[h] = f16BitsToF32(h);

function checkScale(h: number, file: string, tensor: string): void {
  if ((h & 0x7c00) === 0x7c00) throw new ModelLoadError(file, `tensor "${tensor}" has a non-finite block scale (f16 bits 0x${h.toString(16)})`, { item: tensor });
}

/**
 * Writes `rows` stored rows (GGUF blocks of `type`, row-major, in the HF row order) into the
 * image at byte `base` of `u8`, as rows [row0, row0 + rows) of a matrix with `cols` columns.
 * Throws ModelLoadError for a non-finite scale or a Q4_0 scale whose -8 d f16 cannot hold.
 */
export function packStoredRows(
  kind: "q8" | "q4",
  type: string,
  raw: Uint8Array,
  u8: Uint8Array,
  base: number,
  row0: number,
  rows: number,
  cols: number,
  file: string,
  tensor: string,
): void {
  const nb = cols / 32;
  const sb = STORED_BLOCK[type];
  if (sb === undefined || !(STORED_TYPES[kind] as readonly string[]).includes(type))
    throw new ModelLoadError(file, `tensor "${tensor}" has type ${type}, not one the ${kind} image holds`, { item: tensor });
  if (raw.byteLength !== rows * nb * sb)
    throw new ModelLoadError(file, `tensor "${tensor}" has ${raw.byteLength} bytes, ${rows} rows of ${cols} ${type} need ${rows * nb * sb}`, { item: tensor });
  const gb = GROUP_BLOCK_BYTES[kind];
  const rd = (o: number): number => raw[o]! | (raw[o + 1]! << 8);
  for (let i = 0; i < rows; i++) {
    const r = row0 + i;
    const j = r & 3;
    const groupBase = base + (r >> 2) * nb * gb;
    for (let b = 0; b < nb; b++) {
      const s = (i * nb + b) * sb;
      const d = groupBase + b * gb;
      const dh = rd(s);
      checkScale(dh, file, tensor);
      if (kind === "q8") {
        u8.set(raw.subarray(s + 2, s + 34), d + 32 * j);
        f32s[0] = f16Table[dh]!;
        u8[d + 128 + 4 * j] = u32s[0]! & 0xff;
        u8[d + 129 + 4 * j] = (u32s[0]! >>> 8) & 0xff;
        u8[d + 130 + 4 * j] = (u32s[0]! >>> 16) & 0xff;
        u8[d + 131 + 4 * j] = u32s[0]! >>> 24;
        continue;
      }
      let mh: number;
      let q: number;
      if (type === "Q4_1") {
        mh = rd(s + 2);
        checkScale(mh, file, tensor);
        q = s + 4;
      } else {
        mh = exactF16Bits(-8 * f16BitsToF32(dh));
        if (mh < 0) throw new ModelLoadError(file, `tensor "${tensor}": a Q4_0 scale of ${f16BitsToF32(dh)} has no exact -8 d in f16`, { item: tensor });
        q = s + 2;
      }
      u8.set(raw.subarray(q, q + 16), d + 16 * j);
      u8[d + 64 + 2 * j] = dh & 0xff;
      u8[d + 65 + 2 * j] = dh >> 8;
      u8[d + 72 + 2 * j] = mh & 0xff;
      u8[d + 73 + 2 * j] = mh >> 8;
    }
  }
}

/**
 * Quantizes bf16 rows (row-major [rows][cols]) to GGUF blocks as ggml's reference quantizers
 * do: Q8_0 d = amax / 127 stored as f16, q = round(x / d); Q4_1 d = (max - min) / 15, m = min,
 * q = round((x - m) / d) clamped to [0, 15]. Returns the stored bytes (packStoredRows input).
 */
export function quantizeBf16Rows(type: "Q8_0" | "Q4_1", src: Uint16Array, rows: number, cols: number): Uint8Array {
  const nb = cols / 32;
  const sb = STORED_BLOCK[type]!;
  const out = new Uint8Array(rows * nb * sb);
  const x = new Float32Array(32);
  const xb = new Uint32Array(x.buffer);
  for (let blk = 0; blk < rows * nb; blk++) {
    for (let k = 0; k < 32; k++) xb[k] = src[blk * 32 + k]! << 16;
    const o = blk * sb;
    if (type === "Q8_0") {
      let amax = 0;
      for (let k = 0; k < 32; k++) amax = Math.max(amax, Math.abs(x[k]!));
      const d = Math.fround(amax / 127);
      const id = d ? Math.fround(1 / d) : 0;
      const dh = f16Round(d);
      out[o] = dh & 0xff;
      out[o + 1] = dh >> 8;
      for (let k = 0; k < 32; k++) out[o + 2 + k] = roundf(Math.fround(x[k]! * id)) & 0xff;
    } else {
      let lo = Infinity;
      let hi = -Infinity;
      for (let k = 0; k < 32; k++) {
        lo = Math.min(lo, x[k]!);
        hi = Math.max(hi, x[k]!);
      }
      const d = Math.fround((hi - lo) / 15);
      const id = d ? Math.fround(1 / d) : 0;
      const dh = f16Round(d);
      const mh = f16Round(lo);
      out[o] = dh & 0xff;
      out[o + 1] = dh >> 8;
      out[o + 2] = mh & 0xff;
      out[o + 3] = mh >> 8;
      for (let k = 0; k < 16; k++) {
        const a = Math.min(15, Math.max(0, roundf(Math.fround(Math.fround(x[k]! - lo) * id))));
        const b = Math.min(15, Math.max(0, roundf(Math.fround(Math.fround(x[k + 16]! - lo) * id))));
        out[o + 4 + k] = a | (b << 4);
      }
    }
  }
  return out;
}

/** Row r of a quantized image as f32 values (w = q d, or q d + m for q4), into out[0..cols). */
export function dequantImageRow(kind: "q8" | "q4", u8: Uint8Array, base: number, r: number, cols: number, out: Float32Array, outOff: number): void {
  const nb = cols / 32;
  const gb = GROUP_BLOCK_BYTES[kind];
  const j = r & 3;
  const groupBase = base + (r >> 2) * nb * gb;
  const fr = Math.fround;
  for (let b = 0; b < nb; b++) {
    const d0 = groupBase + b * gb;
    if (kind === "q8") {
      u32s[0] = (u8[d0 + 128 + 4 * j]! | (u8[d0 + 129 + 4 * j]! << 8) | (u8[d0 + 130 + 4 * j]! << 16) | (u8[d0 + 131 + 4 * j]! << 24)) >>> 0;
      const d = f32s[0]!;
      for (let k = 0; k < 32; k++) out[outOff + b * 32 + k] = fr(((u8[d0 + 32 * j + k]! << 24) >> 24) * d);
    } else {
      const d = f16Table[u8[d0 + 64 + 2 * j]! | (u8[d0 + 65 + 2 * j]! << 8)]!;
      const m = f16Table[u8[d0 + 72 + 2 * j]! | (u8[d0 + 73 + 2 * j]! << 8)]!;
      for (let k = 0; k < 16; k++) {
        const q = u8[d0 + 16 * j + k]!;
        out[outOff + b * 32 + k] = fr(fr((q & 15) * d) + m);
        out[outOff + b * 32 + k + 16] = fr(fr((q >> 4) * d) + m);
      }
    }
  }
}
