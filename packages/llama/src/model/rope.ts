// Rotary position embedding tables (rotate_half convention of Hugging Face Llama/Qwen2), with
// Llama 3.1 "llama3" frequency scaling. Knows angles; the model applies them to q and k.
import { ConfigError } from "@airm/rm-core";
import type { RopeScaling } from "../checkpoint-types.ts";

const f = Math.fround;

/** Inverse frequencies (f32), one per rotated pair, after optional llama3 scaling or GGUF frequency factors. */
export function ropeInverseFrequencies(headDim: number, theta: number, scaling: RopeScaling | null): Float32Array {
  const half = headDim >> 1;
  const inv = new Float32Array(half);
  for (let i = 0; i < half; i++) inv[i] = 1 / theta ** ((2 * i) / headDim);
  if (scaling?.type === "freq_factors") {
    if (scaling.factors.length !== half) throw new ConfigError("ropeScaling", `has ${scaling.factors.length} frequency factors, head_dim ${headDim} needs ${half}`);
    for (let i = 0; i < half; i++) inv[i] = inv[i] / scaling.factors[i];
  } else if (scaling) {
    const { factor, lowFreqFactor, highFreqFactor, originalMaxPositionEmbeddings: old } = scaling;
    const lowWavelen = old / lowFreqFactor;
    const highWavelen = old / highFreqFactor;
    for (let i = 0; i < half; i++) {
      const freq = inv[i];
      const wavelen = (2 * Math.PI) / freq;
      if (wavelen < highWavelen) continue;
      if (wavelen > lowWavelen) inv[i] = freq / factor;
      else {
        const smooth = (old / wavelen - lowFreqFactor) / (highFreqFactor - lowFreqFactor);
        inv[i] = (1 - smooth) * (freq / factor) + smooth * freq;
      }
    }
  }
  return inv;
}

/** cos/sin per position, grown on demand: row p holds half values for position p. */
export class RopeTable {
  private readonly inv: Float32Array;
  private readonly half: number;
  cos = new Float32Array(0);
  sin = new Float32Array(0);
  private positions = 0;

  constructor(headDim: number, theta: number, scaling: RopeScaling | null) {
    this.inv = ropeInverseFrequencies(headDim, theta, scaling);
    this.half = headDim >> 1;
  }

  /** Makes rows [0, upTo) available. */
  ensure(upTo: number): void {
    if (upTo <= this.positions) return;
    const n = Math.max(upTo, this.positions * 2, 64);
    const cos = new Float32Array(n * this.half);
    const sin = new Float32Array(n * this.half);
    cos.set(this.cos);
    sin.set(this.sin);
    for (let p = this.positions; p < n; p++) {
      for (let i = 0; i < this.half; i++) {
        const angle = f(p * this.inv[i]);
        cos[p * this.half + i] = Math.cos(angle);
        sin[p * this.half + i] = Math.sin(angle);
      }
    }
    this.cos = cos;
    this.sin = sin;
    this.positions = n;
  }

  /** Rotates `heads` consecutive heads of `headDim` f32 values at `x[off..]` for position `pos`. */
  apply(x: Float32Array, off: number, heads: number, headDim: number, pos: number): void {
    const half = this.half;
    const base = pos * half;
    const cos = this.cos;
    const sin = this.sin;
    for (let h = 0; h < heads; h++) {
      const o = off + h * headDim;
      for (let i = 0; i < half; i++) {
        const a = x[o + i];
        const b = x[o + i + half];
        const c = cos[base + i];
        const s = sin[base + i];
        x[o + i] = f(a * c) - f(b * s);
        x[o + i + half] = f(b * c) + f(a * s);
      }
    }
  }
}
