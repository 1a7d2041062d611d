// Conversions from the stored element types (F32, F16, BF16) to bf16 bit patterns. F32 -> bf16
// rounds to nearest, ties to even, and keeps NaN a (quiet) NaN. Knows nothing about files.

const f32Scratch = new Float32Array(1);
const i32Scratch = new Int32Array(f32Scratch.buffer);
const u32Scratch = new Uint32Array(f32Scratch.buffer);

/** bf16 bits of one f32 value, round-to-nearest-even. */
export function f32ToBf16(value: number): number {
  f32Scratch[0] = value;
  const i = i32Scratch[0]!;
  if ((i & 0x7fffffff) > 0x7f800000) return ((i >>> 16) | 0x0040) & 0xffff; // NaN stays a quiet NaN
  return ((i + 0x7fff + ((i >>> 16) & 1)) >>> 16) & 0xffff;
}

/** bf16 bits from the 32 raw bits of an f32 (as an unsigned or signed 32-bit integer). */
export function f32BitsToBf16(bits: number): number {
  const i = bits | 0;
  if ((i & 0x7fffffff) > 0x7f800000) return ((i >>> 16) | 0x0040) & 0xffff;
  return ((i + 0x7fff + ((i >>> 16) & 1)) >>> 16) & 0xffff;
}

/** The f32 value of f16 bits (exact: every f16 is representable in f32). */
export function f16BitsToF32(h: number): number {
  const sign = h & 0x8000 ? -1 : 1;
  const exp = (h >>> 10) & 0x1f;
  const mant = h & 0x3ff;
  if (exp === 0) return sign * mant * 2 ** -24;
  if (exp === 31) return mant === 0 ? sign * Infinity : NaN;
  return sign * (1 + mant / 1024) * 2 ** (exp - 15);
}

/** The f32 value of bf16 bits. */
export function bf16ToF32(b: number): number {
  u32Scratch[0] = (b & 0xffff) << 16;
  return f32Scratch[0]!;
}

/** The f32 value of every f16 bit pattern (exact), for block decoders. */
export const F16_TO_F32 = new Float32Array(65536);
for (let h = 0; h < 65536; h++) F16_TO_F32[h] = f16BitsToF32(h);

const f16ToBf16Table = new Uint16Array(65536);
for (let h = 0; h < 65536; h++) f16ToBf16Table[h] = f32ToBf16(f16BitsToF32(h));

/** bf16 bits of f16 bits (round-to-nearest-even through the exact f32 value). */
export function f16BitsToBf16(h: number): number {
  return f16ToBf16Table[h & 0xffff]!;
}

/**
 * Converts `count` little-endian elements of `dtype` starting at `src[srcByteOffset]` into bf16
 * bits at `dst[dstOffset..]`. `dtype` is one of BF16, F16, F32.
 */
export function convertToBf16(dtype: "BF16" | "F16" | "F32", src: Uint8Array, srcByteOffset: number, count: number, dst: Uint16Array, dstOffset: number): void {
  const view = new DataView(src.buffer, src.byteOffset + srcByteOffset, count * (dtype === "F32" ? 4 : 2));
  if (dtype === "BF16") {
    for (let i = 0; i < count; i++) dst[dstOffset + i] = view.getUint16(i * 2, true);
  } else if (dtype === "F16") {
    for (let i = 0; i < count; i++) dst[dstOffset + i] = f16ToBf16Table[view.getUint16(i * 2, true)]!;
  } else {
    for (let i = 0; i < count; i++) dst[dstOffset + i] = f32BitsToBf16(view.getInt32(i * 4, true));
  }
}
