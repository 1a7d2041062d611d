import { expect, test } from "vitest";
import { choose, DEFAULT_WEIGHTS, isSaturated, lowerIsBetter, scores, type Candidate } from "./scoring.ts";

const cand = (c: Partial<Candidate>): Candidate => ({ waiting: 0, running: 0, kvUsage: 0, prefixBlocks: 0, pending: 0, ...c });

test("saturation uses GIE's limits: more than 5 waiting or KV usage over 0.8", () => {
  expect(isSaturated({ waiting: 5, kvUsage: 0.8 })).toBe(false);
  expect(isSaturated({ waiting: 6, kvUsage: 0 })).toBe(true);
  expect(isSaturated({ waiting: 0, kvUsage: 0.81 })).toBe(true);
});

test("min-max normalisation: lowest 1, highest 0, all equal 1", () => {
  expect(lowerIsBetter([2, 4, 3])).toEqual([1, 0, 0.5]);
  expect(lowerIsBetter([7, 7])).toEqual([1, 1]);
});

test("the score is the weighted sum of queue, free KV, running and the prefix share", () => {
  const s = scores([cand({ waiting: 0, running: 4, kvUsage: 0.5, prefixBlocks: 2 }), cand({ waiting: 10, running: 0, kvUsage: 0 })], DEFAULT_WEIGHTS, 4);
  expect(s[0]).toBeCloseTo(2 * 1 + 2 * 0.5 + 1 * 0 + (6 * 2) / 4);
  expect(s[1]).toBeCloseTo(2 * 0 + 2 * 1 + 1 * 1 + 0);
});

test("the least loaded wins; equals take turns, the fewest pending first", () => {
  expect(choose([cand({ waiting: 3 }), cand({ waiting: 1 }), cand({ waiting: 2 })], DEFAULT_WEIGHTS, 0)).toEqual({ index: 1, reason: "least_loaded" });
  const equal = [cand({}), cand({}), cand({})];
  expect([0, 1, 2, 3].map((t) => choose(equal, DEFAULT_WEIGHTS, 0, t).index)).toEqual([0, 1, 2, 0]);
  expect(choose([cand({ pending: 2 }), cand({ pending: 1 }), cand({ pending: 2 })], DEFAULT_WEIGHTS, 0, 2).index).toBe(1);
});

test("a full prefix match beats any load difference short of saturation; no match is least_loaded", () => {
  const loaded = cand({ waiting: 5, running: 8, kvUsage: 0.8, prefixBlocks: 4 });
  const idle = cand({ waiting: 0, running: 0, kvUsage: 0 });
  expect(choose([idle, loaded], DEFAULT_WEIGHTS, 4)).toEqual({ index: 1, reason: "prefix_affinity" });
  expect(choose([idle, { ...loaded, prefixBlocks: 1 }], DEFAULT_WEIGHTS, 4)).toEqual({ index: 0, reason: "least_loaded" });
  expect(choose([loaded], DEFAULT_WEIGHTS, 4)).toEqual({ index: 0, reason: "only_candidate" });
  expect(() => choose([], DEFAULT_WEIGHTS, 0)).toThrow();
});
