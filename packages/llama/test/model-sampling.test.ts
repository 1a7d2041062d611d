// Sampling: greedy ties, parameter checks, and the counter-based draw (same (seed, position) ->
// same token in any process or call order; the distribution follows temperature/min-p/top-k/top-p,
// min-p in vLLM's place: after temperature, before top-k and top-p).
import { describe, expect, it } from "vitest";
import { argmax, counterUniform, sample, tokenLogprobs } from "../src/sampling/sample.ts";

const logits = new Float32Array([1, 3, 3, 0.5, 2.9, -1, 3, 0]);

describe("greedy", () => {
  it("takes the largest logit and breaks ties to the lowest id", () => {
    expect(argmax(logits)).toBe(1);
    expect(sample(logits, {}, 0)).toBe(1);
    expect(sample(logits, { temperature: 0, seed: 9 }, 5)).toBe(1);
    expect(argmax(new Float32Array([-Infinity, -Infinity]))).toBe(0);
    expect(argmax(new Float32Array([NaN, 1, NaN, 2]))).toBe(3);
  });
});

describe("counter-based draw", () => {
  it("depends only on (seed, position) and spreads over [0, 1)", () => {
    expect(counterUniform(7, 100)).toBe(counterUniform(7, 100));
    expect(counterUniform(7, 100)).not.toBe(counterUniform(7, 101));
    expect(counterUniform(7, 100)).not.toBe(counterUniform(8, 100));
    const xs = Array.from({ length: 20000 }, (_, i) => counterUniform(3, i));
    expect(Math.min(...xs)).toBeGreaterThanOrEqual(0);
    expect(Math.max(...xs)).toBeLessThan(1);
    const mean = xs.reduce((a, b) => a + b, 0) / xs.length;
    expect(Math.abs(mean - 0.5)).toBeLessThan(0.01);
    const buckets = new Array(10).fill(0);
    for (const x of xs) buckets[Math.floor(x * 10)]++;
    for (const b of buckets) expect(Math.abs(b - 2000)).toBeLessThan(200);
  });

  it("gives the same token for the same (seed, position) regardless of call order", () => {
    const p = { temperature: 1.3, topP: 0.9, topK: 5, seed: 42 };
    const forward = Array.from({ length: 50 }, (_, pos) => sample(logits, p, pos));
    const backward = Array.from({ length: 50 }, (_, i) => sample(logits, p, 49 - i)).reverse();
    expect(backward).toEqual(forward);
    expect(new Set(forward).size).toBeGreaterThan(1);
    const other = Array.from({ length: 50 }, (_, pos) => sample(logits, { ...p, seed: 43 }, pos));
    expect(other).not.toEqual(forward);
  });
});

describe("filters", () => {
  const draws = (p: Parameters<typeof sample>[1], n = 4000): Map<number, number> => {
    const m = new Map<number, number>();
    for (let pos = 0; pos < n; pos++) {
      const t = sample(logits, p, pos);
      m.set(t, (m.get(t) ?? 0) + 1);
    }
    return m;
  };

  it("top-k keeps the k best ids (ties by lowest id)", () => {
    expect([...draws({ temperature: 1, topK: 2, seed: 1 }).keys()].sort()).toEqual([1, 2]);
    expect([...draws({ temperature: 1, topK: 1, seed: 1 }).keys()]).toEqual([1]);
    expect([...draws({ temperature: 5, topK: 4, seed: 2 }).keys()].sort()).toEqual([1, 2, 4, 6]);
  });

  it("top-p keeps the smallest prefix reaching the mass", () => {
    // at T=1 the sorted masses are ids 1, 2, 6 (0.239 each), 4 (0.216), then the rest
    expect([...draws({ temperature: 1, topP: 0.45, seed: 3 }).keys()].sort()).toEqual([1, 2]);
    expect([...draws({ temperature: 1, topP: 0.5, seed: 3 }).keys()].sort()).toEqual([1, 2, 6]);
    expect([...draws({ temperature: 1, topP: 0.9, seed: 3 }).keys()].sort()).toEqual([1, 2, 4, 6]);
    const all = [...draws({ temperature: 1, topP: 1, seed: 3 }, 20000).keys()].sort();
    expect(all).toEqual([0, 1, 2, 3, 4, 5, 6, 7]);
  });

  it("follows the softmax at the given temperature", () => {
    const l = new Float32Array([0, Math.log(3)]); // p = 1/4, 3/4 at T=1
    let ones = 0;
    for (let pos = 0; pos < 20000; pos++) ones += sample(l, { temperature: 1, seed: 11 }, pos);
    expect(Math.abs(ones / 20000 - 0.75)).toBeLessThan(0.015);
    let hot = 0;
    for (let pos = 0; pos < 20000; pos++) hot += sample(l, { temperature: 1e6, seed: 11 }, pos);
    expect(Math.abs(hot / 20000 - 0.5)).toBeLessThan(0.015);
  });

  it("handles a large vocabulary with top-p without sorting everything (same result as a full sort)", () => {
    const V = 49152;
    const big = new Float32Array(V).map((_, i) => Math.sin(i * 12.9898) * 8);
    for (let pos = 0; pos < 20; pos++) {
      const p = { temperature: 0.7, topP: 0.8, seed: 5 };
      const t = sample(big, p, pos);
      // full-sort reference
      const ids = Array.from({ length: V }, (_, i) => i).sort((a, b) => big[b] - big[a] || a - b);
      const max = big[ids[0]];
      const w = (i: number): number => Math.exp((big[i] - max) / 0.7);
      let total = 0;
      for (let i = 0; i < V; i++) total += w(i);
      const kept: number[] = [];
      let cum = 0;
      for (const i of ids) {
        kept.push(i);
        cum += w(i);
        if (cum / total >= 0.8) break;
      }
      let kt = 0;
      for (const i of kept) kt += w(i);
      const target = counterUniform(5, pos) * kt;
      let c2 = 0,
        ref = kept.at(-1)!;
      for (const i of kept) {
        c2 += w(i);
        if (c2 > target) {
          ref = i;
          break;
        }
      }
      expect(t).toBe(ref);
    }
  });

  it("rejects out-of-range parameters with ConfigError", () => {
    for (const bad of [
      { temperature: -1 },
      { temperature: NaN },
      { topP: 0 },
      { topP: 1.5 },
      { topK: -2 },
      { topK: 1.5 },
      { minP: -0.1 },
      { minP: 1.5 },
      { minP: NaN },
      { seed: -1 },
      { seed: 2 ** 32 },
    ]) {
      expect(() => sample(logits, { temperature: 1, ...bad }, 0)).toThrow(expect.objectContaining({ code: "CONFIG" }));
    }
  });
});

describe("min-p", () => {
  // probabilities 0.4, 0.2, 0.15, 0.1, 0.08, 0.05, 0.02 at temperature 1
  const probs = new Float32Array([0.4, 0.2, 0.15, 0.1, 0.08, 0.05, 0.02].map(Math.log));
  const drawn = (l: Float32Array, p: Parameters<typeof sample>[1], n = 4000): number[] => {
    const seen = new Set<number>();
    for (let pos = 0; pos < n; pos++) seen.add(sample(l, p, pos));
    return [...seen].sort((a, b) => a - b);
  };

  it("keeps exactly the ids with probability >= min_p x the largest", () => {
    // 0.3 x 0.4 = 0.12: 0.15 stays, 0.1 goes
    expect(drawn(probs, { temperature: 1, minP: 0.3, seed: 1 })).toEqual([0, 1, 2]);
    expect(drawn(probs, { temperature: 1, minP: 0.3, topK: 5, seed: 1 })).toEqual([0, 1, 2]);
    // 0.45 x 0.4 = 0.18: 0.2 stays, 0.15 goes
    expect(drawn(probs, { temperature: 1, minP: 0.45, seed: 2 })).toEqual([0, 1]);
    expect(drawn(probs, { temperature: 1, minP: 1, seed: 2 })).toEqual([0]);
    expect(drawn(probs, { temperature: 1, minP: 0.01, seed: 3 }, 20000)).toEqual([0, 1, 2, 3, 4, 5, 6]);
    // the draw follows the renormalised survivors: 0.4 / 0.6 of id 0 at min_p 0.45
    let zeros = 0;
    for (let pos = 0; pos < 20000; pos++) zeros += sample(probs, { temperature: 1, minP: 0.45, seed: 4 }, pos) === 0 ? 1 : 0;
    expect(Math.abs(zeros / 20000 - 2 / 3)).toBeLessThan(0.015);
  });

  it("0 changes nothing, and greedy ignores it", () => {
    for (const extra of [{}, { topK: 4 }, { topP: 0.9 }]) {
      const off = Array.from({ length: 300 }, (_, pos) => sample(logits, { temperature: 1.2, seed: 8, ...extra }, pos));
      const zero = Array.from({ length: 300 }, (_, pos) => sample(logits, { temperature: 1.2, seed: 8, minP: 0, ...extra }, pos));
      expect(zero).toEqual(off);
      expect(new Set(off).size).toBeGreaterThan(2);
    }
    expect(sample(probs, { temperature: 0, minP: 1, seed: 1 }, 3)).toBe(0);
    expect(sample(logits, { minP: 0.9 }, 0)).toBe(1);
  });

  it("applies to the temperature-scaled distribution, as vLLM does", () => {
    // probabilities 0.5, 0.3, 0.2; min_p 0.5. On the raw distribution (min-p before temperature)
    // ids 0 and 1 stay at any temperature. After temperature 2 the ratios are sqrt(0.6), sqrt(0.4),
    // both >= 0.5: all three stay; after temperature 0.5 they are 0.36, 0.16: only id 0 stays.
    const l = new Float32Array([0.5, 0.3, 0.2].map(Math.log));
    for (const topK of [undefined, 3]) {
      expect(drawn(l, { temperature: 2, minP: 0.5, topK, seed: 5 })).toEqual([0, 1, 2]);
      expect(drawn(l, { temperature: 0.5, minP: 0.5, topK, seed: 5 })).toEqual([0]);
      expect(drawn(l, { temperature: 1, minP: 0.5, topK, seed: 5 })).toEqual([0, 1]);
    }
  });

  it("comes before top-k and top-p: top-p is the mass of what min-p kept", () => {
    // min_p 0.3 keeps 0.4, 0.2, 0.15 (renormalised 0.533, 0.267, 0.2): top_p 0.75 then keeps ids 0
    // and 1 (0.8). Top-p on the unfiltered masses (0.4 + 0.2 = 0.6 < 0.75) would keep id 2 too.
    expect(drawn(probs, { temperature: 1, minP: 0.3, topP: 0.75, seed: 6 })).toEqual([0, 1]);
    expect(drawn(probs, { temperature: 1, minP: 0.3, topP: 0.75, topK: 6, seed: 6 })).toEqual([0, 1]);
    expect(drawn(probs, { temperature: 1, topP: 0.75, seed: 6 })).toEqual([0, 1, 2]);
    // top-k of what min-p kept: min_p 0.3 and top_k 2
    expect(drawn(probs, { temperature: 1, minP: 0.3, topK: 2, seed: 7 })).toEqual([0, 1]);
  });
});

describe("tokenLogprobs", () => {
  it("is the log-softmax of the raw logits at the token and the top ids (ties to the lower id), computed in f64", () => {
    const logits = Float32Array.from([1, 3, 3, -2, 0.5]);
    const lse = Math.log([1, 3, 3, -2, 0.5].reduce((s, v) => s + Math.exp(v), 0));
    const r = tokenLogprobs(logits, 4, 3);
    expect(r.token).toBe(4);
    expect(r.logprob).toBeCloseTo(0.5 - lse, 12);
    expect(r.top.map((t) => t.token)).toEqual([1, 2, 0]);
    expect(r.top[0].logprob).toBeCloseTo(3 - lse, 12);
    expect(r.top.reduce((s, t) => s + Math.exp(t.logprob), 0) + Math.exp(-2 - lse) + Math.exp(0.5 - lse)).toBeCloseTo(1, 12);
    expect(tokenLogprobs(logits, 0, 0).top).toEqual([]);
    expect(tokenLogprobs(logits, 0, 99).top).toHaveLength(5);
  });

  it("does not overflow on large logits and treats NaN as impossible; refuses a token outside the vocabulary", () => {
    const big = Float32Array.from([1e30, 1e30 - 1e24, Number.NaN]);
    const r = tokenLogprobs(big, 2, 2);
    expect(r.logprob).toBe(-Infinity);
    expect(r.top.map((t) => t.token)).toEqual([0, 1]);
    expect(Number.isFinite(r.top[0].logprob)).toBe(true);
    expect(tokenLogprobs(Float32Array.from([Number.POSITIVE_INFINITY, 0]), 0, 1).logprob).toBe(0);
    expect(() => tokenLogprobs(big, 3, 1)).toThrow(/not an id/);
  });
});
