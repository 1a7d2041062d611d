// The one KV layout, rngd-pd/v1, and its byte geometry: per layer K [kv_heads, head_dim, S] and
// V [kv_heads, S, head_dim], bf16. Blob sizes (what a transport moves per layer and K|V), shape
// checks for imported KV, and copying positions between caches. Every package takes these from
// here: the model's caches, the engines, the manifest and the transports.

import type { KVBlobs } from "./contracts.ts";
import { KVIntegrityError } from "./errors.ts";

/** The only KV layout: K [layers, kv_heads, head_dim, S], V [layers, kv_heads, S, head_dim]. */
export const KV_LAYOUT = "rngd-pd/v1";
export type KVDtype = "bf16" | "fp16";

/** Bytes per element of each KV dtype. */
export const KV_DTYPE_BYTES: Record<KVDtype, number> = { bf16: 2, fp16: 2 };

export interface KVGeometry {
  layers: number;
  kvHeads: number;
  headDim: number;
}

/** Bytes of one blob (one layer's K or V) at context S: kv_heads x head_dim x S x element size. */
export function layerBytes(g: Pick<KVGeometry, "kvHeads" | "headDim">, S: number, dtype: KVDtype = "bf16"): number {
  return g.kvHeads * g.headDim * S * KV_DTYPE_BYTES[dtype];
}

/** Bytes of a whole request's KV (K and V, every layer) at context S. */
export function requestKVBytes(g: KVGeometry, S: number): number {
  return 2 * g.layers * layerBytes(g, S);
}

/** Throws KVIntegrityError naming the field when `kv` does not fit the geometry. */
export function checkKVBlobs(g: KVGeometry, kv: KVBlobs): void {
  if (!Number.isInteger(kv.seqLen) || kv.seqLen < 1) throw new KVIntegrityError("seqLen", `KV seqLen ${kv.seqLen} is not a positive integer`);
  if (!Number.isInteger(kv.n) || kv.n < 0 || kv.n > kv.seqLen) throw new KVIntegrityError("n", `KV holds n=${kv.n} positions, outside [0, ${kv.seqLen}]`);
  if (kv.k.length !== g.layers || kv.v.length !== g.layers) {
    throw new KVIntegrityError("layers", `KV has ${kv.k.length} K and ${kv.v.length} V layers; this model has ${g.layers}`);
  }
  const want = layerBytes(g, kv.seqLen);
  for (let l = 0; l < g.layers; l++) {
    if (kv.k[l].length !== want || kv.v[l].length !== want) {
      throw new KVIntegrityError(
        "shape",
        `layer ${l}: K ${kv.k[l].length} / V ${kv.v[l].length} bytes, expected ${want} (${g.kvHeads} kv heads x ${g.headDim} x S ${kv.seqLen} x bf16)`,
      );
    }
  }
}

/** Copies position `p` of one layer from (srcK, srcV) into (dstK, dstV); both at context S. */
export function copyPosition(g: KVGeometry, S: number, p: number, srcK: Uint8Array, srcV: Uint8Array, dstK: Uint8Array, dstV: Uint8Array): void {
  const rows = g.kvHeads * g.headDim;
  for (let r = 0; r < rows; r++) {
    const o = (r * S + p) * 2;
    dstK[o] = srcK[o];
    dstK[o + 1] = srcK[o + 1];
  }
  const run = g.headDim * 2;
  for (let h = 0; h < g.kvHeads; h++) {
    const o = (h * S + p) * run;
    dstV.set(srcV.subarray(o, o + run), o);
  }
}

/** Copies positions [0, n) of one layer from (srcK, srcV) into (dstK, dstV); both at context S. */
export function copyPrefix(g: KVGeometry, S: number, n: number, srcK: Uint8Array, srcV: Uint8Array, dstK: Uint8Array, dstV: Uint8Array): void {
  if (n <= 0) return;
  if (n === S) {
    dstK.set(srcK);
    dstV.set(srcV);
    return;
  }
  const rows = g.kvHeads * g.headDim;
  for (let r = 0; r < rows; r++) {
    const o = r * S * 2;
    dstK.set(srcK.subarray(o, o + n * 2), o);
  }
  const run = g.headDim * 2;
  for (let h = 0; h < g.kvHeads; h++) {
    const o = h * S * run;
    dstV.set(srcV.subarray(o, o + n * run), o);
  }
}

/** Sets positions [0, n) of one layer's (k, v) at context S to zero (every position when n >= S). */
export function zeroPrefix(g: Pick<KVGeometry, "kvHeads" | "headDim">, S: number, n: number, k: Uint8Array, v: Uint8Array): void {
  if (n <= 0) return;
  if (n >= S) {
    k.fill(0);
    v.fill(0);
    return;
  }
  const rows = g.kvHeads * g.headDim;
  for (let r = 0; r < rows; r++) k.fill(0, r * S * 2, (r * S + n) * 2);
  const run = g.headDim * 2;
  for (let h = 0; h < g.kvHeads; h++) v.fill(0, h * S * run, (h * S + n) * run);
}
