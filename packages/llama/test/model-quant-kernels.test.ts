// The integer kernels over quantized blocks (the q8 / q4 / q4k / q6k images of GGUF Q8_0, IQ4_NL,
// IQ4_XS, Q4_0, Q4_1, Q4_K, Q6_K, Q3_K over 16-bit inputs, and q4a8 / q4ka8 / q6ka8 / q5a8 of the
// Q4, Q6_K, Q3_K and Q5 types over 8-bit inputs on relaxed-SIMD dots) against a plain-JS reference
// of the documented arithmetic, bit for bit: every
// token count (quads and single tokens), row ranges on one and two threads; the image packing and
// its row dequantiser against a decoder written from ggml's block layouts.
import { describe, expect, it } from "vitest";
import { f16BitsToF32 } from "../src/checkpoint/bf16-convert.ts";
import { dequantToBf16 } from "../src/checkpoint/gguf-dequant.ts";
import type { KernelRuntime } from "../src/kernels/kernel-runtime.ts";
import { kernelRuntimes } from "./model-helpers/runtimes.ts";
import { dequantImageRow, exactF16Bits, f16Round, kindOfStored, packStoredRows, type QuantKind, quantImageBytes, quantizeBf16Rows, takesA8 } from "../src/kernels/quant-image.ts";
import { type QuantType as Type, randomBlocks } from "./model-helpers/quant-blocks.ts";
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

type Stored = { type: Type; raw: Uint8Array };

/**
 * Per row and block of 32 columns, written from ggml's block layouts (not from the packer): the
 * integers q, the scale of columns 0-15 and 16-31 (f32), and the additive min (Q4_1, Q4_0 as
 * -8 d, Q4_K as -dmin m) or undefined.
 */
function decode(s: Stored, rows: number, cols: number): { q: Int32Array; dA: Float32Array; dB: Float32Array; m: Float32Array | undefined } {
  const nb = cols / 32;
  const q = new Int32Array(rows * cols);
  const dA = new Float32Array(rows * nb);
  const dB = new Float32Array(rows * nb);
  const m = ["Q8_0", "Q6_K", "Q3_K", "IQ4_NL", "IQ4_XS", "MXFP4"].includes(s.type) ? undefined : new Float32Array(rows * nb);
  const h16 = (o: number) => f16BitsToF32(s.raw[o] | (s.raw[o + 1] << 8));
  if (decodeMore(s, rows, cols, q, dA, dB, m)) return { q, dA, dB, m };
  for (let row = 0; row < rows; row++) {
    if (s.type === "Q4_K" || s.type === "Q6_K") {
      for (let sb = 0; sb < cols / 256; sb++) {
        if (s.type === "Q4_K") {
          const o = (row * (cols / 256) + sb) * 144;
          const d = h16(o);
          const dmin = h16(o + 2);
          const sc = s.raw.subarray(o + 4, o + 16);
          for (let j = 0; j < 8; j++) {
            const [a, mm] = j < 4 ? [sc[j] & 63, sc[j + 4] & 63] : [(sc[j + 4] & 0xf) | ((sc[j - 4] >> 6) << 4), (sc[j + 4] >> 4) | ((sc[j] >> 6) << 4)];
            const blk = row * nb + sb * 8 + j;
            dA[blk] = dB[blk] = fr(d * a);
            m![blk] = -fr(dmin * mm);
            for (let l = 0; l < 32; l++) {
              const byte = s.raw[o + 16 + 32 * (j >> 1) + l];
              q[row * cols + sb * 256 + 32 * j + l] = j % 2 === 0 ? byte & 0xf : byte >> 4;
            }
          }
        } else {
          const o = (row * (cols / 256) + sb) * 210;
          const d = h16(o + 208);
          for (let e = 0; e < 256; e++) {
            const n = e >> 7;
            const l = e & 31;
            const part = (e & 127) >> 5; // 0: ql low, 1: ql+32 low, 2: ql high, 3: ql+32 high
            const ql = s.raw[o + 64 * n + l + (part & 1 ? 32 : 0)];
            const qh = (s.raw[o + 128 + 32 * n + l] >> (2 * part)) & 3;
            q[row * cols + sb * 256 + e] = ((part < 2 ? ql & 0xf : ql >> 4) | (qh << 4)) - 32;
          }
          for (let k = 0; k < 8; k++) {
            const blk = row * nb + sb * 8 + k;
            dA[blk] = fr(d * ((s.raw[o + 192 + 2 * k] << 24) >> 24));
            dB[blk] = fr(d * ((s.raw[o + 193 + 2 * k] << 24) >> 24));
          }
        }
      }
      continue;
    }
    const sb = s.type === "Q8_0" ? 34 : s.type === "Q4_0" ? 18 : 20;
    for (let b = 0; b < nb; b++) {
      const o = (row * nb + b) * sb;
      const d = h16(o);
      dA[row * nb + b] = dB[row * nb + b] = d;
      if (s.type === "Q8_0") {
        for (let k = 0; k < 32; k++) q[row * cols + b * 32 + k] = (s.raw[o + 2 + k] << 24) >> 24;
        continue;
      }
      const qs = s.type === "Q4_1" ? o + 4 : o + 2;
      m![row * nb + b] = s.type === "Q4_1" ? h16(o + 2) : fr(-8 * d);
      for (let k = 0; k < 16; k++) {
        q[row * cols + b * 32 + k] = s.raw[qs + k] & 15;
        q[row * cols + b * 32 + 16 + k] = s.raw[qs + k] >> 4;
      }
    }
  }
  return { q, dA, dB, m };
}

/** ggml's kvalues_iq4nl. */
const IQ4 = [-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113];

/**
 * decode() for Q5_0, Q5_1, Q5_K, Q3_K, IQ4_NL, IQ4_XS and MXFP4, each loop written after ggml's
 * dequantize_row_* of the type (false for the other types).
 */
function decodeMore(s: Stored, rows: number, cols: number, q: Int32Array, dA: Float32Array, dB: Float32Array, m: Float32Array | undefined): boolean {
  const raw = s.raw;
  const nb = cols / 32;
  const h16 = (o: number) => f16BitsToF32(raw[o] | (raw[o + 1] << 8));
  const u32 = (o: number) => (raw[o] | (raw[o + 1] << 8) | (raw[o + 2] << 16) | (raw[o + 3] << 24)) >>> 0;
  if (s.type === "MXFP4") {
    // ggml's dequantize_row_mxfp4: d = e8m0_to_fp32_half(e) (2^(e - 128), the denormal bit
    // patterns for e < 2), y[j] = kvalues_mxfp4[qs[j] & 15] d, y[j + 16] = kvalues_mxfp4[qs[j] >> 4] d
    const FP4 = [0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12];
    for (let blk = 0; blk < rows * nb; blk++) {
      const o = blk * 17;
      const e = raw[o];
      const bits = e < 2 ? 0x00200000 << e : (e - 1) << 23;
      dA[blk] = dB[blk] = new Float32Array(new Uint32Array([bits]).buffer)[0];
      const y = Math.floor(blk / nb) * cols + (blk % nb) * 32;
      for (let j = 0; j < 16; j++) {
        q[y + j] = FP4[raw[o + 1 + j] & 0xf];
        q[y + j + 16] = FP4[raw[o + 1 + j] >> 4];
      }
    }
    return true;
  }
  if (s.type === "Q5_0" || s.type === "Q5_1" || s.type === "IQ4_NL") {
    const sb = s.type === "Q5_0" ? 22 : s.type === "Q5_1" ? 24 : 18;
    for (let blk = 0; blk < rows * nb; blk++) {
      const o = blk * sb;
      const row = Math.floor(blk / nb);
      const y = row * cols + (blk % nb) * 32;
      const d = h16(o);
      dA[blk] = dB[blk] = d;
      if (s.type === "IQ4_NL") {
        for (let j = 0; j < 16; j++) {
          q[y + j] = IQ4[raw[o + 2 + j] & 0xf];
          q[y + j + 16] = IQ4[raw[o + 2 + j] >> 4];
        }
        continue;
      }
      m![blk] = s.type === "Q5_1" ? h16(o + 2) : fr(-16 * d);
      const qh = u32(s.type === "Q5_1" ? o + 4 : o + 2);
      const qs = s.type === "Q5_1" ? o + 8 : o + 6;
      for (let j = 0; j < 16; j++) {
        q[y + j] = (raw[qs + j] & 0x0f) | (((qh >>> j) << 4) & 0x10);
        q[y + j + 16] = (raw[qs + j] >> 4) | ((qh >>> (j + 12)) & 0x10);
      }
    }
    return true;
  }
  if (s.type !== "Q5_K" && s.type !== "Q3_K" && s.type !== "IQ4_XS") return false;
  const sbBytes = s.type === "Q5_K" ? 176 : s.type === "Q3_K" ? 110 : 136;
  for (let row = 0; row < rows; row++) {
    for (let sb = 0; sb < cols / 256; sb++) {
      const o = (row * (cols / 256) + sb) * sbBytes;
      const y0 = row * cols + sb * 256;
      const b0 = row * nb + sb * 8;
      if (s.type === "Q5_K") {
        const d = h16(o);
        const dmin = h16(o + 2);
        const sc = raw.subarray(o + 4, o + 16);
        let u1 = 1;
        let u2 = 2;
        for (let j = 0; j < 256; j += 64) {
          const is = j / 32;
          for (const [k, u] of [
            [is, u1],
            [is + 1, u2],
          ]) {
            const [a, mm] = k < 4 ? [sc[k] & 63, sc[k + 4] & 63] : [(sc[k + 4] & 0xf) | ((sc[k - 4] >> 6) << 4), (sc[k + 4] >> 4) | ((sc[k] >> 6) << 4)];
            dA[b0 + k] = dB[b0 + k] = fr(d * a);
            m![b0 + k] = -fr(dmin * mm);
            for (let l = 0; l < 32; l++) {
              const ql = raw[o + 48 + j / 2 + l];
              q[y0 + 32 * k + l] = (k % 2 === 0 ? ql & 0xf : ql >> 4) + (raw[o + 16 + l] & u ? 16 : 0);
            }
          }
          u1 <<= 2;
          u2 <<= 2;
        }
      } else if (s.type === "Q3_K") {
        const d = h16(o + 108);
        // the 16 6-bit scales: ggml's aux shuffle of the 12 bytes
        const a = [u32(o + 96), u32(o + 100), u32(o + 104)];
        const k1 = 0x03030303;
        const k2 = 0x0f0f0f0f;
        const aux = [
          ((a[0] & k2) | (((a[2] >>> 0) & k1) << 4)) >>> 0,
          ((a[1] & k2) | (((a[2] >>> 2) & k1) << 4)) >>> 0,
          (((a[0] >>> 4) & k2) | (((a[2] >>> 4) & k1) << 4)) >>> 0,
          (((a[1] >>> 4) & k2) | (((a[2] >>> 6) & k1) << 4)) >>> 0,
        ];
        const scale = (i: number) => ((aux[i >> 2] >>> (8 * (i & 3))) & 0xff) - 32;
        let e = 0;
        let mask = 1;
        for (let n = 0; n < 256; n += 128) {
          let shift = 0;
          for (let j = 0; j < 4; j++) {
            for (let half = 0; half < 2; half++) {
              const k = e >> 4;
              const ds = fr(d * scale(k));
              if (k % 2 === 0) dA[b0 + (k >> 1)] = ds;
              else dB[b0 + (k >> 1)] = ds;
              for (let l = 0; l < 16; l++) {
                const at = 16 * half + l;
                q[y0 + e++] = ((raw[o + 32 + n / 4 + at] >> shift) & 3) - (raw[o + at] & mask ? 0 : 4);
              }
            }
            shift += 2;
            mask <<= 1;
          }
        }
      } else {
        const d = h16(o);
        const sh = raw[o + 2] | (raw[o + 3] << 8);
        for (let ib = 0; ib < 8; ib++) {
          const ls = ((raw[o + 4 + (ib >> 1)] >> (4 * (ib % 2))) & 0xf) | (((sh >> (2 * ib)) & 3) << 4);
          dA[b0 + ib] = dB[b0 + ib] = fr(d * (ls - 32));
          for (let j = 0; j < 16; j++) {
            q[y0 + 32 * ib + j] = IQ4[raw[o + 8 + 16 * ib + j] & 0xf];
            q[y0 + 32 * ib + j + 16] = IQ4[raw[o + 8 + 16 * ib + j] >> 4];
          }
        }
      }
    }
  }
  return true;
}

/**
 * The reference: per row and block, the exact integer sum(s), then the f32 steps in the documented
 * order. Inputs are quantized to 16 bits (quant_x: amax / 32767) or 8 bits (quant_x8: amax / 127,
 * clamped to [-127, 127]).
 */
function reference(s: Stored, x: Float32Array, T: number, rows: number, cols: number, a8 = false): Float32Array {
  const qmax = a8 ? 127 : 32767;
  const nb = cols / 32;
  const w = decode(s, rows, cols);
  const y = new Float32Array(T * rows);
  for (let t = 0; t < T; t++) {
    const q = new Int32Array(cols);
    const dx = new Float32Array(nb);
    const sx = new Float32Array(nb);
    for (let b = 0; b < nb; b++) {
      let amax = 0;
      for (let k = 0; k < 32; k++) amax = Math.max(amax, Math.abs(x[t * cols + b * 32 + k]));
      const d = fr(amax / qmax);
      const id = d !== 0 ? fr(1 / d) : 0;
      let sum = 0;
      for (let k = 0; k < 32; k++) {
        q[b * 32 + k] = Math.max(-qmax, Math.min(qmax, nearest(fr(x[t * cols + b * 32 + k] * id))));
        sum += q[b * 32 + k];
      }
      dx[b] = d;
      sx[b] = fr(d * sum);
    }
    for (let r = 0; r < rows; r++) {
      let acc = 0;
      for (let b = 0; b < nb; b++) {
        let lo = 0;
        let hi = 0;
        for (let k = 0; k < 16; k++) {
          lo += w.q[r * cols + b * 32 + k] * q[b * 32 + k];
          hi += w.q[r * cols + b * 32 + 16 + k] * q[b * 32 + 16 + k];
        }
        const blk = r * nb + b;
        if (s.type === "Q6_K" || s.type === "Q3_K") {
          acc = fr(acc + fr(fr(lo) * fr(w.dA[blk] * dx[b])));
          acc = fr(acc + fr(fr(hi) * fr(w.dB[blk] * dx[b])));
        } else acc = fr(acc + fr(fr(lo + hi) * fr(w.dA[blk] * dx[b])));
        if (w.m) acc = fr(acc + fr(w.m[blk] * sx[b]));
      }
      y[t * rows + r] = acc;
    }
  }
  return y;
}

function run(rt: KernelRuntime, s: Stored, x: Float32Array, T: number, rows: number, cols: number, kind: QuantKind = kindOfStored(s.type)!): Float32Array {
  const w = rt.alloc(quantImageBytes(kind, rows, cols));
  packStoredRows(kind, s.type, s.raw, rt.u8, w, 0, rows, cols, "test", "w");
  const xp = rt.alloc(x.byteLength);
  rt.f32.set(x, xp >> 2);
  const xq = rt.alloc(Math.ceil(T / 4) * cols * 9);
  const y = rt.alloc(T * rows * 4);
  if (takesA8(kind)) rt.quantX8(xp, xq, T, cols);
  else rt.quantX(xp, xq, T, cols);
  rt.matmulQ(kind, w, xq, y, T, cols, rows);
  const out = rt.f32.slice(y >> 2, (y >> 2) + T * rows);
  for (const [p, n] of [
    [w, quantImageBytes(kind, rows, cols)],
    [xp, x.byteLength],
    [xq, Math.ceil(T / 4) * cols * 9],
    [y, T * rows * 4],
  ])
    rt.free(p, n);
  return out;
}

function problem(type: Type, seed: number, T: number, rows: number, cols: number): { s: Stored; x: Float32Array } {
  const r = rand(seed);
  const x = new Float32Array(T * cols).map(() => r() * 3);
  x[5] = 0; // zeros and one all-zero block of the first token
  for (let k = 0; k < 32 && cols >= 64; k++) x[32 + k] = 0;
  return { s: { type, raw: randomBlocks(type, rows, cols, r) }, x };
}

const rts = kernelRuntimes();

const bits = (a: Float32Array) => Buffer.from(a.buffer, a.byteOffset, a.byteLength);

const K = (t: Type) => t === "Q4_K" || t === "Q6_K" || t === "Q5_K" || t === "Q3_K" || t === "IQ4_XS";

describe.each([
  ["Q8_0", "q8"],
  ["Q4_0", "q4"],
  ["Q4_1", "q4"],
  ["Q4_K", "q4k"],
  ["Q6_K", "q6k"],
  ["Q4_0", "q4a8"],
  ["Q4_1", "q4a8"],
  ["Q4_K", "q4ka8"],
  ["Q6_K", "q6ka8"],
  ["Q5_0", "q5a8"],
  ["Q5_1", "q5a8"],
  ["Q5_K", "q5a8"],
  ["Q3_K", "q6k"],
  ["Q3_K", "q6ka8"],
  ["IQ4_NL", "q8"],
  ["IQ4_XS", "q8"],
  ["MXFP4", "q8"],
] as const)("%s in the %s image", (type, kind) => {
  const a8 = takesA8(kind);
  it("equals the reference bit for bit for 1-9 tokens (quads and single tokens) and several shapes", () => {
    for (const [rows, cols] of K(type)
      ? [
          [4, 256],
          [44, 512],
        ]
      : [
          [4, 32],
          [8, 96],
          [44, 64],
          [136, 160],
        ]) {
      for (let T = 1; T <= 9; T++) {
        const { s, x } = problem(type, rows * 100 + T, T, rows, cols);
        const want = reference(s, x, T, rows, cols, a8);
        expect(bits(run(rts.rt1, s, x, T, rows, cols, kind)).equals(bits(want)), `${rows}x${cols} T=${T}`).toBe(true);
      }
    }
  });

  it("gives each token the same bits alone as inside a multi-token matmul, and the same on two threads", () => {
    const rows = 256,
      cols = 256,
      T = 7;
    const { s, x } = problem(type, 5, T, rows, cols);
    const all = run(rts.rt1, s, x, T, rows, cols, kind);
    for (let t = 0; t < T; t++) {
      const one = run(rts.rt1, s, x.slice(t * cols, (t + 1) * cols), 1, rows, cols, kind);
      expect(bits(one).equals(bits(all.slice(t * rows, (t + 1) * rows)))).toBe(true);
    }
    expect(bits(run(rts.rt2, s, x, T, rows, cols, kind)).equals(bits(all))).toBe(true);
  });

  it("gives the same bits on two threads when the rows do not fill the last chunk the threads claim", () => {
    const cols = 256;
    for (const [rows, T] of [
      [100, 3], // 7 chunks of 16 rows, the last one 4
      [36, 8], // 5 chunks of 8 rows, the last one 4
      [1028, 1], // 8 chunks of 132 rows, the last one 104
    ] as const) {
      const { s, x } = problem(type, rows + T, T, rows, cols);
      expect(bits(run(rts.rt2, s, x, T, rows, cols, kind)).equals(bits(run(rts.rt1, s, x, T, rows, cols, kind))), `${rows} rows, T=${T}`).toBe(true);
    }
  });

  it("is not a no-op: the result tracks the float64 product of the weights ggml's layout gives", () => {
    const rows = 16,
      cols = 256,
      T = 3;
    const { s, x } = problem(type, 77, T, rows, cols);
    const w = decode(s, rows, cols);
    const got = run(rts.rt1, s, x, T, rows, cols, kind);
    for (let t = 0; t < T; t++) {
      for (let r = 0; r < rows; r++) {
        let want = 0;
        let mag = 0;
        for (let c = 0; c < cols; c++) {
          const blk = r * (cols / 32) + (c >> 5);
          const v = w.q[r * cols + c] * ((c & 31) < 16 ? w.dA[blk] : w.dB[blk]) + (w.m ? w.m[blk] : 0);
          want += v * x[t * cols + c];
          mag += Math.abs(v * x[t * cols + c]);
        }
        // 16-bit inputs: relative error ~1/65534 per value; 8-bit: ~1/254
        expect(Math.abs(got[t * rows + r] - want)).toBeLessThan((a8 ? 2e-2 : 1e-3) * mag + 1e-6);
      }
    }
    expect(got.some((v) => Math.abs(v) > 1e-3)).toBe(true);
  });

  it("the image row dequantiser gives q d (+ m) per element in the original row order", () => {
    const rows = 8,
      cols = 256;
    const { s } = problem(type, 3, 1, rows, cols);
    const img = new Uint8Array(quantImageBytes(kind, rows, cols));
    packStoredRows(kind, type, s.raw, img, 0, 0, rows, cols, "test", "w");
    const w = decode(s, rows, cols);
    for (let r = 0; r < rows; r++) {
      const out = new Float32Array(cols);
      dequantImageRow(kind, img, 0, r, cols, out, 0);
      for (let c = 0; c < cols; c++) {
        const blk = r * (cols / 32) + (c >> 5);
        const d = (c & 31) < 16 ? w.dA[blk] : w.dB[blk];
        const want = w.m ? fr(fr(w.q[r * cols + c] * d) + w.m[blk]) : fr(w.q[r * cols + c] * d);
        expect(out[c]).toBe(want);
      }
    }
    // and the bf16 dequantiser (the weights: "bf16" path) gives the same values, rounded
    const bf = new Uint16Array(rows * cols);
    dequantToBf16(type, s.raw, rows * cols, bf, 0);
    for (let r = 0; r < rows; r++) {
      const out = new Float32Array(cols);
      dequantImageRow(kind, img, 0, r, cols, out, 0);
      for (let c = 0; c < cols; c++) expect(f32ToBf16(out[c])).toBe(bf[r * cols + c]);
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
    expect(exactF16Bits(Number.NaN)).toBe(-1);
    expect(f16Round(1 + 2 ** -11)).toBe(0x3c00); // tie -> even
    expect(f16Round(1 + 3 * 2 ** -11)).toBe(0x3c02);
    expect(f16Round(2 ** -25)).toBe(0); // half the smallest subnormal -> 0 (even)
  });
});

describe("q4a8 (8-bit inputs on relaxed-SIMD dots) at the ends of its ranges", () => {
  // The kernels' exactness rests on two bounds (kernels.wat): the dot's second operand is a nibble
  // (0..15) or Q6_K's q (0..63) and the input is in [-127, 127], so the pair sums added in 16 bits
  // stay within +-30480 (eight of Q4) or +-32004 (two of Q6_K).
  const cols = 256;
  const rows = 8;
  /** Q4_1 blocks whose nibbles are all `nib` (d = 1, m = 0) or, with nib < 0, alternate 0 and 15. */
  function nibbleBlocks(nib: number): Stored {
    const raw = new Uint8Array(rows * (cols / 32) * 20);
    for (let blk = 0; blk < rows * (cols / 32); blk++) {
      raw[blk * 20] = 0x00;
      raw[blk * 20 + 1] = 0x3c; // d = 1
      for (let k = 0; k < 16; k++) raw[blk * 20 + 4 + k] = nib < 0 ? (k % 2 === 0 ? 0xf0 : 0x0f) : nib * 17;
    }
    return { type: "Q4_1", raw };
  }
  it("gives the exact sums at the largest weights and inputs of both signs, on every tile and thread", () => {
    for (const nib of [15, 0, -1]) {
      for (const sign of [1, -1, 0]) {
        const T = 9;
        // sign 0: +-amax alternating in pairs (the pair sums reach +-2 * 15 * 127)
        const x = new Float32Array(T * cols).map((_, i) => (sign === 0 ? ((i >> 1) % 2 === 0 ? 3 : -3) : sign * 3));
        const s = nibbleBlocks(nib);
        const want = reference(s, x, T, rows, cols, true);
        expect(bits(run(rts.rt1, s, x, T, rows, cols, "q4a8")).equals(bits(want)), `nibbles ${nib}, sign ${sign}`).toBe(true);
        expect(bits(run(rts.rt2, s, x, T, rows, cols, "q4a8")).equals(bits(want))).toBe(true);
        if (nib === 15 && sign !== 0) {
          // every block: 32 * 15 * 127 * sign exactly, times d * dx = 3 / 127, summed over 8 blocks
          let acc = 0;
          for (let b = 0; b < cols / 32; b++) acc = fr(acc + fr(sign * 32 * 15 * 127 * fr(1 * fr(3 / 127))));
          expect(want[0]).toBe(acc); // (m = 0 adds exact zeros)
        }
      }
    }
  });

  it("Q4_K and Q6_K at their largest integers (nibbles 15, q6 63) give the reference's bits too", () => {
    for (const type of ["Q4_K", "Q6_K"] as const) {
      const sb = type === "Q4_K" ? 144 : 210;
      const raw = new Uint8Array(rows * (cols / 256) * sb);
      for (let o = 0; o < raw.length; o += sb) {
        if (type === "Q4_K") {
          raw.set([0x00, 0x3c, 0x00, 0x00], o); // d = 1, dmin = 0
          raw.fill(1, o + 4, o + 16); // 6-bit scales and mins of 1 (and 0 high bits)
          raw.fill(0xff, o + 16, o + 144); // every nibble 15
        } else {
          raw.fill(0xff, o, o + 192); // ql and qh: every q 63 (value 31)
          raw.fill(1, o + 192, o + 208); // int8 scales of 1
          raw.set([0x00, 0x3c], o + 208); // d = 1
        }
      }
      for (const sign of [1, -1, 0]) {
        const T = 5;
        const x = new Float32Array(T * cols).map((_, i) => (sign === 0 ? ((i >> 1) % 2 === 0 ? 3 : -3) : sign * 3));
        const s: Stored = { type, raw };
        const kind = type === "Q4_K" ? "q4ka8" : "q6ka8";
        const want = reference(s, x, T, rows, cols, true);
        expect(bits(run(rts.rt1, s, x, T, rows, cols, kind)).equals(bits(want)), `${type}, sign ${sign}`).toBe(true);
        expect(bits(run(rts.rt2, s, x, T, rows, cols, kind)).equals(bits(want))).toBe(true);
        if (sign !== 0) expect(Math.abs(want[0])).toBeGreaterThan(0); // (alternating pairs against constant weights sum to 0)
      }
    }
  });

  it("Q5 at its largest integers (q 31) and at 0 gives the reference's bits, and the exact sum", () => {
    for (const top of [31, 0]) {
      const raw = new Uint8Array(rows * (cols / 32) * 24);
      for (let o = 0; o < raw.length; o += 24) {
        raw.set([0x00, 0x3c, 0x00, 0x00], o); // Q5_1: d = 1, m = 0
        raw.fill(top ? 0xff : 0, o + 4, o + 24); // every high bit and nibble set (q 31) or clear
      }
      for (const sign of [1, -1, 0]) {
        const T = 6;
        const x = new Float32Array(T * cols).map((_, i) => (sign === 0 ? ((i >> 1) % 2 === 0 ? 3 : -3) : sign * 3));
        const s: Stored = { type: "Q5_1", raw };
        const want = reference(s, x, T, rows, cols, true);
        expect(bits(run(rts.rt1, s, x, T, rows, cols, "q5a8")).equals(bits(want)), `q ${top}, sign ${sign}`).toBe(true);
        expect(bits(run(rts.rt2, s, x, T, rows, cols, "q5a8")).equals(bits(want))).toBe(true);
        if (top && sign !== 0) {
          let acc = 0;
          for (let b = 0; b < cols / 32; b++) {
            acc = fr(acc + fr(sign * 32 * 31 * 127 * fr(1 * fr(3 / 127))));
            acc = fr(acc + fr(0 * fr(fr(3 / 127) * sign * 32 * 127)));
          }
          expect(want[0]).toBe(acc);
        }
      }
    }
  });

  it("quantizes every input into [-127, 127] with the block's scale, whatever the magnitudes", () => {
    const rt = rts.rt1;
    const T = 2;
    const x = new Float32Array(T * 64);
    const r = rand(9);
    for (let i = 0; i < x.length; i++) x[i] = r() * 10 ** Math.round(r() * 60);
    x[0] = 3.4e38; // near f32 max
    x[1] = -3.4e38;
    x[32] = 1e-45; // subnormal block max
    x[33] = -1e-45;
    for (let k = 34; k < 64; k++) x[k] = 0;
    x[64] = -1; // token 1, block 0: amax 1, the rest below it
    x[65] = 0.99999994;
    for (let k = 66; k < 96; k++) x[k] = r();
    const src = rt.alloc(x.byteLength);
    rt.f32.set(x, src >> 2);
    const dst = rt.alloc(T * 2 * 48);
    rt.quantX8(src, dst, T, 64);
    const dv = new DataView(rt.memory.buffer);
    for (let blk = 0; blk < T * 2; blk++) {
      const o = dst + blk * 48;
      let sum = 0;
      for (let k = 0; k < 32; k++) {
        const q = (rt.u8[o + k] << 24) >> 24;
        expect(q).toBeGreaterThanOrEqual(-127);
        expect(q).toBeLessThanOrEqual(127);
        sum += q;
      }
      const d = dv.getFloat32(o + 32, true);
      expect(dv.getFloat32(o + 36, true)).toBe(fr(d * sum));
      let amax = 0;
      for (let k = 0; k < 32; k++) amax = Math.max(amax, Math.abs(x[blk * 32 + k]));
      expect(d).toBe(fr(amax / 127));
    }
    expect((rt.u8[dst] << 24) >> 24).toBe(127);
    expect((rt.u8[dst + 1] << 24) >> 24).toBe(-127);
    expect((rt.u8[dst + 96] << 24) >> 24).toBe(-127);
    rt.free(src, x.byteLength);
    rt.free(dst, T * 2 * 48);
  });
});
