// The sampler's fast paths (weights computed once; with top-p, only the ids above a logit
// threshold sorted) pick exactly the token of its straightforward definition, kept here as the
// reference: every candidate, sums in id order, the whole vocabulary sorted for top-p, and
// min-p as vLLM applies it (on the probabilities of the whole temperature-scaled vocabulary,
// before top-k). Random logits (with ties, NaN and infinities), temperatures, min-p, top-k, top-p
// and seeds.
import { describe, expect, it } from "vitest";
import { counterUniform, sample, selectTopK, type SamplingParams } from "../src/sampling/sample.ts";
import { rng } from "./model-helpers/random-checkpoint.ts";

function referenceSample(logits: Float32Array, p: SamplingParams, position: number): number {
  const V = logits.length;
  if (!p.temperature) throw new Error("reference is for sampled draws");
  const invT = 1 / p.temperature;
  const topK = p.topK && p.topK < V ? p.topK : 0;
  const topP = p.topP ?? 1;
  const order = (a: number, b: number) => logits[b] - logits[a] || a - b;
  const ids = [...Array(V).keys()].filter((i) => !Number.isNaN(logits[i]));
  if (ids.length === 0) return -1;
  let max = -Infinity;
  for (const i of ids) if (logits[i] > max) max = logits[i];
  if (max === Infinity || max === -Infinity) return -1;
  const weight = (i: number) => Math.exp((logits[i] - max) * invT);
  // min-p: the probabilities of the whole scaled vocabulary against the largest, then top-k of the rest
  let sum = 0;
  for (const i of ids) sum += weight(i);
  const prob = (i: number) => weight(i) / sum;
  const pMax = Math.max(...ids.map(prob));
  const kept = new Set(ids.filter((i) => prob(i) >= (p.minP ?? 0) * pMax));
  let cand: number[] = topK > 0 ? selectTopK(logits, topK).filter((i) => kept.has(i)) : ids.filter((i) => kept.has(i));
  let total = 0;
  for (const i of cand) total += weight(i);
  if (topP < 1) {
    if (topK === 0) cand = [...cand].sort(order);
    const kept: number[] = [];
    let cum = 0;
    for (const i of cand) {
      kept.push(i);
      cum += weight(i);
      if (cum / total >= topP) break;
    }
    cand = kept;
    total = 0;
    for (const i of cand) total += weight(i);
  }
  const target = counterUniform(p.seed ?? 0, position) * total;
  let cum = 0;
  for (const i of cand) {
    cum += weight(i);
    if (cum > target) return i;
  }
  return cand[cand.length - 1];
}

describe("sampler fast paths", () => {
  it("pick the reference's token on 3000 random draws", () => {
    const r = rng(42);
    let checked = 0;
    for (let n = 0; n < 3000; n++) {
      const V = [2, 7, 100, 1000, 5000][n % 5];
      const scale = [0.1, 1, 5, 30][Math.floor(r() * 4)];
      const logits = new Float32Array(V);
      for (let i = 0; i < V; i++) logits[i] = Math.round((r() - 0.5) * scale * 8) / 8; // coarse: many ties
      if (r() < 0.1) logits[Math.floor(r() * V)] = Number.NaN;
      if (r() < 0.05) logits[Math.floor(r() * V)] = -Infinity;
      const p: SamplingParams = { temperature: [0.2, 0.7, 1, 1.5, 2][Math.floor(r() * 5)], seed: Math.floor(r() * 2 ** 32) };
      if (r() < 0.5) p.topP = [0.1, 0.5, 0.9, 0.95, 0.999][Math.floor(r() * 5)];
      if (r() < 0.3) p.topK = 1 + Math.floor(r() * 60);
      if (r() < 0.4) p.minP = [0.001, 0.05, 0.1, 0.3, 0.9, 1][Math.floor(r() * 6)];
      const position = Math.floor(r() * 1000);
      const want = referenceSample(logits, p, position);
      if (want < 0) continue;
      expect(sample(logits, p, position), JSON.stringify({ n, V, p, position })).toBe(want);
      checked++;
    }
    expect(checked).toBeGreaterThan(2500);
  });
});
