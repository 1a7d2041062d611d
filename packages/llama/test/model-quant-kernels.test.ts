// The integer kernels over quantized blocks (q8 / q4 images of GGUF Q8_0, Q4_0, Q4_1) against a
// plain-JS reference of the documented arithmetic, bit for bit: every token count (quads and
// single tokens), row ranges on one and two threads; the image packing and its row dequantiser.
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { f16BitsToF32 } from "../src/checkpoint/bf16-convert.ts";
import { dequantToBf16 } from "../src/checkpoint/gguf-dequant.ts";
import { KernelRuntime } from "../src/kernels/kernel-runtime.ts";
import { KIND, dequantImageRow, exactF16Bits, f16Round, packStoredRows, quantImageBytes, quantizeBf16Rows } from "../src/kernels/quant-image.ts";
import { f32ToBf16 } from "./model-helpers/reference-math.ts";

const fr = Math.fround;

function rand(seed: number): () => number {
  let a = seed >>> 0;
  return () => {
    a = (Math.imul(a, 1664525) + 1013904223) >>> 0;
    return a / 2 ** 32 - 0.5;
  };
}

/** Round half to even, as f32x4.nearest. */
function nearest(v: number): number {
  const f = Math.floor(v);
  const d = v - f;
  if (d > 0.5) return f + 1;
  if (d < 0.5) return f;
  return f % 2 === 0 ? f : f + 1;
}

type Stored = { type: "Q8_0" | "Q4_0" | "Q4_1"; raw: Uint8Array };

/** Q4_0 blocks of random nibbles and scales (the model quantizer makes Q8_0 and Q4_1 only). */
function randomQ40(rows: number, cols: number, r: () => number): Uint8Array {
  const out = new Uint8Array((rows * cols * 18) / 32);
  for (let b = 0; b < out.length / 18; b++) {
    const d = f16Round(0.01 + Math.abs(r()) * 0.02);
    out[b * 18] = d & 0xff;
    out[b * 18 + 1] = d >> 8;
    for (let k = 0; k < 16; k++) out[b * 18 + 2 + k] = Math.floor((r() + 0.5) * 256) & 0xff;
  }
  return out;
}

/** The reference: per row and block, the exact integer sum, then the f32 steps in the documented order. */
function reference(s: Stored, x: Float32Array, T: number, rows: number, cols: number): Float32Array {
  const nb = cols / 32;
  const sb = s.type === "Q8_0" ? 34 : s.type === "Q4_0" ? 18 : 20;
  const y = new Float32Array(T * rows);
  for (let t = 0; t < T; t++) {
    const q = new Int32Array(cols);
    const dx = new Float32Array(nb);
    const sx = new Float32Array(nb);
    for (let b = 0; b < nb; b++) {
      let amax = 0;
      for (let k = 0; k < 32; k++) amax = Math.max(amax, Math.abs(x[t * cols + b * 32 + k]));
      const d = fr(amax / 32767);
      const id = d !== 0 ? fr(1 / d) : 0;
      let sum = 0;
      for (let k = 0; k < 32; k++) {
        q[b * 32 + k] = nearest(fr(x[t * cols + b * 32 + k] * id));
        sum += q[b * 32 + k];
      }
      dx[b] = d;
      sx[b] = fr(d * sum);
    }
    for (let r = 0; r < rows; r++) {
      let acc = 0;
      for (let b = 0; b < nb; b++) {
        const o = (r * nb + b) * sb;
        const dw = f16BitsToF32(s.raw[o] | (s.raw[o + 1] << 8));
        let isum = 0;
        let mw = 0;
        if (s.type === "Q8_0") {
          for (let k = 0; k < 32; k++) isum += ((s.raw[o + 2 + k] << 24) >> 24) * q[b * 32 + k];
        } else {
          const qs = s.type === "Q4_1" ? o + 4 : o + 2;
          mw = s.type === "Q4_1" ? f16BitsToF32(s.raw[o + 2] | (s.raw[o + 3] << 8)) : fr(-8 * dw);
          for (let k = 0; k < 16; k++) isum += (s.raw[qs + k] & 15) * q[b * 32 + k] + (s.raw[qs + k] >> 4) * q[b * 32 + 16 + k];
        }
        acc = fr(acc + fr(fr(isum) * fr(dw * dx[b])));
        if (s.type !== "Q8_0") acc = fr(acc + fr(mw * sx[b]));
      }
      y[t * rows + r] = acc;
    }
  }
  return y;
}

function run(rt: KernelRuntime, s: Stored, x: Float32Array, T: number, rows: number, cols: number): Float32Array {
  const kind = s.type === "Q8_0" ? "q8" : "q4";
  const w = rt.alloc(quantImageBytes(kind, rows, cols));
  packStoredRows(kind, s.type, s.raw, rt.u8, w, 0, rows, cols, "test", "w");
  const xp = rt.alloc(x.byteLength);
  rt.f32.set(x, xp >> 2);
  const xq = rt.alloc(Math.ceil(T / 4) * cols * 9);
  const y = rt.alloc(T * rows * 4);
  rt.quantX(xp, xq, T, cols);
  rt.matmul(w, xq, y, T, cols, rows, KIND[kind]);
  return rt.f32.slice(y >> 2, (y >> 2) + T * rows);
}

function problem(type: Stored["type"], seed: number, T: number, rows: number, cols: number): { s: Stored; x: Float32Array } {
  const r = rand(seed);
  const x = new Float32Array(T * cols).map(() => r() * 3);
  x[5] = 0; // zeros and one all-zero block of the first token
  for (let k = 0; k < 32 && cols >= 64; k++) x[32 + k] = 0;
  if (type === "Q4_0") return { s: { type, raw: randomQ40(rows, cols, r) }, x };
  const w = new Uint16Array(rows * cols).map(() => f32ToBf16(r() * 0.2));
  return { s: { type, raw: quantizeBf16Rows(type, w, rows, cols) }, x };
}

let rt1: KernelRuntime;
let rt2: KernelRuntime;
beforeAll(async () => {
  rt1 = await KernelRuntime.create({ threads: 1 });
  rt2 = await KernelRuntime.create({ threads: 2 });
});
afterAll(() => {
  rt1.close();
  rt2.close();
});

const bits = (a: Float32Array) => Buffer.from(a.buffer, a.byteOffset, a.byteLength);

describe.each(["Q8_0", "Q4_0", "Q4_1"] as const)("%s image", (type) => {
  it("equals the reference bit for bit for 1-9 tokens (quads and single tokens) and several shapes", () => {
    for (const [rows, cols] of [
      [4, 32],
      [8, 96],
      [44, 64],
      [136, 160],
    ]) {
      for (let T = 1; T <= 9; T++) {
        const { s, x } = problem(type, rows * 100 + T, T, rows, cols);
        const want = reference(s, x, T, rows, cols);
        expect(bits(run(rt1, s, x, T, rows, cols)).equals(bits(want)), `${rows}x${cols} T=${T}`).toBe(true);
      }
    }
  });

  it("gives each token the same bits alone as inside a multi-token matmul, and the same on two threads", () => {
    const rows = 256,
      cols = 128,
      T = 7;
    const { s, x } = problem(type, 5, T, rows, cols);
    const all = run(rt1, s, x, T, rows, cols);
    for (let t = 0; t < T; t++) {
      const one = run(rt1, s, x.slice(t * cols, (t + 1) * cols), 1, rows, cols);
      expect(bits(one).equals(bits(all.slice(t * rows, (t + 1) * rows)))).toBe(true);
    }
    expect(bits(run(rt2, s, x, T, rows, cols)).equals(bits(all))).toBe(true);
  });

  it("is not a no-op: the result tracks the float64 product of the dequantised weights", () => {
    const rows = 16,
      cols = 64,
      T = 3;
    const { s, x } = problem(type, 77, T, rows, cols);
    const w = new Uint16Array(rows * cols);
    dequantToBf16(type, s.raw, rows * cols, w, 0);
    const got = run(rt1, s, x, T, rows, cols);
    const f = new Float32Array(1);
    const u = new Uint32Array(f.buffer);
    for (let t = 0; t < T; t++) {
      for (let r = 0; r < rows; r++) {
        let want = 0;
        let mag = 0;
        for (let c = 0; c < cols; c++) {
          u[0] = w[r * cols + c] << 16;
          want += f[0] * x[t * cols + c];
          mag += Math.abs(f[0] * x[t * cols + c]);
        }
        expect(Math.abs(got[t * rows + r] - want)).toBeLessThan(1e-2 * mag + 1e-6);
      }
    }
  });

  it("the image row dequantiser gives q d (+ m) per element in the original row order", () => {
    const rows = 8,
      cols = 64;
    const { s } = problem(type, 3, 1, rows, cols);
    const kind = type === "Q8_0" ? "q8" : "q4";
    const img = new Uint8Array(quantImageBytes(kind, rows, cols));
    packStoredRows(kind, type, s.raw, img, 0, 0, rows, cols, "test", "w");
    const sb = type === "Q8_0" ? 34 : type === "Q4_0" ? 18 : 20;
    for (let r = 0; r < rows; r++) {
      const out = new Float32Array(cols);
      dequantImageRow(kind, img, 0, r, cols, out, 0);
      for (let c = 0; c < cols; c++) {
        const o = (r * (cols / 32) + (c >> 5)) * sb;
        const d = f16BitsToF32(s.raw[o] | (s.raw[o + 1] << 8));
        const k = c & 31;
        let want: number;
        if (type === "Q8_0") want = fr(((s.raw[o + 2 + k] << 24) >> 24) * d);
        else {
          const qs = type === "Q4_1" ? o + 4 : o + 2;
          const q = k < 16 ? s.raw[qs + k] & 15 : s.raw[qs + k - 16] >> 4;
          const m = type === "Q4_1" ? f16BitsToF32(s.raw[o + 2] | (s.raw[o + 3] << 8)) : fr(-8 * d);
          want = fr(fr(q * d) + m);
        }
        expect(out[c]).toBe(want);
      }
    }
  });
});

describe("packing", () => {
  it("refuses a non-finite block scale and a wrong byte count, naming the tensor", () => {
    const raw = quantizeBf16Rows("Q8_0", new Uint16Array(4 * 32).fill(f32ToBf16(0.5)), 4, 32);
    raw[0] = 0x00;
    raw[1] = 0x7c; // +inf
    const img = new Uint8Array(quantImageBytes("q8", 4, 32));
    expect(() => packStoredRows("q8", "Q8_0", raw, img, 0, 0, 4, 32, "f.gguf", "blk.0.attn_q.weight")).toThrow(/blk\.0\.attn_q\.weight.*non-finite/);
    expect(() => packStoredRows("q8", "Q8_0", raw.subarray(1), img, 0, 0, 4, 32, "f.gguf", "t")).toThrow(/bytes/);
    expect(() => packStoredRows("q4", "Q8_0", raw, img, 0, 0, 4, 32, "f.gguf", "t")).toThrow(/not one the q4 image holds/);
  });

  it("f16 helpers: exact values round-trip, inexact ones are refused, rounding is to nearest even", () => {
    for (const h of [0x0000, 0x8000, 0x0001, 0x03ff, 0x0400, 0x3c00, 0xbc00, 0x7bff, 0x1234, 0xd678]) expect(exactF16Bits(f16BitsToF32(h))).toBe(h);
    expect(exactF16Bits(1 + 2 ** -12)).toBe(-1);
    expect(exactF16Bits(70000)).toBe(-1);
    expect(f16Round(1 + 2 ** -11)).toBe(0x3c00); // tie -> even
    expect(f16Round(1 + 3 * 2 ** -11)).toBe(0x3c02);
    expect(f16Round(2 ** -25)).toBe(0); // half the smallest subnormal -> 0 (even)
  });
});
