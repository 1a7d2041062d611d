// The LoRA update kernels (kernels.wat lora_update, and lora_update4 / lora_update2 through
// KernelRuntime.loraUpdateRows, on tokens anywhere in a pass) against a scalar reference doing the same f32
// operations in the same order (bit-equal): u = A x per token (four lane sums, then the fixed
// horizontal sum), y += dot(B, u) * scale, for ranks that are and are not multiples of 4, several
// token counts and row strides wider than the matrices (a fused matmul's output), leaving every
// other output value untouched.
import { describe, expect, it } from "vitest";
import { rng } from "./model-helpers/random-checkpoint.ts";
import { kernelRuntimes } from "./model-helpers/runtimes.ts";

const fr = Math.fround;
const runtimes = kernelRuntimes();

/** The kernel's dot product: lane j sums p[4k+j] q[4k+j] in increasing k, then (0+1)+(2+3). */
function dot4(p: Float32Array, pOff: number, q: Float32Array, qOff: number, n: number): number {
  const acc = [0, 0, 0, 0];
  for (let i = 0; i < n; i += 4) for (let j = 0; j < 4; j++) acc[j] = fr(acc[j] + fr(p[pOff + i + j] * q[qOff + i + j]));
  return fr(fr(acc[0] + acc[1]) + fr(acc[2] + acc[3]));
}

interface Case {
  cols: number;
  r: number;
  rows: number;
  T: number;
}

/** y (T rows of yStride floats, the module's rows at rowOffset) after the update, in scalar f32. */
function reference(
  c: Case,
  x: Float32Array,
  xStride: number,
  a: Float32Array,
  bPadded: Float32Array,
  y: Float32Array,
  yStride: number,
  rowOffset: number,
  scale: number,
): Float32Array {
  const rp = (c.r + 3) & ~3;
  const out = y.slice();
  for (let t = 0; t < c.T; t++) {
    const u = new Float32Array(rp);
    for (let j = 0; j < c.r; j++) u[j] = dot4(a, j * c.cols, x, t * xStride, c.cols);
    for (let o = 0; o < c.rows; o++) {
      const at = t * yStride + rowOffset + o;
      out[at] = fr(out[at] + fr(dot4(bPadded, o * rp, u, 0, rp) * fr(scale)));
    }
  }
  return out;
}

const CASES: Case[] = [
  { cols: 8, r: 1, rows: 4, T: 1 },
  { cols: 64, r: 3, rows: 48, T: 5 },
  { cols: 136, r: 8, rows: 64, T: 3 },
  { cols: 32, r: 5, rows: 20, T: 2 },
];

describe("lora_update kernel", () => {
  it.each(CASES)("cols $cols, r $r, rows $rows, $T tokens: the scalar reference's bits, other outputs untouched", (c) => {
    const rt = runtimes.rt1;
    const next = rng(c.cols * 31 + c.r);
    const rand = (n: number) => Float32Array.from({ length: n }, () => fr(next() * 2 - 1));
    const rp = (c.r + 3) & ~3;
    const xStride = c.cols + 8;
    const yStride = c.rows + 12;
    const rowOffset = 8;
    const x = rand(c.T * xStride);
    const a = rand(c.r * c.cols);
    const b = rand(c.rows * rp).map((v, i) => (i % rp < c.r ? v : 0));
    const y = rand(c.T * yStride);
    const scale = 1.7;
    const [px, pa, pb, py, pu] = [x, a, b, y, new Float32Array(rp)].map((v) => {
      const p = rt.alloc(v.byteLength);
      rt.f32.set(v, p >>> 2);
      return p;
    });
    rt.loraUpdate(px, xStride * 4, py + rowOffset * 4, yStride * 4, c.T, { a: pa, b: pb, cols: c.cols, r: c.r, rows: c.rows, scale }, pu);
    const got = rt.f32.slice(py >>> 2, (py >>> 2) + y.length);
    const want = reference(c, x, xStride, a, b, y, yStride, rowOffset, scale);
    expect(Buffer.from(got.buffer).equals(Buffer.from(want.buffer))).toBe(true);
    // the update is not a no-op: every token's rows moved
    for (let t = 0; t < c.T; t++) expect(got[t * yStride + rowOffset]).not.toBe(y[t * yStride + rowOffset]);
    for (const p of [px, pa, pb, py, pu]) rt.free(p, 0);
  });

  it.each([1, 2, 3, 4, 5, 7, 11])("loraUpdateRows (tiles of 4, 2 and 1) on %i tokens picked anywhere in a pass, out of order: each token the scalar reference's bits", (n) => {
    const rt = runtimes.rt1;
    const c: Case = { cols: 72, r: 5, rows: 36, T: 12 };
    const next = rng(n * 977 + 5);
    const rand = (k: number) => Float32Array.from({ length: k }, () => fr(next() * 2 - 1));
    const rp = (c.r + 3) & ~3;
    const [xStride, yStride, rowOffset, scale] = [c.cols + 4, c.rows + 8, 4, 0.37];
    const x = rand(c.T * xStride);
    const a = rand(c.r * c.cols);
    const b = rand(c.rows * rp).map((v, i) => (i % rp < c.r ? v : 0));
    const y = rand(c.T * yStride);
    const [px, pa, pb, py, pu] = [x, a, b, y, new Float32Array(4 * rp)].map((v) => {
      const p = rt.alloc(v.byteLength);
      rt.f32.set(v, p >>> 2);
      return p;
    });
    // n of the 12 tokens, in a scrambled order
    const tokens = Array.from({ length: c.T }, (_, t) => (t * 7 + n) % c.T).slice(0, n);
    const lora = { a: pa, b: pb, cols: c.cols, r: c.r, rows: c.rows, scale };
    rt.loraUpdateRows(
      tokens.map((t) => px + t * xStride * 4),
      tokens.map((t) => py + (t * yStride + rowOffset) * 4),
      lora,
      pu,
    );
    const got = rt.f32.slice(py >>> 2, (py >>> 2) + y.length);
    const all = reference(c, x, xStride, a, b, y, yStride, rowOffset, scale);
    for (let t = 0; t < c.T; t++) {
      const row = (v: Float32Array) => Buffer.from(v.slice(t * yStride, (t + 1) * yStride).buffer);
      // a token in the list gets the reference's update, any other keeps its row as it was
      expect(row(got).equals(row(tokens.includes(t) ? all : y)), `token ${t}`).toBe(true);
    }
    for (const p of [px, pa, pb, py, pu]) rt.free(p, 0);
  });
});
