// The element-wise kernels (exp, SwiGLU, softmax, RoPE + K/V append, the fused attention) against
// plain-JS references that perform the same f32 operations in the same order: bit-equal.
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { bf16Bits } from "../model/llama-model.ts";
import { RopeTable } from "../model/rope.ts";
import { KernelRuntime } from "./kernel-runtime.ts";

const f = Math.fround;

function rand(seed: number): () => number {
  let a = seed >>> 0;
  return () => {
    a = (Math.imul(a, 1664525) + 1013904223) >>> 0;
    return a / 2 ** 32 - 0.5;
  };
}

/** IEEE round half to even (f32x4.nearest). */
function nearestEven(v: number): number {
  const fl = Math.floor(v);
  const d = v - fl;
  if (d < 0.5) return fl;
  if (d > 0.5) return fl + 1;
  return fl % 2 === 0 ? fl : fl + 1;
}

/** The kernel's exp, one f32 operation at a time (see $exp4 in wat/kernels.wat). */
function expRef(x0: number): number {
  const x = f(Math.max(Math.min(f(x0), 88), -87));
  if (Number.isNaN(x)) return NaN;
  const k = nearestEven(f(x * f(Math.LOG2E)));
  const r = f(f(x - f(k * f(0.693359375))) - f(k * f(-2.1219444e-4)));
  let p = f(1.98756915e-4);
  p = f(f(p * r) + f(1.3981999507e-3));
  p = f(f(p * r) + f(8.3334519073e-3));
  p = f(f(p * r) + f(4.1665795894e-2));
  p = f(f(p * r) + f(1.6666665459e-1));
  p = f(f(p * r) + f(5.0000001201e-1));
  p = f(f(f(p * f(r * r)) + r) + 1);
  return f(p * 2 ** k);
}

function softmaxRef(x: Float32Array, scale: number): Float32Array {
  const z = x.map((v) => f(v * scale));
  let max = -Infinity;
  for (const v of z) if (v > max) max = v;
  const e = z.map((v) => expRef(f(v - max)));
  let sum = 0;
  for (const v of e) sum = f(sum + v);
  const inv = f(1 / sum);
  return e.map((v) => f(v * inv));
}

function same(a: Float32Array, b: Float32Array): boolean {
  return Buffer.from(a.buffer, a.byteOffset, a.byteLength).equals(Buffer.from(b.buffer, b.byteOffset, b.byteLength));
}

let rt: KernelRuntime;
beforeAll(async () => {
  rt = await KernelRuntime.create({ threads: 1 });
});
afterAll(() => rt.close());

function put(data: Float32Array | Uint16Array, extraBytes = 0): number {
  const p = rt.alloc(data.byteLength + extraBytes);
  if (data instanceof Float32Array) rt.f32.set(data, p >> 2);
  else rt.u16.set(data, p >> 1);
  return p;
}

describe("element-wise kernels", () => {
  it("exp equals its reference over the range, the clamps and special values, and stays within 1.5 ulp of e^x", () => {
    const r = rand(1);
    const xs = [0, -0, 1, -1, 88, 88.5, 100, -87, -87.5, -100, Infinity, -Infinity, 1e-8, -1e-8, 0.34657359, -0.34657359];
    for (let i = 0; i < 4000; i++) xs.push(r() * 180);
    while (xs.length % 4) xs.push(0);
    const src = put(Float32Array.from(xs));
    const dst = rt.alloc(xs.length * 4);
    rt.expF32(src, dst, xs.length);
    const got = rt.f32.slice(dst >> 2, (dst >> 2) + xs.length);
    expect(same(got, Float32Array.from(xs, expRef))).toBe(true);
    for (let i = 0; i < xs.length; i++) {
      const x = f(xs[i]);
      if (!(x >= -87 && x <= 88)) continue;
      const want = Math.exp(x);
      expect(Math.abs(got[i] - want) / (want * 2 ** -23)).toBeLessThan(1.5);
    }
    const nan = put(Float32Array.from([NaN, 0, 0, 0]));
    rt.expF32(nan, dst, 4);
    expect(Number.isNaN(rt.f32[dst >> 2])).toBe(true);
  });

  it("swiglu equals silu(gate) * up per token", () => {
    const r = rand(2);
    const I = 20,
      T = 3;
    const gu = new Float32Array(T * 2 * I).map(() => r() * 30);
    const gp = put(gu),
      ap = rt.alloc(T * I * 4);
    rt.swiglu(gp, ap, I, T);
    const want = new Float32Array(T * I);
    for (let t = 0; t < T; t++) {
      for (let i = 0; i < I; i++) {
        const g = gu[t * 2 * I + i];
        want[t * I + i] = f(f(g / f(1 + expRef(-g))) * gu[t * 2 * I + I + i]);
      }
    }
    expect(same(rt.f32.slice(ap >> 2, (ap >> 2) + T * I), want)).toBe(true);
  });

  it("geglu equals gelu_tanh(gate) * up per token, in its documented f32 operations, within 1e-5 of the tanh formula", () => {
    const r = rand(3);
    const I = 20,
      T = 3;
    const gu = new Float32Array(T * 2 * I).map(() => r() * 12);
    const gp = put(gu),
      ap = rt.alloc(T * I * 4);
    rt.geglu(gp, ap, I, T);
    const c1 = f(2 * Math.sqrt(2 / Math.PI));
    const c2 = f(2 * Math.sqrt(2 / Math.PI) * 0.044715); // the f32 of the double product, as the WAT literal
    const want = new Float32Array(T * I);
    let far = 0;
    for (let t = 0; t < T; t++) {
      for (let i = 0; i < I; i++) {
        const g = gu[t * 2 * I + i];
        const up = gu[t * 2 * I + I + i];
        const u2 = f(g * f(c1 + f(c2 * f(g * g))));
        want[t * I + i] = f(f(g / f(1 + expRef(-u2))) * up);
        // the textbook form, in float64
        const exact = 0.5 * g * (1 + Math.tanh(Math.sqrt(2 / Math.PI) * (g + 0.044715 * g ** 3))) * up;
        far = Math.max(far, Math.abs(want[t * I + i] - exact) / Math.max(1, Math.abs(exact)));
      }
    }
    expect(same(rt.f32.slice(ap >> 2, (ap >> 2) + T * I), want)).toBe(true);
    expect(far).toBeLessThan(1e-5);
  });

  it("softmax scales, subtracts the max, sums in order and normalises, for every length", () => {
    const r = rand(3);
    for (const n of [1, 2, 3, 4, 5, 16, 17, 63]) {
      const x = new Float32Array(n).map(() => r() * 20);
      const p = put(x, 64);
      rt.softmax(p, n, f(0.125));
      expect(same(rt.f32.slice(p >> 2, (p >> 2) + n), softmaxRef(x, f(0.125)))).toBe(true);
    }
  });

  it("rope_kv rotates like RopeTable.apply and appends K/V rounded to bf16 at the layout's places", () => {
    const r = rand(4);
    for (const D of [4, 8, 12, 64]) {
      for (const [H, KV] of [
        [4, 2],
        [9, 3],
      ]) {
        for (const pos of [0, 5, 40]) {
          const S = 48;
          const rope = new RopeTable(D, 10000, null);
          rope.ensure(pos + 1);
          const n = (H + 2 * KV) * D;
          const x = new Float32Array(n).map(() => r() * 8);
          x[1] = NaN;
          const xp = put(x);
          const half = D / 2;
          const cs = new Float32Array(D);
          for (let i = 0; i < half; i++) {
            cs[i] = rope.cos[pos * half + i];
            cs[half + i] = rope.sin[pos * half + i];
          }
          const csp = put(cs);
          const kL = rt.alloc(KV * D * S * 2),
            vL = rt.alloc(KV * D * S * 2);
          rt.ropeKv(xp, csp, H + KV, D, xp + H * D * 4, KV, kL + pos * 2, vL + pos * D * 2, S);
          const want = Float32Array.from(x);
          rope.apply(want, 0, H + KV, D, pos);
          expect(same(rt.f32.slice(xp >> 2, (xp >> 2) + n), want)).toBe(true);
          const bits = new Uint32Array(want.buffer);
          for (let g = 0; g < KV; g++) {
            for (let d = 0; d < D; d++) {
              expect(rt.u16[(kL >> 1) + (g * D + d) * S + pos]).toBe(bf16Bits(bits[H * D + g * D + d]));
              expect(rt.u16[(vL >> 1) + (g * S + pos) * D + d]).toBe(bf16Bits(bits[(H + KV) * D + g * D + d]));
            }
          }
        }
      }
    }
  });

  it("attention equals scores, softmax and values head by head (GQA)", () => {
    const r = rand(5);
    const S = 40,
      H = 6,
      KV = 2,
      group = 3;
    for (const D of [4, 36, 64]) {
      for (const n of [1, 7, 16, 33, 40]) {
        const q = new Float32Array(H * D).map(() => r() * 2);
        const k = new Uint16Array(KV * D * S).map(() => bf16Bits(new Uint32Array(Float32Array.of(r()).buffer)[0]));
        const v = new Uint16Array(KV * S * D).map(() => bf16Bits(new Uint32Array(Float32Array.of(r()).buffer)[0]));
        const qp = put(q),
          kp = put(k),
          vp = put(v),
          sp = rt.alloc((S + 4) * 4),
          op = rt.alloc(H * D * 4);
        const scale = f(1 / Math.sqrt(D));
        rt.attention(qp, kp, vp, S, D, n, H, group, scale, sp, op);
        const want = new Float32Array(H * D);
        const w = (u: number): number => new Float32Array(Uint32Array.of(u << 16).buffer)[0];
        for (let h = 0; h < H; h++) {
          const g = Math.floor(h / group);
          const sc = new Float32Array(n);
          for (let s = 0; s < n; s++) {
            let acc = 0;
            for (let d = 0; d < D; d++) acc = f(acc + f(q[h * D + d] * w(k[(g * D + d) * S + s])));
            sc[s] = acc;
          }
          const p = softmaxRef(sc, scale);
          for (let d = 0; d < D; d++) {
            let acc = 0;
            for (let s = 0; s < n; s++) acc = f(acc + f(p[s] * w(v[(g * S + s) * D + d])));
            want[h * D + d] = acc;
          }
        }
        expect(same(rt.f32.slice(op >> 2, (op >> 2) + H * D), want)).toBe(true);
      }
    }
  });
  it("paged attention and its four-query tiles give the bits of the contiguous attention, query by query, also under a sliding window", async () => {
    const r = rand(11);
    const H = 6,
      KV = 2,
      group = 3,
      D = 64;
    for (const bs of [4, 16]) {
      const S = 48;
      const nb = S / bs;
      // the same K/V twice: contiguous (K [KV][D][S], V [KV][S][D]) and in scattered blocks of bs
      const k = new Uint16Array(KV * D * S).map(() => bf16Bits(new Uint32Array(Float32Array.of(r()).buffer)[0]));
      const v = new Uint16Array(KV * S * D).map(() => bf16Bits(new Uint32Array(Float32Array.of(r()).buffer)[0]));
      const kBytes = KV * D * bs * 2;
      const order = Array.from({ length: nb }, (_, j) => (j * 5 + 3) % nb); // block j at slot order[j]
      const blocks = new Uint16Array((nb * 2 * kBytes) / 2);
      for (let j = 0; j < nb; j++) {
        const at = (order[j] * 2 * kBytes) / 2;
        for (let g = 0; g < KV; g++) {
          for (let d = 0; d < D; d++) for (let p = 0; p < bs; p++) blocks[at + (g * D + d) * bs + p] = k[(g * D + d) * S + j * bs + p];
          for (let p = 0; p < bs; p++) for (let d = 0; d < D; d++) blocks[at + kBytes / 2 + (g * bs + p) * D + d] = v[(g * S + j * bs + p) * D + d];
        }
      }
      const kp = put(k),
        vp = put(v),
        bp = put(blocks);
      const table = rt.alloc(nb * 4);
      for (let j = 0; j < nb; j++) rt.u32[(table >> 2) + j] = bp + order[j] * 2 * kBytes;
      const scale = f(1 / Math.sqrt(D));
      const sp = rt.alloc((S + 8) * 4);
      // four consecutive prompt tokens (n = 13..16, 29..32: inside and across blocks) and a
      // decode token's GQA group (three heads, the fourth repeated into a sink)
      for (const ns of [
        [13, 14, 15, 16],
        [29, 30, 31, 32],
        [1, 2, 3, 4],
        [45, 46, 47, 48],
      ]) {
        const q = Array.from({ length: 4 }, () => new Float32Array(H * D).map(() => r() * 2));
        const qp = q.map(put);
        const want = q.map((_, i) => {
          const o = rt.alloc(H * D * 4);
          rt.attention(qp[i], kp, vp, S, D, ns[i], H, group, scale, sp, o);
          const paged = rt.alloc(H * D * 4);
          rt.attentionPaged(qp[i], table, 0, kBytes, bs, D, ns[i], H, group, scale, sp, paged);
          expect(same(rt.f32.slice(paged >> 2, (paged >> 2) + H * D), rt.f32.slice(o >> 2, (o >> 2) + H * D)), `paged, bs ${bs}, n ${ns[i]}`).toBe(true);
          return rt.f32.slice(o >> 2, (o >> 2) + H * D);
        });
        // one tile per head: the four tokens' queries of that head
        const outs = q.map(() => rt.alloc(H * D * 4));
        const desc = rt.alloc(H * 64);
        for (let h = 0; h < H; h++) {
          const g = Math.floor(h / group);
          const w = (desc >> 2) + h * 16;
          for (let i = 0; i < 4; i++) {
            rt.u32[w + i] = qp[i] + h * D * 4;
            rt.u32[w + 4 + i] = ns[i];
            rt.u32[w + 11 + i] = outs[i] + h * D * 4;
          }
          rt.u32[w + 8] = table;
          rt.u32[w + 9] = g * D * bs * 2;
          rt.u32[w + 10] = kBytes + g * bs * D * 2;
        }
        const ps = (S + 16) * 4;
        const scr = rt.alloc(8 * ps);
        rt.attentionTiles(desc, H, bs, D, scale, ps, 0, [scr, scr + 4 * ps]);
        outs.forEach((o, i) => expect(same(rt.f32.slice(o >> 2, (o >> 2) + H * D), want[i]), `tile, bs ${bs}, query ${i} n ${ns[i]}`).toBe(true));
        // a sliding window: query i reads [max(0, n - W), n), the bits of the contiguous attention
        // over a cache that holds only those positions (paged one by one, and in tiles)
        for (const W of [4, 5, 9, 20]) {
          const wantW = q.map((_, i) => {
            const st = Math.max(0, ns[i] - W);
            const S2 = ns[i] - st;
            const k2 = new Uint16Array(KV * D * S2);
            const v2 = new Uint16Array(KV * S2 * D);
            for (let g = 0; g < KV; g++)
              for (let p = 0; p < S2; p++) {
                for (let d = 0; d < D; d++) k2[(g * D + d) * S2 + p] = k[(g * D + d) * S + st + p];
                for (let d = 0; d < D; d++) v2[(g * S2 + p) * D + d] = v[(g * S + st + p) * D + d];
              }
            const o = rt.alloc(H * D * 4);
            rt.attention(qp[i], put(k2), put(v2), S2, D, S2, H, group, scale, sp, o);
            const paged = rt.alloc(H * D * 4);
            rt.attentionPaged(qp[i], table, 0, kBytes, bs, D, ns[i], H, group, scale, sp, paged, W);
            const expected = rt.f32.slice(o >> 2, (o >> 2) + H * D);
            expect(same(rt.f32.slice(paged >> 2, (paged >> 2) + H * D), expected), `paged, window ${W}, bs ${bs}, n ${ns[i]}`).toBe(true);
            return expected;
          });
          for (let h = 0; h < H; h++) rt.u32[(desc >> 2) + h * 16 + 15] = W;
          rt.attentionTiles(desc, H, bs, D, scale, ps, 0, [scr, scr + 4 * ps]);
          outs.forEach((o, i) => expect(same(rt.f32.slice(o >> 2, (o >> 2) + H * D), wantW[i]), `tile, window ${W}, bs ${bs}, query ${i} n ${ns[i]}`).toBe(true));
          // and the window changes the result once n passes it (the test can see a window)
          if (ns[3] > W) expect(same(wantW[3], want[3])).toBe(false);
          for (let h = 0; h < H; h++) rt.u32[(desc >> 2) + h * 16 + 15] = 0;
        }
      }
    }
  });
});
