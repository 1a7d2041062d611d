// The one KV layout, rngd-pd/v2 (paged), and its byte geometry. KV lives in blocks of
// `blockSize` positions; within a block, per layer, K is [kv_heads, head_dim, block_size] and V
// is [kv_heads, block_size, head_dim], bf16. A request's KV crosses as one blob per (layer, K|V):
// its blocks in position order, concatenated, the positions past n in the last block zero. Every
// package takes the geometry from here: the model's block pool, the engines, the manifest and
// the transports.

import type { KVBlobs, KVDtype } from "./contracts.ts";

export type { KVDtype } from "./contracts.ts";
import { KVIntegrityError } from "./errors.ts";

/** The only KV layout: paged, see the module comment. */
export const KV_LAYOUT = "rngd-pd/v2";

/** Bytes per element of each KV dtype. */
export const KV_DTYPE_BYTES: Record<KVDtype, number> = { bf16: 2, fp16: 2 };

/** Positions per KV block unless configured (vLLM's default `--block-size`). */
export const DEFAULT_BLOCK_SIZE = 16;
/** Block sizes the kernels take: multiples of 4 (attention reads positions in groups of 4 that never cross a block). */
export const BLOCK_SIZES = [4, 8, 16, 32, 64, 128, 256] as const;

export interface KVGeometry {
  layers: number;
  kvHeads: number;
  headDim: number;
}

/** Throws KVIntegrityError("blockSize") for a block size the kernels cannot read. */
export function checkBlockSize(blockSize: number): number {
  if (!(BLOCK_SIZES as readonly number[]).includes(blockSize)) {
    throw new KVIntegrityError("blockSize", `KV block size ${JSON.stringify(blockSize)} is not one of ${BLOCK_SIZES.join(", ")}`);
  }
  return blockSize;
}

/** Blocks that hold `n` positions. */
export function blocksFor(n: number, blockSize: number): number {
  return Math.ceil(n / blockSize);
}

/**
 * The first block a query at position `n` or later reads in a layer with a sliding window of
 * `window` positions (a query at p reads [p + 1 - window, p]); the blocks before it are dead.
 */
export function firstLiveBlock(n: number, window: number, blockSize: number): number {
  return Math.max(0, Math.floor((n + 1 - window) / blockSize));
}

/** Bytes of one layer's K (or V) of one block: kv_heads x head_dim x block_size x element size. */
export function blockLayerBytes(g: Pick<KVGeometry, "kvHeads" | "headDim">, blockSize: number, dtype: KVDtype = "bf16"): number {
  return g.kvHeads * g.headDim * blockSize * KV_DTYPE_BYTES[dtype];
}

/** Bytes of one blob (one layer's K or V of a request holding `n` positions). */
export function layerBlobBytes(g: Pick<KVGeometry, "kvHeads" | "headDim">, blockSize: number, n: number, dtype: KVDtype = "bf16"): number {
  return blocksFor(n, blockSize) * blockLayerBytes(g, blockSize, dtype);
}

/** Bytes a request of `n` positions moves (K and V, every layer, whole blocks). */
export function requestKVBytes(g: KVGeometry, blockSize: number, n: number): number {
  return 2 * g.layers * layerBlobBytes(g, blockSize, n);
}

/** Bytes of KV per position (K and V, every layer): what one token holds in the cache. */
export function bytesPerPosition(g: KVGeometry, dtype: KVDtype = "bf16"): number {
  return 2 * g.layers * g.kvHeads * g.headDim * KV_DTYPE_BYTES[dtype];
}

/** Throws KVIntegrityError naming the field when `kv` does not fit the geometry. */
export function checkKVBlobs(g: KVGeometry, kv: KVBlobs): void {
  checkBlockSize(kv.blockSize);
  if (!Number.isInteger(kv.n) || kv.n < 1) throw new KVIntegrityError("n", `KV holds n=${kv.n} positions; it must be an integer >= 1`);
  if (kv.k.length !== g.layers || kv.v.length !== g.layers) {
    throw new KVIntegrityError("layers", `KV has ${kv.k.length} K and ${kv.v.length} V layers; this model has ${g.layers}`);
  }
  const from = kv.from ?? 0;
  if (!Number.isInteger(from) || from < 0 || from % kv.blockSize !== 0 || from >= kv.n) {
    throw new KVIntegrityError("from", `KV from=${kv.from} must be a multiple of the block size ${kv.blockSize} below n=${kv.n}`);
  }
  const want = layerBlobBytes(g, kv.blockSize, kv.n) - (from / kv.blockSize) * blockLayerBytes(g, kv.blockSize);
  for (let l = 0; l < g.layers; l++) {
    if (kv.k[l].length !== want || kv.v[l].length !== want) {
      throw new KVIntegrityError(
        "shape",
        `layer ${l}: K ${kv.k[l].length} / V ${kv.v[l].length} bytes, expected ${want} (${blocksFor(kv.n, kv.blockSize) - from / kv.blockSize} blocks x ${g.kvHeads} kv heads x ${g.headDim} x ${kv.blockSize} positions x bf16)`,
      );
    }
  }
}

/**
 * Zeroes the positions at and past `from` (within [0, blockSize)) of one block's layer K slice
 * ([kv_heads, head_dim, block_size]): what an exported last block holds past n, so its bytes do
 * not depend on what the block held before.
 */
export function zeroBlockTailK(g: Pick<KVGeometry, "kvHeads" | "headDim">, blockSize: number, from: number, k: Uint8Array): void {
  if (from >= blockSize) return;
  for (let r = 0; r < g.kvHeads * g.headDim; r++) k.fill(0, (r * blockSize + from) * 2, (r + 1) * blockSize * 2);
}

/** As zeroBlockTailK, for a V slice ([kv_heads, block_size, head_dim]). */
export function zeroBlockTailV(g: Pick<KVGeometry, "kvHeads" | "headDim">, blockSize: number, from: number, v: Uint8Array): void {
  if (from >= blockSize) return;
  const run = g.headDim * 2;
  for (let h = 0; h < g.kvHeads; h++) v.fill(0, (h * blockSize + from) * run, (h + 1) * blockSize * run);
}

/**
 * Gathers positions [0, n) of one layer blob (`blockSize` layout) into a dense K [kv_heads,
 * head_dim, S] and V [kv_heads, S, head_dim] pair at context S >= n: the input shape of a
 * compiled decode graph (the ATOM host-input model). Positions past n stay as they are in the
 * destination.
 */
export function blocksToDense(
  g: Pick<KVGeometry, "kvHeads" | "headDim">,
  blockSize: number,
  n: number,
  k: Uint8Array,
  v: Uint8Array,
  S: number,
  denseK: Uint8Array,
  denseV: Uint8Array,
): void {
  const D = g.headDim;
  const blockBytes = blockLayerBytes(g, blockSize);
  for (let j = 0; j * blockSize < n; j++) {
    const count = Math.min(blockSize, n - j * blockSize);
    const base = j * blockBytes;
    const p0 = j * blockSize;
    for (let r = 0; r < g.kvHeads * D; r++) {
      const src = base + r * blockSize * 2;
      denseK.set(k.subarray(src, src + count * 2), (r * S + p0) * 2);
    }
    for (let h = 0; h < g.kvHeads; h++) {
      const src = base + h * blockSize * D * 2;
      denseV.set(v.subarray(src, src + count * D * 2), (h * S + p0) * D * 2);
    }
  }
}
