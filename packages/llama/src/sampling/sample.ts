// Next-token choice from logits: greedy (ties to the lowest id) or temperature / min-p / top-k /
// top-p (vLLM's order) with a counter-based random draw keyed by (seed, position), so a sequence sampled across two
// processes (prefill here, decode there) equals the one sampled in one process. Knows nothing
// of the model or the tokenizer.
import { ConfigError, type SamplingParams, type TokenHistory, type TokenLogprobs } from "@airm/rm-core";

export type { SamplingParams, TokenLogprobs } from "@airm/rm-core";

/** Index of the largest value, the lowest index among equals. NaN never wins. */
export function argmax(logits: Float32Array): number {
  let best = 0;
  let bestValue = -Infinity;
  let found = false;
  for (let i = 0; i < logits.length; i++) {
    const v = logits[i];
    if (v > bestValue || (!found && v === bestValue)) {
      best = i;
      bestValue = v;
      found = true;
    }
  }
  return best;
}

function mix32(h: number): number {
  h = Math.imul(h ^ (h >>> 16), 0x7feb352d);
  h = Math.imul(h ^ (h >>> 15), 0x846ca68b);
  return (h ^ (h >>> 16)) >>> 0;
}

/**
 * Uniform double in [0, 1) that depends only on (seed, position, stream): a stateless hash,
 * so any process computes the same draw for the same token position.
 */
export function counterUniform(seed: number, position: number, stream = 0): number {
  const s = seed >>> 0;
  const p = position >>> 0;
  const a = mix32(mix32(s ^ 0x9e3779b9) ^ p ^ Math.imul(stream + 1, 0x85ebca6b));
  const b = mix32(a ^ 0x632be5ab ^ mix32(p + 0x27d4eb2f));
  return (a * 2 ** 21 + (b >>> 11)) / 2 ** 53;
}

/**
 * Sets every id the bitmask does not allow to -Infinity, in place (bit `i & 31` of word `i >> 5`:
 * id `i` allowed; ids past the mask's words are disallowed). Throws ConfigError when the mask
 * allows no id of this vocabulary: there would be nothing to sample.
 */
export function applyTokenMask(logits: Float32Array, mask: Int32Array): void {
  const V = logits.length;
  let allowed = 0;
  for (let w = 0; w * 32 < V; w++) {
    const bits = w < mask.length ? mask[w] : 0;
    const start = w * 32;
    const end = Math.min(start + 32, V);
    if (bits === -1 && end - start === 32) {
      allowed += 32;
      continue;
    }
    if (bits === 0) {
      logits.fill(-Infinity, start, end);
      continue;
    }
    for (let i = start; i < end; i++) {
      if ((bits >>> (i - start)) & 1) allowed++;
      else logits[i] = -Infinity;
    }
  }
  if (allowed === 0) throw new ConfigError("constraint", "the grammar allows no token of this vocabulary at this position");
}

/**
 * `logits` adjusted (a copy; the caller's stay the model's): each [id, bias] added, then vLLM's
 * penalties: repetition (ids of the prompt or the completion: a positive logit divided by it, a
 * negative one multiplied), then frequency (times each id came out) and presence (ids that came
 * out) subtracted.
 */
function adjusted(logits: Float32Array, p: SamplingParams, history: TokenHistory | undefined): Float32Array {
  const out = logits.slice();
  for (const [id, b] of p.logitBias ?? []) out[id] += b;
  if (!history) return out;
  const r = p.repetitionPenalty ?? 1;
  if (r !== 1) {
    const seen = new Set<number>(history.prompt);
    for (const id of history.output.keys()) seen.add(id);
    for (const id of seen) {
      if (id < 0 || id >= out.length) continue;
      const v = out[id];
      out[id] = v > 0 ? v / r : v * r;
    }
  }
  const f = p.frequencyPenalty ?? 0;
  const pr = p.presencePenalty ?? 0;
  if (f !== 0 || pr !== 0) for (const [id, count] of history.output) if (id >= 0 && id < out.length) out[id] -= f * count + pr;
  return out;
}

/** True when the params change the logits before sampling (a bias or a penalty). */
function adjusts(p: SamplingParams): boolean {
  return (p.logitBias?.length ?? 0) > 0 || (p.repetitionPenalty ?? 1) !== 1 || (p.frequencyPenalty ?? 0) !== 0 || (p.presencePenalty ?? 0) !== 0;
}

function checkParams(p: SamplingParams): void {
  if (p.temperature !== undefined && !(Number.isFinite(p.temperature) && p.temperature >= 0)) {
    throw new ConfigError("temperature", `must be a finite number >= 0, got ${p.temperature}`);
  }
  if (p.topP !== undefined && !(p.topP > 0 && p.topP <= 1)) throw new ConfigError("top_p", `must be in (0, 1], got ${p.topP}`);
  if (p.topK !== undefined && !(Number.isInteger(p.topK) && p.topK >= 0)) throw new ConfigError("top_k", `must be an integer >= 0, got ${p.topK}`);
  if (p.minP !== undefined && !(p.minP >= 0 && p.minP <= 1)) throw new ConfigError("min_p", `must be in [0, 1], got ${p.minP}`);
  if (p.seed !== undefined && !(Number.isInteger(p.seed) && p.seed >= 0 && p.seed <= 0xffffffff)) {
    throw new ConfigError("seed", `must be an integer in [0, 2^32), got ${p.seed}`);
  }
  for (const [name, v, ok] of [
    ["presence_penalty", p.presencePenalty, (x: number) => x >= -2 && x <= 2],
    ["frequency_penalty", p.frequencyPenalty, (x: number) => x >= -2 && x <= 2],
    ["repetition_penalty", p.repetitionPenalty, (x: number) => x > 0 && x <= 10],
  ] as const) {
    if (v !== undefined && !ok(v)) throw new ConfigError(name, `out of range: ${v}`);
  }
}

/** Throws ConfigError naming logit_bias for an id outside [0, vocabSize) or a bias outside [-100, 100]. */
export function checkLogitBias(bias: [number, number][] | undefined, vocabSize: number): void {
  for (const [id, b] of bias ?? []) {
    if (!Number.isInteger(id) || id < 0 || id >= vocabSize) throw new ConfigError("logit_bias", `token id ${id} is not an id of this vocabulary [0, ${vocabSize})`);
    if (!(b >= -100 && b <= 100)) throw new ConfigError("logit_bias", `the bias of token ${id} must be in [-100, 100], got ${b}`);
  }
}

/** Orders ids by logit descending, then id ascending. */
function byLogitThenId(logits: Float32Array): (a: number, b: number) => number {
  return (a, b) => logits[b] - logits[a] || a - b;
}

/**
 * Picks the next token id. `position` is the index the sampled token will have in the sequence
 * (prompt length for the first generated token). `logitBias` and the penalties (over `history`:
 * the prompt and the completion so far) come first, on a copy (see adjusted). Greedy
 * when temperature is 0 or undefined (min-p, top-k and top-p then change nothing). Otherwise, in
 * vLLM's order: scale by 1/temperature; min-p keeps the ids whose probability is at least min-p
 * times the largest one's (of the scaled distribution); top-k keeps the k best of those (logit
 * desc, id asc); softmax (f64) over what is left, top-p keeps its smallest prefix reaching the
 * mass, and the draw is `counterUniform(seed, position)`. Throws ConfigError for out-of-range
 * parameters.
 */
export function sample(logits: Float32Array, p: SamplingParams, position: number, history?: TokenHistory): number {
  checkParams(p);
  if (adjusts(p)) {
    checkLogitBias(p.logitBias, logits.length);
    logits = adjusted(logits, p, history);
  }
  if (!p.temperature) return argmax(logits);
  const V = logits.length;
  const invT = 1 / p.temperature;
  const topK = p.topK && p.topK < V ? p.topK : 0;
  const topP = p.topP ?? 1;
  const minP = p.minP ?? 0;
  const u = counterUniform(p.seed ?? 0, position);
  return topK > 0 ? sampleTopK(logits, invT, topK, minP, topP, u) : sampleAll(logits, invT, minP, topP, u);
}

/** Draws from `cand` (in its order) with the weights `w` of its ids, their sum `total` and the uniform `u`. */
function draw(cand: ArrayLike<number>, w: (i: number) => number, total: number, u: number): number {
  const target = u * total;
  let cum = 0;
  for (let j = 0; j < cand.length; j++) {
    cum += w(cand[j]);
    if (cum > target) return cand[j];
  }
  return cand[cand.length - 1];
}

/** The smallest prefix of `sorted` (by logit desc, id asc) whose mass reaches top-p of `total`, or null when it does not. */
function nucleus(sorted: number[], w: (i: number) => number, total: number, topP: number): number[] | null {
  let cum = 0;
  for (let j = 0; j < sorted.length; j++) {
    cum += w(sorted[j]);
    if (cum / total >= topP) return sorted.slice(0, j + 1);
  }
  return null;
}

/**
 * Top-k first (the k best, sorted), then temperature, min-p, top-p and the draw. Same ids as
 * vLLM's min-p before top-k: a weight below is the probability over the largest one's, and the
 * largest is among the k best, so min-p cuts the same tail of them either way.
 */
function sampleTopK(logits: Float32Array, invT: number, topK: number, minP: number, topP: number, u: number): number {
  let cand = selectTopK(logits, topK);
  if (cand.length === 0) return argmax(logits);
  const max = logits[cand[0]];
  if (max === Infinity || max === -Infinity) return argmax(logits);
  const w = (i: number): number => Math.exp((logits[i] - max) * invT);
  if (minP > 0) {
    // cand is sorted by weight desc: the ids kept are a prefix (the first has weight 1 >= minP)
    let n = 1;
    while (n < cand.length && w(cand[n]) >= minP) n++;
    cand = cand.slice(0, n);
  }
  let total = 0;
  for (const i of cand) total += w(i);
  if (topP < 1) {
    cand = nucleus(cand, w, total, topP) ?? cand;
    total = 0;
    for (const i of cand) total += w(i);
  }
  return draw(cand, w, total, u);
}

/** Reused weights of the whole vocabulary (the sampler runs synchronously, one call at a time). */
let weights = new Float64Array(0);

/**
 * Temperature (then min-p and top-p) over the whole vocabulary, the sums in the order the
 * definition fixes: the total in id order; the nucleus, when top-p is set, in (logit desc, id
 * asc) order. An id min-p removes weighs 0. The nucleus is a prefix of that order, so only the
 * ids above a logit threshold are sorted, the threshold lowered until the sorted ids hold it.
 */
function sampleAll(logits: Float32Array, invT: number, minP: number, topP: number, u: number): number {
  const V = logits.length;
  let max = -Infinity;
  let last = -1;
  for (let i = 0; i < V; i++) {
    const v = logits[i];
    if (Number.isNaN(v)) continue;
    last = i;
    if (v > max) max = v;
  }
  if (last < 0 || max === Infinity || max === -Infinity) return argmax(logits);
  if (weights.length < V) weights = new Float64Array(V);
  const wt = weights;
  let total = 0;
  for (let i = 0; i < V; i++) {
    const v = logits[i];
    // the weight is the probability over the largest one's (the best id weighs 1): min-p's ratio
    let x = Number.isNaN(v) ? 0 : Math.exp((v - max) * invT);
    if (x < minP) x = 0;
    wt[i] = x;
    total += x;
  }
  const w = (i: number): number => wt[i];
  if (topP >= 1) {
    const target = u * total;
    let cum = 0;
    for (let i = 0; i < V; i++) {
      cum += wt[i];
      if (cum > target) return i;
    }
    while (wt[last] === 0) last--; // rounding: the last id that can be drawn
    return last;
  }
  const order = byLogitThenId(logits);
  for (let reach = 8; ; reach *= 2) {
    // Ids within `reach` (in units of the scaled logit) of the best, sorted; the nucleus when they hold it.
    const floor = reach > 64 ? -Infinity : max - reach / invT;
    const top: number[] = [];
    for (let i = 0; i < V; i++) if (logits[i] >= floor) top.push(i);
    top.sort(order);
    const kept = nucleus(top, w, total, topP) ?? (floor === -Infinity ? top : null);
    if (!kept) continue;
    let keptTotal = 0;
    for (const i of kept) keptTotal += wt[i];
    return draw(kept, w, keptTotal, u);
  }
}

/** The k largest ids by (logit desc, id asc), in that order. NaN logits are skipped. */
export function selectTopK(logits: Float32Array, k: number): number[] {
  const cmp = byLogitThenId(logits);
  const heap: number[] = []; // kept sorted, small k in practice
  for (let i = 0; i < logits.length; i++) {
    if (Number.isNaN(logits[i])) continue;
    if (heap.length === k && cmp(i, heap[k - 1]) >= 0) continue;
    let lo = 0,
      hi = heap.length;
    while (lo < hi) {
      const mid = (lo + hi) >> 1;
      if (cmp(heap[mid], i) <= 0) lo = mid + 1;
      else hi = mid;
    }
    heap.splice(lo, 0, i);
    if (heap.length > k) heap.pop();
  }
  return heap;
}

/**
 * Log-softmax of `logits` at `token` and at the `top` most likely ids (logit desc, id asc): the
 * raw distribution before temperature, top-k and top-p. The log-sum-exp runs in f64 over the f32
 * logits (max first, so no overflow); NaN logits count as impossible. Throws ConfigError for a
 * token outside the vocabulary or a negative `top`.
 */
export function tokenLogprobs(logits: Float32Array, token: number, top: number): TokenLogprobs {
  if (!Number.isInteger(token) || token < 0 || token >= logits.length) throw new ConfigError("token", `${token} is not an id in [0, ${logits.length})`);
  if (!Number.isInteger(top) || top < 0) throw new ConfigError("top_logprobs", `must be an integer >= 0, got ${top}`);
  let max = -Infinity;
  for (let i = 0; i < logits.length; i++) if (logits[i] > max) max = logits[i];
  let sum = 0;
  for (let i = 0; i < logits.length; i++) {
    const v = logits[i];
    if (!Number.isNaN(v)) sum += Math.exp(v - max);
  }
  const lse = max + Math.log(sum);
  // With an infinite logit the distribution is a point mass on it (on all of them, evenly).
  const lp = Number.isFinite(max)
    ? (i: number): number => (Number.isNaN(logits[i]) ? -Infinity : logits[i] - lse)
    : (i: number): number => (logits[i] === max ? 0 - Math.log(countOf(logits, max)) : -Infinity);
  return { token, logprob: lp(token), top: top > 0 ? selectTopK(logits, Math.min(top, logits.length)).map((t) => ({ token: t, logprob: lp(t) })) : [] };
}

function countOf(values: Float32Array, v: number): number {
  let n = 0;
  for (const x of values) if (x === v) n++;
  return n;
}
