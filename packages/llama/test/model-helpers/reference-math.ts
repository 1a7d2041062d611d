// Plain-JS references for the wasm kernels (same summation order, so results must be bit-equal)
// and a float64 Llama forward pass (independent of the kernels, compared with a tolerance).
import type { Checkpoint } from "../../src/checkpoint-types.ts";
import { ropeInverseFrequencies } from "../../src/model/rope.ts";

const fr = Math.fround;
const cvt = new Float32Array(1);
const cvtU = new Uint32Array(cvt.buffer);

export function bf16ToF32(b: number): number {
  cvtU[0] = b << 16;
  return cvt[0];
}

export function f32ToBf16(x: number): number {
  cvt[0] = x;
  const b = cvtU[0];
  return ((b + 0x7fff + ((b >>> 16) & 1)) >>> 16) & 0xffff;
}

/** The kernels' dot product order, written out in scalar f32. x is NOT permuted. */
export function dotRef(w: Uint16Array, wOff: number, x: Float32Array, xOff: number, cols: number): number {
  const acc = [0, 0, 0, 0];
  for (let b = 0; b < cols; b += 8) {
    for (let j = 0; j < 4; j++) acc[j] = fr(acc[j] + fr(bf16ToF32(w[wOff + b + 2 * j]) * x[xOff + b + 2 * j]));
    for (let j = 0; j < 4; j++) acc[j] = fr(acc[j] + fr(bf16ToF32(w[wOff + b + 2 * j + 1]) * x[xOff + b + 2 * j + 1]));
  }
  return fr(fr(acc[0] + acc[1]) + fr(acc[2] + acc[3]));
}

export function rmsnormRef(x: Float32Array, w: Float32Array, eps: number): Float32Array {
  const n = x.length;
  const acc = [0, 0, 0, 0];
  for (let i = 0; i < n; i += 4) for (let j = 0; j < 4; j++) acc[j] = fr(acc[j] + fr(x[i + j] * x[i + j]));
  const ss = fr(fr(acc[0] + acc[1]) + fr(acc[2] + acc[3]));
  const inv = fr(1 / fr(Math.sqrt(fr(fr(ss / n) + fr(eps)))));
  const out = new Float32Array(n);
  for (let i = 0; i < n; i++) out[i] = fr(fr(x[i] * inv) * w[i]);
  return out;
}

/** scores[s] = sum_d q[d] K[d][s], d increasing; K bf16 [D][S]. */
export function attnScoresRef(q: Float32Array, k: Uint16Array, S: number, D: number, n: number): Float32Array {
  const out = new Float32Array(n);
  for (let s = 0; s < n; s++) {
    let acc = 0;
    for (let d = 0; d < D; d++) acc = fr(acc + fr(q[d] * bf16ToF32(k[d * S + s])));
    out[s] = acc;
  }
  return out;
}

/** out[d] = sum_s p[s] V[s][d], s increasing; V bf16 [S][D]. */
export function attnValuesRef(p: Float32Array, v: Uint16Array, D: number, n: number): Float32Array {
  const out = new Float32Array(D);
  for (let d = 0; d < D; d++) {
    let acc = 0;
    for (let s = 0; s < n; s++) acc = fr(acc + fr(p[s] * bf16ToF32(v[s * D + d])));
    out[d] = acc;
  }
  return out;
}

export interface ReferenceForwardOptions {
  /** The weights by HF name; default: the checkpoint's bf16 values. */
  weight?(name: string): Float64Array;
  /** Round K/V to bf16 as the cache does (default true); false keeps them in f64. */
  roundKV?: boolean;
}

/**
 * A float64 Llama/Qwen2/Qwen3/Gemma 3 forward over a whole sequence (causal), by default reading the same bf16
 * weights and rounding K/V to bf16 like the cache. Returns the logits of every position.
 */
export function referenceForward(
  ckpt: Pick<Checkpoint, "config"> & Partial<Pick<Checkpoint, "tensors">>,
  tokens: number[],
  options: ReferenceForwardOptions = {},
): Float64Array<ArrayBufferLike>[] {
  const c = ckpt.config;
  const src = ckpt.tensors;
  const roundKV = options.roundKV ?? true;
  const bf16Weight = (name: string): Float64Array => {
    if (!src) throw new Error(`referenceForward: no tensors and no weight() for ${name}`);
    const info = src.info(name);
    const n = info.shape.reduce((a, b) => a * b, 1);
    const raw = new Uint16Array(n);
    src.readBf16(name, raw);
    const out = new Float64Array(n);
    for (let i = 0; i < n; i++) out[i] = bf16ToF32(raw[i]);
    return out;
  };
  const get = options.weight ?? bf16Weight;
  const H = c.numHeads,
    KV = c.numKvHeads,
    D = c.headDim,
    hid = c.hiddenSize,
    I = c.intermediateSize,
    V = c.vocabSize;
  const T = tokens.length;
  const matvec = (w: Float64Array, x: Float64Array, rows: number, cols: number): Float64Array => {
    const y = new Float64Array(rows);
    for (let r = 0; r < rows; r++) {
      let s = 0;
      for (let i = 0; i < cols; i++) s += w[r * cols + i] * x[i];
      y[r] = s;
    }
    return y;
  };
  const gemma = c.architecture === "gemma3";
  // Gemma's norms multiply by (1 + w)
  const norm = (x: Float64Array, w: Float64Array): Float64Array => {
    let ss = 0;
    for (const v of x) ss += v * v;
    const inv = 1 / Math.sqrt(ss / x.length + c.rmsNormEps);
    return x.map((v, i) => v * inv * (gemma ? 1 + w[i] : w[i]));
  };
  const invGlobal = ropeInverseFrequencies(D, c.ropeTheta, c.ropeScaling);
  const invLocal = c.slidingWindow ? ropeInverseFrequencies(D, c.slidingWindow.ropeTheta, null) : invGlobal;
  let inv = invGlobal;
  const rope = (x: Float64Array, off: number, pos: number): void => {
    const half = D / 2;
    for (let i = 0; i < half; i++) {
      const a = x[off + i],
        b = x[off + i + half];
      const ang = pos * inv[i];
      x[off + i] = a * Math.cos(ang) - b * Math.sin(ang);
      x[off + i + half] = b * Math.cos(ang) + a * Math.sin(ang);
    }
  };
  const emb = get("model.embed_tokens.weight");
  const embScale = gemma ? Math.sqrt(hid) : 1;
  let xs: Float64Array<ArrayBufferLike>[] = tokens.map((t) => emb.slice(t * hid, (t + 1) * hid).map((v) => v * embScale));
  const gelu = (g: number): number => 0.5 * g * (1 + Math.tanh(Math.sqrt(2 / Math.PI) * (g + 0.044715 * g ** 3)));
  for (let l = 0; l < c.numLayers; l++) {
    const p = `model.layers.${l}.`;
    const window = c.slidingWindow?.layers[l] ? c.slidingWindow.window : 0;
    inv = window > 0 ? invLocal : invGlobal;
    const wq = get(`${p}self_attn.q_proj.weight`),
      wk = get(`${p}self_attn.k_proj.weight`),
      wv = get(`${p}self_attn.v_proj.weight`);
    const wo = get(`${p}self_attn.o_proj.weight`);
    const bias = c.attentionBias ? [get(`${p}self_attn.q_proj.bias`), get(`${p}self_attn.k_proj.bias`), get(`${p}self_attn.v_proj.bias`)] : null;
    const qs: Float64Array[] = [],
      ks: Float64Array[] = [],
      vs: Float64Array[] = [];
    for (let t = 0; t < T; t++) {
      const h = norm(xs[t], get(`${p}input_layernorm.weight`));
      const q = matvec(wq, h, H * D, hid),
        k = matvec(wk, h, KV * D, hid),
        v = matvec(wv, h, KV * D, hid);
      if (bias) {
        q.forEach((_, i) => (q[i] += bias[0][i]));
        k.forEach((_, i) => (k[i] += bias[1][i]));
        v.forEach((_, i) => (v[i] += bias[2][i]));
      }
      if (c.architecture === "qwen3" || gemma) {
        // Qwen3: RMSNorm of each q and k head (q_norm / k_norm, head_dim wide) before RoPE
        const qn = get(`${p}self_attn.q_norm.weight`),
          kn = get(`${p}self_attn.k_norm.weight`);
        for (let h2 = 0; h2 < H; h2++) q.set(norm(q.subarray(h2 * D, (h2 + 1) * D), qn), h2 * D);
        for (let g = 0; g < KV; g++) k.set(norm(k.subarray(g * D, (g + 1) * D), kn), g * D);
      }
      for (let h2 = 0; h2 < H; h2++) rope(q, h2 * D, t);
      for (let g = 0; g < KV; g++) rope(k, g * D, t);
      qs.push(q);
      ks.push(roundKV ? k.map((x) => bf16ToF32(f32ToBf16(x))) : k);
      vs.push(roundKV ? v.map((x) => bf16ToF32(f32ToBf16(x))) : v);
    }
    const next: Float64Array<ArrayBufferLike>[] = [];
    for (let t = 0; t < T; t++) {
      const att = new Float64Array(H * D);
      for (let h2 = 0; h2 < H; h2++) {
        const g = Math.floor(h2 / (H / KV));
        // a sliding window: position t reads [t - window + 1, t]
        const first = window > 0 ? Math.max(0, t - window + 1) : 0;
        const sc = new Float64Array(t + 1);
        for (let s = first; s <= t; s++) {
          let d2 = 0;
          for (let d = 0; d < D; d++) d2 += qs[t][h2 * D + d] * ks[s][g * D + d];
          sc[s] = d2 / Math.sqrt(c.queryPreAttnScalar ?? D);
        }
        const m = Math.max(...sc.subarray(first));
        let sum = 0;
        for (let s = first; s <= t; s++) sum += sc[s] = Math.exp(sc[s] - m);
        for (let s = first; s <= t; s++) for (let d = 0; d < D; d++) att[h2 * D + d] += (sc[s] / sum) * vs[s][g * D + d];
      }
      let o = matvec(wo, att, hid, H * D);
      if (gemma) o = norm(o, get(`${p}post_attention_layernorm.weight`));
      const x1 = xs[t].map((v, i) => v + o[i]);
      const h = norm(x1, get(gemma ? `${p}pre_feedforward_layernorm.weight` : `${p}post_attention_layernorm.weight`));
      const gate = matvec(get(`${p}mlp.gate_proj.weight`), h, I, hid),
        up = matvec(get(`${p}mlp.up_proj.weight`), h, I, hid);
      const act = gate.map((g, i) => (gemma ? gelu(g) : g / (1 + Math.exp(-g))) * up[i]);
      let down = matvec(get(`${p}mlp.down_proj.weight`), act, hid, I);
      if (gemma) down = norm(down, get(`${p}post_feedforward_layernorm.weight`));
      next.push(x1.map((v, i) => v + down[i]));
    }
    xs = next;
  }
  const head = c.tieWordEmbeddings ? emb : get("lm_head.weight");
  const fn = get("model.norm.weight");
  return xs.map((x) => matvec(head, norm(x, fn), V, hid));
}
