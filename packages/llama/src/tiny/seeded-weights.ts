// Deterministic pseudo-random weights: xoshiro128** seeded per tensor from (seed, tensor name),
// approximately normal values from a sum of four uniforms (integer and basic float arithmetic
// only, so the bits are the same on every platform and Node version), rounded to bf16.

import { f32ToBf16 } from "../checkpoint/bf16-convert.ts";

function splitmix32(state: number): () => number {
  let s = state >>> 0;
  return () => {
    s = (s + 0x9e3779b9) >>> 0;
    let z = s;
    z = Math.imul(z ^ (z >>> 16), 0x85ebca6b) >>> 0;
    z = Math.imul(z ^ (z >>> 13), 0xc2b2ae35) >>> 0;
    return (z ^ (z >>> 16)) >>> 0;
  };
}

/** 32-bit FNV-1a of a string's UTF-16 code units. */
export function nameHash(name: string): number {
  let h = 0x811c9dc5;
  for (let i = 0; i < name.length; i++) h = Math.imul(h ^ name.charCodeAt(i), 0x01000193) >>> 0;
  return h;
}

/** A xoshiro128** generator of unsigned 32-bit integers. */
export function xoshiro128(seed: number): () => number {
  const init = splitmix32(seed);
  let a = init(),
    b = init(),
    c = init(),
    d = init();
  if ((a | b | c | d) === 0) a = 1;
  return () => {
    const result = Math.imul(rotl(Math.imul(b, 5), 7), 9) >>> 0;
    const t = b << 9;
    c ^= a;
    d ^= b;
    b ^= c;
    a ^= d;
    c ^= t;
    d = rotl(d, 11);
    return result;
  };
}

function rotl(x: number, k: number): number {
  return ((x << k) | (x >>> (32 - k))) >>> 0;
}

const SQRT3 = 1.7320508075688772;

/**
 * `count` bf16 values, approximately normal(mean, std), for tensor `name` under `seed`. Returns the
 * little-endian bytes ready for a safetensors file. Without `mean` the values are centred on 0.
 */
export function seededNormalBf16(seed: number, name: string, count: number, std: number, mean?: number): Uint8Array {
  const next = xoshiro128((seed ^ nameHash(name)) >>> 0);
  const out = new Uint16Array(count);
  const scale = (SQRT3 * std) / 65536;
  const centre = 4 * 32767.5;
  for (let i = 0; i < count; i++) {
    const r1 = next();
    const r2 = next();
    const sum = (r1 >>> 16) + (r1 & 0xffff) + (r2 >>> 16) + (r2 & 0xffff);
    const v = (sum - centre) * scale;
    out[i] = f32ToBf16(mean === undefined ? v : mean + v);
  }
  return new Uint8Array(out.buffer);
}

/** `count` f32 values, approximately normal(0, std), for tensor `name` under `seed` (the draws of seededNormalBf16, not rounded to bf16). */
export function seededNormalF32(seed: number, name: string, count: number, std: number): Float32Array {
  const next = xoshiro128((seed ^ nameHash(name)) >>> 0);
  const out = new Float32Array(count);
  const scale = (SQRT3 * std) / 65536;
  const centre = 4 * 32767.5;
  for (let i = 0; i < count; i++) {
    const r1 = next();
    const r2 = next();
    out[i] = ((r1 >>> 16) + (r1 & 0xffff) + (r2 >>> 16) + (r2 & 0xffff) - centre) * scale;
  }
  return out;
}

/** `count` bf16 copies of `value` as little-endian bytes. */
export function constantBf16(value: number, count: number): Uint8Array {
  return new Uint8Array(new Uint16Array(count).fill(f32ToBf16(value)).buffer);
}
