// Each wasm kernel against its plain-JS reference (bit-equal), and the matmul's tile shapes and
// thread split against each other.
import { describe, expect, it } from "vitest";
import type { KernelRuntime } from "../src/kernels/kernel-runtime.ts";
import { kernelRuntimes } from "./model-helpers/runtimes.ts";
import { imageIndex, interleaveRows } from "../src/kernels/weight-image.ts";
import { attnScoresRef, attnValuesRef, bf16ToF32, dotRef, f32ToBf16, rmsnormRef } from "./model-helpers/reference-math.ts";

function rand(seed: number): () => number {
  let a = seed >>> 0;
  return () => {
    a = (Math.imul(a, 1664525) + 1013904223) >>> 0;
    return a / 2 ** 32 - 0.5;
  };
}

const rts = kernelRuntimes();

function put(rt: KernelRuntime, data: Float32Array | Uint16Array): number {
  const p = rt.alloc(data.byteLength);
  if (data instanceof Float32Array) rt.f32.set(data, p >> 2);
  else rt.u16.set(data, p >> 1);
  return p;
}

function runMatmul(rt: KernelRuntime, w: Uint16Array, x: Float32Array, T: number, rows: number, cols: number): Float32Array {
  const wp = rt.alloc(w.byteLength);
  interleaveRows(w, rt.u16, wp >> 1, rows, cols);
  const xp = put(rt, x),
    xq = rt.alloc(x.byteLength),
    yp = rt.alloc(T * rows * 4);
  rt.packX(xp, xq, T, cols);
  rt.matmul(wp, xq, yp, T, cols, rows);
  return rt.f32.slice(yp >> 2, (yp >> 2) + T * rows);
}

function randomProblem(seed: number, T: number, rows: number, cols: number): { w: Uint16Array; x: Float32Array } {
  const r = rand(seed);
  const w = new Uint16Array(rows * cols).map(() => f32ToBf16(r() * 0.2));
  const x = new Float32Array(T * cols).map(() => r() * 3);
  return { w, x };
}

describe("matmul kernel", () => {
  it("equals the scalar reference bit for bit for every tile shape", () => {
    for (const [T, rows, cols] of [
      [1, 1, 8],
      [1, 5, 16],
      [1, 37, 24],
      [1, 8, 8],
      [2, 7, 64],
      [4, 2, 8],
      [4, 3, 40],
      [4, 4, 8],
      [5, 33, 72],
      [8, 36, 16],
      [9, 66, 96],
      [13, 70, 136],
    ]) {
      const { w, x } = randomProblem(T * 1000 + rows * 10 + cols, T, rows, cols);
      const y = runMatmul(rts.rt1, w, x, T, rows, cols);
      for (let t = 0; t < T; t++) {
        for (let r = 0; r < rows; r++) {
          const ref = dotRef(w, r * cols, x, t * cols, cols);
          expect(Object.is(y[t * rows + r], ref) || y[t * rows + r] === ref, `T=${T} rows=${rows} cols=${cols} t=${t} r=${r}`).toBe(true);
        }
      }
    }
  });

  it("gives each token the same bits alone as inside a multi-token matmul", () => {
    const T = 11,
      rows = 45,
      cols = 128;
    const { w, x } = randomProblem(7, T, rows, cols);
    const all = runMatmul(rts.rt1, w, x, T, rows, cols);
    for (let t = 0; t < T; t++) {
      const one = runMatmul(rts.rt1, w, x.slice(t * cols, (t + 1) * cols), 1, rows, cols);
      expect(Buffer.from(one.buffer).equals(Buffer.from(all.slice(t * rows, (t + 1) * rows).buffer))).toBe(true);
    }
  });

  it("gives the same bits on one and two threads", () => {
    for (const [T, rows, cols] of [
      [1, 600, 64],
      [4, 301, 96],
      [7, 1000, 40],
    ]) {
      const { w, x } = randomProblem(T + rows, T, rows, cols);
      const a = runMatmul(rts.rt1, w, x, T, rows, cols);
      const b = runMatmul(rts.rt2, w, x, T, rows, cols);
      expect(Buffer.from(a.buffer).equals(Buffer.from(b.buffer))).toBe(true);
    }
  });

  it("is not a no-op: the result tracks the float64 dot product", () => {
    const { w, x } = randomProblem(3, 1, 4, 64);
    const y = runMatmul(rts.rt1, w, x, 1, 4, 64);
    for (let r = 0; r < 4; r++) {
      let s = 0;
      for (let i = 0; i < 64; i++) s += bf16ToF32(w[r * 64 + i]) * x[i];
      expect(Math.abs(y[r] - s)).toBeLessThan(1e-4 * (1 + Math.abs(s)));
    }
  });
});

describe("memory", () => {
  it("hands out zeroed blocks, also when reusing freed memory (from the free list or the top)", () => {
    const a = rts.rt1.alloc(4096);
    const b = rts.rt1.alloc(1000);
    rts.rt1.u8.fill(7, a, a + 4096);
    rts.rt1.u8.fill(9, b, b + 1000);
    rts.rt1.free(b, 1000); // the top moves back to b
    rts.rt1.free(a, 4096); // and then back to a
    const c = rts.rt1.alloc(3000); // reuses a's dirty bytes
    const d = rts.rt1.alloc(8192); // over the rest of a and all of b
    expect(c).toBe(a);
    const e = rts.rt1.alloc(64);
    rts.rt1.u8.fill(5, e, e + 64);
    const f = rts.rt1.alloc(64);
    rts.rt1.free(e, 64); // not at the top: goes to the free list
    const g = rts.rt1.alloc(64);
    expect(g).toBe(e);
    expect(rts.rt1.u8.subarray(g, g + 64).every((x) => x === 0)).toBe(true);
    rts.rt1.free(f, 64);
    expect(rts.rt1.u8.subarray(c, c + 3000).every((x) => x === 0)).toBe(true);
    expect(rts.rt1.u8.subarray(d, d + 8192).every((x) => x === 0)).toBe(true);
  });
});

describe("other kernels", () => {
  it("packX reorders blocks of 8 as even then odd and groups tokens in quads", () => {
    const T = 5,
      cols = 16;
    const x = new Float32Array(T * cols).map((_, i) => i);
    const p = put(rts.rt1, x),
      q = rts.rt1.alloc(x.byteLength);
    rts.rt1.packX(p, q, T, cols);
    const got = [...rts.rt1.f32.slice(q >> 2, (q >> 2) + T * cols)];
    const perm = (t: number, b: number): number[] => [0, 2, 4, 6, 1, 3, 5, 7].map((k) => t * cols + b * 8 + k);
    const want = [...[0, 1].flatMap((b) => [0, 1, 2, 3].flatMap((t) => perm(t, b))), ...perm(4, 0), ...perm(4, 1)];
    expect(got).toEqual(want);
  });

  it("the weight image interleaves 4-row groups per 8-column block and keeps tail rows plain", () => {
    const rows = 6,
      cols = 16;
    const w = new Uint16Array(rows * cols).map((_, i) => i);
    const img = new Uint16Array(rows * cols);
    interleaveRows(w, img, 0, rows, cols);
    for (let r = 0; r < rows; r++) for (let c = 0; c < cols; c++) expect(img[imageIndex(r, c, rows, cols)]).toBe(r * cols + c);
    expect([...img.slice(0, 16)]).toEqual([0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23]);
    expect([...img.slice(64)]).toEqual([...w.slice(64)]);
  });

  it("rmsnorm equals its reference", () => {
    const r = rand(11);
    const x = new Float32Array(576).map(() => r() * 4);
    const w = new Float32Array(576).map(() => 1 + r());
    const xp = put(rts.rt1, x),
      wp = put(rts.rt1, w),
      op = rts.rt1.alloc(576 * 4);
    rts.rt1.rmsnorm(xp, wp, op, 576, 1e-5);
    expect(Buffer.from(rts.rt1.f32.slice(op >> 2, (op >> 2) + 576).buffer).equals(Buffer.from(rmsnormRef(x, w, 1e-5).buffer))).toBe(true);
  });

  it("attention scores and values read the cache layout and equal their references", () => {
    const r = rand(5);
    const S = 23,
      D = 16;
    for (const n of [1, 3, 4, 5, 17, 23]) {
      const q = new Float32Array(D).map(() => r());
      const k = new Uint16Array(D * S).map(() => f32ToBf16(r()));
      const v = new Uint16Array(S * D).map(() => f32ToBf16(r()));
      const p = new Float32Array(n).map(() => r() + 0.5);
      const qp = put(rts.rt1, q),
        kp = put(rts.rt1, k),
        vp = put(rts.rt1, v),
        pp = put(rts.rt1, p);
      const sp = rts.rt1.alloc((S + 4) * 4),
        op = rts.rt1.alloc(D * 4);
      rts.rt1.attnScores(qp, kp, S, D, n, sp);
      rts.rt1.attnValues(pp, vp, D, n, op);
      expect(Buffer.from(rts.rt1.f32.slice(sp >> 2, (sp >> 2) + n).buffer).equals(Buffer.from(attnScoresRef(q, k, S, D, n).buffer))).toBe(true);
      expect(Buffer.from(rts.rt1.f32.slice(op >> 2, (op >> 2) + D).buffer).equals(Buffer.from(attnValuesRef(p, v, D, n).buffer))).toBe(true);
    }
  });
});
