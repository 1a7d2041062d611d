// The pickers' arithmetic, pure, shared by the endpoint picker and the gateway: when an endpoint
// is saturated (GIE v1.5.0's thresholds), how a candidate scores (a weighted sum of queue, KV
// usage, running requests and the prompt's matched prefix), and which candidate wins. No clocks,
// no I/O: each picker feeds it what it saw (the epp its scrapes, the gateway its own counts).

/** Why an endpoint was picked (a label of the pick counters; round_robin: a request without a body). */
export type PickReason = "least_loaded" | "prefix_affinity" | "only_candidate" | "fail_open" | "round_robin" | "local_prefill" | "random";

/** The load the saturation check reads. */
export interface Load {
  waiting: number;
  kvUsage: number;
}

/** GIE v1.5.0's saturation detector defaults: queue depth 5, KV cache utilisation 0.8. */
export interface SaturationLimits {
  /** More requests waiting than this saturates an endpoint. */
  maxWaiting: number;
  /** A KV usage (0-1) above this saturates an endpoint. */
  maxKvUsage: number;
}
export const DEFAULT_SATURATION: SaturationLimits = { maxWaiting: 5, maxKvUsage: 0.8 };

/**
 * Weights of the score's terms. The default prefix weight is larger than the most the load
 * terms can differ between two unsaturated endpoints (2 + 2 x 0.8 + 1 = 4.6), so a full prefix
 * match wins over any load difference short of saturation, and a partial one in proportion.
 */
export interface Weights {
  queue: number;
  kvUsage: number;
  running: number;
  prefix: number;
}
export const DEFAULT_WEIGHTS: Weights = { queue: 2, kvUsage: 2, running: 1, prefix: 6 };

/** One endpoint as the scorer sees it. */
export interface Candidate {
  /** Requests waiting as scraped plus picks made since the scrape was sent. */
  waiting: number;
  running: number;
  /** 0-1. */
  kvUsage: number;
  /** Leading prompt blocks this endpoint took last (0 when affinity does not apply). */
  prefixBlocks: number;
  /** Picks not yet in its scraped figures (ties go to the fewest). */
  pending: number;
}

/** True when the scraped load is past either limit (picks not yet scraped do not count). */
export function isSaturated(load: Load, limits: SaturationLimits = DEFAULT_SATURATION): boolean {
  return load.waiting > limits.maxWaiting || load.kvUsage > limits.maxKvUsage;
}

/** Min-max normalisation where lower is better: 1 for the smallest value, 0 for the largest, 1 for all when they are equal. */
export function lowerIsBetter(values: number[]): number[] {
  const min = Math.min(...values);
  const max = Math.max(...values);
  return values.map((v) => (max === min ? 1 : (max - v) / (max - min)));
}

/** Each candidate's score; `blocks` is how many prompt blocks were hashed (the prefix term is matched / blocks). */
export function scores(cands: Candidate[], weights: Weights, blocks: number): number[] {
  const queue = lowerIsBetter(cands.map((c) => c.waiting));
  const running = lowerIsBetter(cands.map((c) => c.running));
  return cands.map(
    (c, i) =>
      weights.queue * queue[i] +
      weights.kvUsage * (1 - Math.min(1, Math.max(0, c.kvUsage))) +
      weights.running * running[i] +
      (blocks > 0 ? (weights.prefix * c.prefixBlocks) / blocks : 0),
  );
}

export interface Choice {
  index: number;
  reason: PickReason;
}

/**
 * The best candidate: highest score; among equal scores the fewest pending picks, then the one at
 * or after `turn` (so equals take turns). Throws on an empty list.
 */
export function choose(cands: Candidate[], weights: Weights, blocks: number, turn = 0): Choice {
  if (cands.length === 0) throw new Error("choose() needs at least one candidate");
  if (cands.length === 1) return { index: 0, reason: "only_candidate" };
  const s = scores(cands, weights, blocks);
  const top = Math.max(...s);
  let best = -1;
  for (let k = 0; k < cands.length; k++) {
    const i = (turn + k) % cands.length;
    if (s[i] < top - 1e-9) continue;
    if (best < 0 || cands[i].pending < cands[best].pending) best = i;
  }
  return { index: best, reason: cands[best].prefixBlocks > 0 ? "prefix_affinity" : "least_loaded" };
}
