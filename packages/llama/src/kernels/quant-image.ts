// The kernel-ready images of quantized weight matrices ("4-row groups", see wat/kernels.wat):
// GGUF Q8_0 / Q4_0 / Q4_1 / Q4_K / Q6_K blocks repacked so one pointer walks four rows (the
// integers are kept; K-quant sub-block scales are multiplied out into exact f32 per 32 or 16
// columns), and the quantizers that make Q8_0 / Q4_1 blocks from bf16 rows (for
// `weights: "q8_0" | "q4_1"`). Knows the block layouts; the model decides which matrix gets which.
import { F16_TO_F32 as f16Table } from "../checkpoint/bf16-convert.ts";
import { decodeIQ4NL, decodeIQ4XS, decodeMXFP4, decodeQ3K, decodeQ4K, decodeQ5, decodeQ5K, decodeQ6K, k16Scales, kSuperScale, q4KScales } from "../checkpoint/gguf-dequant.ts";
import { ModelLoadError } from "../checkpoint/model-load-error.ts";

/** Kernel ids of the weight formats (0 is the bf16 image of weight-image.ts). */
export const KIND = { bf16: 0, q8: 1, q4: 2, q4k: 3, q6k: 4, q4a8: 5, q4ka8: 6, q6ka8: 7, q5a8: 8 } as const;
export type WeightKind = keyof typeof KIND;
export type QuantKind = Exclude<WeightKind, "bf16">;

/**
 * Bytes per block of 32 columns of a 4-row group. q8: 4 x 32 int8 + 4 f32 d; q4: 4 x 16 nibble
 * bytes + 4 f16 d + 4 f16 m; q4k: 4 x 16 nibble bytes + 4 f32 d + 4 f32 m; q6k: 4 x 32 int8
 * (q - 32) + 4 f32 d for columns 0-15 + 4 f32 d for columns 16-31. The kinds over 8-bit
 * activations hold the same blocks with the integers in another order: q4a8 (as q4) the nibble
 * byte of columns c and c + 16 (c < 16) of row j at byte 16 (c >> 2) + 4 j + (c & 3). q4ka8 and
 * q6ka8 keep the K-quants' integer scales (wat/kernels.wat has the layouts): q4ka8 608 bytes per
 * 256 columns of a 4-row group (f32 d and -dmin, u8 scale and min per 32 columns, the nibbles as
 * q4a8's), q6ka8 848 (f32 d, int8 scale per 16 columns, Q6_K's unsigned q 0..63 as a nibble plane
 * and a 2-bit plane); per block of 32 that is 76 and 106 bytes.
 * q5a8 (8-bit activations only) the 5-bit q (0..31) as q4a8's nibbles plus a 16-byte plane of
 * fifth bits, then 4 f32 d and 4 f32 m (w = d q + m).
 * Other GGUF types ride on these exactly: IQ4_NL / IQ4_XS / MXFP4 as q8 (their int8 levels, d
 * per 32 columns; MXFP4's d is a power of two), Q3_K as q6k / q6ka8 (q in -4..3 is q6's q - 32 range), Q5_0 as q5a8 with m = -16 d.
 */
export const GROUP_BLOCK_BYTES = { q8: 144, q4: 80, q4k: 96, q6k: 160, q4a8: 80, q4ka8: 76, q6ka8: 106, q5a8: 112 } as const;

/** Version of the image layouts below; bump it with any change to where a byte of an image goes. */
export const QUANT_IMAGE_LAYOUT = 2;

/** GGUF block types each quantized kind holds. */
export const STORED_TYPES = {
  q8: ["Q8_0", "IQ4_NL", "IQ4_XS", "MXFP4"],
  q4: ["Q4_0", "Q4_1"],
  q4k: ["Q4_K"],
  q6k: ["Q6_K", "Q3_K"],
  q4a8: ["Q4_0", "Q4_1"],
  q4ka8: ["Q4_K"],
  q6ka8: ["Q6_K", "Q3_K"],
  q5a8: ["Q5_0", "Q5_1", "Q5_K"],
} as const;

/** The kind over 8-bit activations that holds the same blocks as a kind over 16-bit ones, if any. */
export const A8_KIND: Partial<Record<QuantKind, QuantKind>> = { q4: "q4a8", q4k: "q4ka8", q6k: "q6ka8" };

/** Kinds whose kernels take quant_x8's 8-bit input (the others take quant_x's 16-bit input). */
export function takesA8(kind: QuantKind): boolean {
  return kind === "q4a8" || kind === "q4ka8" || kind === "q6ka8" || kind === "q5a8";
}

/** Elements and bytes of one stored GGUF block. */
const STORED_BLOCK: Record<string, { n: number; bytes: number }> = {
  Q8_0: { n: 32, bytes: 34 },
  Q4_0: { n: 32, bytes: 18 },
  Q4_1: { n: 32, bytes: 20 },
  Q4_K: { n: 256, bytes: 144 },
  Q6_K: { n: 256, bytes: 210 },
  Q5_0: { n: 32, bytes: 22 },
  Q5_1: { n: 32, bytes: 24 },
  Q5_K: { n: 256, bytes: 176 },
  Q3_K: { n: 256, bytes: 110 },
  IQ4_NL: { n: 32, bytes: 18 },
  IQ4_XS: { n: 256, bytes: 136 },
  MXFP4: { n: 32, bytes: 17 },
};

/**
 * The kind that holds a stored type: one over 16-bit activations (A8_KIND maps it to 8-bit), else
 * one over 8-bit activations only (q5a8), else undefined.
 */
export function kindOfStored(dtype: string): QuantKind | undefined {
  return (["q8", "q4", "q4k", "q6k", "q5a8"] as const).find((k) => (STORED_TYPES[k] as readonly string[]).includes(dtype));
}

/** Whether a [rows][cols] matrix of `kind` fits the quantized kernels (else it stays bf16). */
export function quantizable(rows: number, cols: number, kind: QuantKind = "q8"): boolean {
  return rows % 4 === 0 && cols % (kind === "q4k" || kind === "q6k" || kind === "q4ka8" || kind === "q6ka8" ? 256 : 32) === 0;
}

/** Bytes of the image of a [rows][cols] matrix of `kind`. */
export function quantImageBytes(kind: QuantKind, rows: number, cols: number): number {
  return (rows / 4) * (cols / 32) * GROUP_BLOCK_BYTES[kind];
}

const f32s = new Float32Array(1);
const u32s = new Uint32Array(f32s.buffer);

/** f16 bits of an f32 value that f16 holds exactly, or -1 when it does not. */
export function exactF16Bits(v: number): number {
  if (Number.isNaN(v)) return -1;
  const h = f16Round(v);
  return Object.is(f16Table[h], Math.fround(v)) ? h : -1;
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

function checkScale(h: number, file: string, tensor: string): void {
  if ((h & 0x7c00) === 0x7c00) throw new ModelLoadError(file, `tensor "${tensor}" has a non-finite block scale (f16 bits 0x${h.toString(16)})`, { item: tensor });
}

/** One packStoredRows call's rows: stored bytes, the image they go to, and the names errors give. */
interface RowsJob {
  raw: Uint8Array;
  u8: Uint8Array;
  base: number;
  row0: number;
  rows: number;
  cols: number;
  file: string;
  tensor: string;
}

/**
 * Writes `rows` stored rows (GGUF blocks of `type`, row-major, in the HF row order) into the
 * image at byte `base` of `u8`, as rows [row0, row0 + rows) of a matrix with `cols` columns.
 * Throws ModelLoadError for a non-finite scale or a Q4_0 scale whose -8 d f16 cannot hold.
 */
export function packStoredRows(
  kind: QuantKind,
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
  const blk = STORED_BLOCK[type];
  if (blk === undefined || !(STORED_TYPES[kind] as readonly string[]).includes(type))
    throw new ModelLoadError(file, `tensor "${tensor}" has type ${type}, not one the ${kind} image holds`, { item: tensor });
  const need = (rows * cols * blk.bytes) / blk.n;
  if (cols % blk.n !== 0 || raw.byteLength !== need)
    throw new ModelLoadError(file, `tensor "${tensor}" has ${raw.byteLength} bytes, ${rows} rows of ${cols} ${type} need ${need}`, { item: tensor });
  const job: RowsJob = { raw, u8, base, row0, rows, cols, file, tensor };
  if (kind === "q5a8") {
    packQ5Rows(type as "Q5_0" | "Q5_1" | "Q5_K", job);
    return;
  }
  if (type === "IQ4_NL" || type === "IQ4_XS" || type === "MXFP4") {
    packLevelRows(type, job);
    return;
  }
  if (kind === "q4ka8" || kind === "q6ka8") {
    packCompactKRows(kind, type as "Q4_K" | "Q6_K" | "Q3_K", job);
    return;
  }
  if (kind === "q4k" || kind === "q6k") {
    packKRows(kind, type as "Q4_K" | "Q6_K" | "Q3_K", job);
    return;
  }
  const sb = blk.bytes;
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
      // Byte loops, not subarray + set: a view per block made packing run at ~100 MB/s.
      if (kind === "q8") {
        const to = d + 32 * j;
        for (let k = 0; k < 32; k++) u8[to + k] = raw[s + 2 + k]!;
        putF32(u8, d + 128 + 4 * j, f16Table[dh]!);
        continue;
      }
      let mh: number;
      let q: number;
      if (type === "Q4_1") {
        mh = rd(s + 2);
        checkScale(mh, file, tensor);
        q = s + 4;
      } else {
        mh = q4_0Min[dh]!;
        if (mh === -2) mh = q4_0Min[dh] = exactF16Bits(-8 * f16Table[dh]!);
        if (mh < 0) throw new ModelLoadError(file, `tensor "${tensor}": a Q4_0 scale of ${f16Table[dh]} has no exact -8 d in f16`, { item: tensor });
        q = s + 2;
      }
      if (kind === "q4") {
        const to = d + 16 * j;
        for (let k = 0; k < 16; k++) u8[to + k] = raw[q + k]!;
      } else for (let k = 0; k < 16; k++) u8[d + 16 * (k >> 2) + 4 * j + (k & 3)] = raw[q + k]!;
      u8[d + 64 + 2 * j] = dh & 0xff;
      u8[d + 65 + 2 * j] = dh >> 8;
      u8[d + 72 + 2 * j] = mh & 0xff;
      u8[d + 73 + 2 * j] = mh >> 8;
    }
  }
}

/** The f16 bits of -8 d for a Q4_0 scale d (by its bits), -1 when inexact, -2 not yet computed. */
const q4_0Min = new Int32Array(65536).fill(-2);

function putF32(u8: Uint8Array, at: number, v: number): void {
  f32s[0] = v;
  const b = u32s[0]!;
  u8[at] = b & 0xff;
  u8[at + 1] = (b >>> 8) & 0xff;
  u8[at + 2] = (b >>> 16) & 0xff;
  u8[at + 3] = b >>> 24;
}
function getF32(u8: Uint8Array, at: number): number {
  u32s[0] = (u8[at]! | (u8[at + 1]! << 8) | (u8[at + 2]! << 16) | (u8[at + 3]! << 24)) >>> 0;
  return f32s[0]!;
}

/**
 * K-quant rows into the q4k / q6k images (16-bit activations), through the block decoders of
 * gguf-dequant.ts: Q4_K is kept per 32 columns as q, d1 = d sc and -m1 = -(dmin m) in f32; Q6_K as
 * q - 32 (int8) and d sc per 16 columns in f32 (all exact).
 */
function packKRows(kind: "q4k" | "q6k", type: "Q4_K" | "Q6_K" | "Q3_K", job: RowsJob): void {
  const { raw, u8, base, row0, rows, cols, file, tensor } = job;
  const nb = cols / 32;
  const nsb = cols / 256;
  const gb = GROUP_BLOCK_BYTES[kind];
  const q4kind = kind === "q4k";
  const sbBytes = STORED_BLOCK[type]!.bytes;
  const q4 = new Uint8Array(256);
  const q6 = new Int8Array(256);
  const sc = new Float32Array(16);
  const mn = new Float32Array(8);
  for (let i = 0; i < rows; i++) {
    const r = row0 + i;
    const j = r & 3;
    const groupBase = base + (r >> 2) * nb * gb;
    for (let s = 0; s < nsb; s++) {
      const o = (i * nsb + s) * sbBytes;
      if (q4kind) {
        checkScale(raw[o]! | (raw[o + 1]! << 8), file, tensor);
        checkScale(raw[o + 2]! | (raw[o + 3]! << 8), file, tensor);
        decodeQ4K(raw, o, q4, sc, mn);
        for (let k = 0; k < 8; k++) {
          const d0 = groupBase + (s * 8 + k) * gb;
          for (let b = 0; b < 16; b++) u8[d0 + 16 * j + b] = q4[32 * k + b]! | (q4[32 * k + 16 + b]! << 4);
          putF32(u8, d0 + 64 + 4 * j, sc[k]!);
          putF32(u8, d0 + 80 + 4 * j, -mn[k]!);
        }
        continue;
      }
      if (type === "Q3_K") {
        checkScale(raw[o + 108]! | (raw[o + 109]! << 8), file, tensor);
        decodeQ3K(raw, o, q6, sc);
      } else {
        checkScale(raw[o + 208]! | (raw[o + 209]! << 8), file, tensor);
        decodeQ6K(raw, o, q6, sc);
      }
      for (let k = 0; k < 8; k++) {
        const d0 = groupBase + (s * 8 + k) * gb;
        u8.set(new Uint8Array(q6.buffer, 32 * k, 32), d0 + 32 * j);
        putF32(u8, d0 + 128 + 4 * j, sc[2 * k]!);
        putF32(u8, d0 + 144 + 4 * j, sc[2 * k + 1]!);
      }
    }
  }
}

/** Byte offsets in the q4ka8 / q6ka8 images: the 256-column super-block s of the group of row r. */
const COMPACT_SB = { q4ka8: 608, q6ka8: 848 } as const;
function compactSuperBlock(kind: "q4ka8" | "q6ka8", base: number, r: number, cols: number, s: number): number {
  return base + (r >> 2) * (cols / 256) * COMPACT_SB[kind] + s * COMPACT_SB[kind];
}

/**
 * K-quant rows into the q4ka8 / q6ka8 images, which keep the file's integer scales next to an f32
 * super-block d (and -dmin): Q4_K's 6-bit scale and min per 32 columns, Q6_K's int8 scale (Q3_K's
 * 6-bit scale - 32) per 16 columns, and q as nibbles (Q6_K / Q3_K: q + 32, a nibble plus 2 bits).
 */
function packCompactKRows(kind: "q4ka8" | "q6ka8", type: "Q4_K" | "Q6_K" | "Q3_K", job: RowsJob): void {
  const { raw, u8, base, row0, rows, cols, file, tensor } = job;
  const nsb = cols / 256;
  const sbBytes = STORED_BLOCK[type]!.bytes;
  const q4 = new Uint8Array(256);
  const q6 = new Int8Array(256);
  const f1 = new Float32Array(16);
  const f2 = new Float32Array(8);
  const sc = new Uint8Array(8);
  const mn = new Uint8Array(8);
  const sc16 = new Int8Array(16);
  for (let i = 0; i < rows; i++) {
    const r = row0 + i;
    const j = r & 3;
    for (let s = 0; s < nsb; s++) {
      const o = (i * nsb + s) * sbBytes;
      const sb = compactSuperBlock(kind, base, r, cols, s);
      if (kind === "q4ka8") {
        checkScale(raw[o]! | (raw[o + 1]! << 8), file, tensor);
        checkScale(raw[o + 2]! | (raw[o + 3]! << 8), file, tensor);
        decodeQ4K(raw, o, q4, f1, f2);
        q4KScales(raw, o, sc, mn);
        putF32(u8, sb + 4 * j, kSuperScale("Q4_K", raw, o));
        putF32(u8, sb + 16 + 4 * j, -f16Table[raw[o + 2]! | (raw[o + 3]! << 8)]!);
        for (let k = 0; k < 8; k++) {
          u8[sb + 32 + 8 * k + j] = sc[k]!;
          u8[sb + 36 + 8 * k + j] = mn[k]!;
          const bb = sb + 96 + 64 * k;
          for (let b = 0; b < 16; b++) u8[bb + 16 * (b >> 2) + 4 * j + (b & 3)] = q4[32 * k + b]! | (q4[32 * k + 16 + b]! << 4);
        }
        continue;
      }
      const t6 = type as "Q6_K" | "Q3_K";
      checkScale(t6 === "Q3_K" ? raw[o + 108]! | (raw[o + 109]! << 8) : raw[o + 208]! | (raw[o + 209]! << 8), file, tensor);
      if (t6 === "Q3_K") decodeQ3K(raw, o, q6, f1);
      else decodeQ6K(raw, o, q6, f1);
      k16Scales(t6, raw, o, sc16);
      putF32(u8, sb + 4 * j, kSuperScale(t6, raw, o));
      for (let k = 0; k < 8; k++) {
        u8[sb + 16 + 8 * k + j] = sc16[2 * k]! & 0xff;
        u8[sb + 20 + 8 * k + j] = sc16[2 * k + 1]! & 0xff;
        const bb = sb + 80 + 96 * k;
        for (let c = 0; c < 16; c++) {
          const lo = q6[32 * k + c]! + 32;
          const hi = q6[32 * k + 16 + c]! + 32;
          const at = 4 * j + (c & 3);
          const shift = 2 * (c >> 2);
          u8[bb + 16 * (c >> 2) + at] = (lo & 15) | ((hi & 15) << 4);
          u8[bb + 64 + at] = (shift === 0 ? 0 : u8[bb + 64 + at]!) | ((lo >> 4) << shift);
          u8[bb + 80 + at] = (shift === 0 ? 0 : u8[bb + 80 + at]!) | ((hi >> 4) << shift);
        }
      }
    }
  }
}

/** Row r of a q4ka8 / q6ka8 image as f32 values (dequantImageRow's compact case). */
function dequantCompactRow(kind: "q4ka8" | "q6ka8", u8: Uint8Array, base: number, r: number, cols: number, out: Float32Array, outOff: number): void {
  const j = r & 3;
  const fr = Math.fround;
  for (let s = 0; s < cols / 256; s++) {
    const sb = compactSuperBlock(kind, base, r, cols, s);
    const d = getF32(u8, sb + 4 * j);
    for (let k = 0; k < 8; k++) {
      const o = outOff + s * 256 + k * 32;
      if (kind === "q4ka8") {
        const dw = fr(d * u8[sb + 32 + 8 * k + j]!);
        const mw = fr(getF32(u8, sb + 16 + 4 * j) * u8[sb + 36 + 8 * k + j]!);
        const bb = sb + 96 + 64 * k;
        for (let c = 0; c < 16; c++) {
          const q = u8[bb + 16 * (c >> 2) + 4 * j + (c & 3)]!;
          out[o + c] = fr(fr((q & 15) * dw) + mw);
          out[o + c + 16] = fr(fr((q >> 4) * dw) + mw);
        }
        continue;
      }
      const dA = fr(d * ((u8[sb + 16 + 8 * k + j]! << 24) >> 24));
      const dB = fr(d * ((u8[sb + 20 + 8 * k + j]! << 24) >> 24));
      const bb = sb + 80 + 96 * k;
      for (let c = 0; c < 16; c++) {
        const at = 4 * j + (c & 3);
        const nib = u8[bb + 16 * (c >> 2) + at]!;
        const shift = 2 * (c >> 2);
        const lo = (nib & 15) | (((u8[bb + 64 + at]! >> shift) & 3) << 4);
        const hi = (nib >> 4) | (((u8[bb + 80 + at]! >> shift) & 3) << 4);
        out[o + c] = fr((lo - 32) * dA);
        out[o + c + 16] = fr((hi - 32) * dB);
      }
    }
  }
}

/**
 * Q5_0 / Q5_1 / Q5_K rows into the q5a8 image: per 32 columns q (0..31), d and m in f32 (Q5_0:
 * m = -16 d; Q5_1: its f16 m; Q5_K: d1 = d sc and -m1 = -(dmin m)), all exact.
 */
function packQ5Rows(type: "Q5_0" | "Q5_1" | "Q5_K", job: RowsJob): void {
  const { raw, u8, base, row0, rows, cols, file, tensor } = job;
  const nb = cols / 32;
  const gb = GROUP_BLOCK_BYTES.q5a8;
  const q = new Uint8Array(256);
  const d = new Float32Array(8);
  const m = new Float32Array(8);
  const per = type === "Q5_K" ? 8 : 1; // 32-column blocks per stored block
  const bytes = STORED_BLOCK[type]!.bytes;
  for (let i = 0; i < rows; i++) {
    const r = row0 + i;
    const j = r & 3;
    const groupBase = base + (r >> 2) * nb * gb;
    for (let s = 0; s < nb / per; s++) {
      const o = (i * (nb / per) + s) * bytes;
      checkScale(raw[o]! | (raw[o + 1]! << 8), file, tensor);
      if (type !== "Q5_0") checkScale(raw[o + 2]! | (raw[o + 3]! << 8), file, tensor);
      if (type === "Q5_K") decodeQ5K(raw, o, q, d, m);
      else {
        const dm = decodeQ5(type, raw, o, q, 0);
        d[0] = dm.d;
        m[0] = -dm.m; // stored negated below, as Q5_K's
      }
      for (let k = 0; k < per; k++) {
        const d0 = groupBase + (s * per + k) * gb;
        for (let c = 0; c < 16; c++) {
          const lo = q[32 * k + c]!;
          const hi = q[32 * k + 16 + c]!;
          const at = 4 * j + (c & 3);
          const i = c >> 2;
          u8[d0 + 16 * i + at] = (lo & 15) | ((hi & 15) << 4);
          u8[d0 + 64 + at] = (i === 0 ? 0 : u8[d0 + 64 + at]!) | ((lo >> 4) << i) | ((hi >> 4) << (i + 4));
        }
        putF32(u8, d0 + 80 + 4 * j, d[k]!);
        putF32(u8, d0 + 96 + 4 * j, -m[k]!);
      }
    }
  }
}

/** IQ4_NL / IQ4_XS / MXFP4 rows into the q8 image: per 32 columns the int8 levels and the f32 scale (IQ4_XS: d (ls - 32), MXFP4: 2^(e - 128); exact). */
function packLevelRows(type: "IQ4_NL" | "IQ4_XS" | "MXFP4", job: RowsJob): void {
  const { raw, u8, base, row0, rows, cols, file, tensor } = job;
  const nb = cols / 32;
  const gb = GROUP_BLOCK_BYTES.q8;
  const q = new Int8Array(256);
  const d = new Float32Array(8);
  const per = type === "IQ4_XS" ? 8 : 1;
  const bytes = STORED_BLOCK[type]!.bytes;
  for (let i = 0; i < rows; i++) {
    const r = row0 + i;
    const j = r & 3;
    const groupBase = base + (r >> 2) * nb * gb;
    for (let s = 0; s < nb / per; s++) {
      const o = (i * (nb / per) + s) * bytes;
      if (type !== "MXFP4") checkScale(raw[o]! | (raw[o + 1]! << 8), file, tensor);
      if (type === "IQ4_XS") decodeIQ4XS(raw, o, q, d);
      else d[0] = type === "MXFP4" ? decodeMXFP4(raw, o, q, 0) : decodeIQ4NL(raw, o, q, 0);
      for (let k = 0; k < per; k++) {
        const d0 = groupBase + (s * per + k) * gb;
        for (let c = 0; c < 32; c++) u8[d0 + 32 * j + c] = q[32 * k + c]! & 0xff;
        putF32(u8, d0 + 128 + 4 * j, d[k]!);
      }
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
  const sb = STORED_BLOCK[type]!.bytes;
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
export function dequantImageRow(kind: QuantKind, u8: Uint8Array, base: number, r: number, cols: number, out: Float32Array, outOff: number): void {
  if (kind === "q4ka8" || kind === "q6ka8") {
    dequantCompactRow(kind, u8, base, r, cols, out, outOff);
    return;
  }
  const nb = cols / 32;
  const gb = GROUP_BLOCK_BYTES[kind];
  const j = r & 3;
  const groupBase = base + (r >> 2) * nb * gb;
  const fr = Math.fround;
  for (let b = 0; b < nb; b++) {
    const d0 = groupBase + b * gb;
    // byte of column k (k < 32; q4 kinds: k < 16, the nibble byte of k and k + 16) in this block
    const at =
      kind === "q4a8" || kind === "q5a8"
        ? (k: number) => d0 + 16 * (k >> 2) + 4 * j + (k & 3)
        : kind === "q4" || kind === "q4k"
          ? (k: number) => d0 + 16 * j + k
          : (k: number) => d0 + 32 * j + k;
    if (kind === "q5a8") {
      const d = getF32(u8, d0 + 80 + 4 * j);
      const m = getF32(u8, d0 + 96 + 4 * j);
      for (let k = 0; k < 16; k++) {
        const nib = u8[at(k)]!;
        const h = u8[d0 + 64 + 4 * j + (k & 3)]! >> (k >> 2);
        out[outOff + b * 32 + k] = fr(fr(((nib & 15) | ((h & 1) << 4)) * d) + m);
        out[outOff + b * 32 + k + 16] = fr(fr(((nib >> 4) | (((h >> 4) & 1) << 4)) * d) + m);
      }
    } else if (kind === "q8" || kind === "q6k") {
      const dA = getF32(u8, d0 + 128 + 4 * j);
      const dB = kind === "q8" ? dA : getF32(u8, d0 + 144 + 4 * j);
      for (let k = 0; k < 32; k++) out[outOff + b * 32 + k] = fr(((u8[at(k)]! << 24) >> 24) * (k < 16 ? dA : dB));
    } else {
      const d = kind === "q4" || kind === "q4a8" ? f16Table[u8[d0 + 64 + 2 * j]! | (u8[d0 + 65 + 2 * j]! << 8)]! : getF32(u8, d0 + 64 + 4 * j);
      const m = kind === "q4" || kind === "q4a8" ? f16Table[u8[d0 + 72 + 2 * j]! | (u8[d0 + 73 + 2 * j]! << 8)]! : getF32(u8, d0 + 80 + 4 * j);
      for (let k = 0; k < 16; k++) {
        const q = u8[at(k)]!;
        out[outOff + b * 32 + k] = fr(fr((q & 15) * d) + m);
        out[outOff + b * 32 + k + 16] = fr(fr((q >> 4) * d) + m);
      }
    }
  }
}
