// What a native decode step that takes the KV cache as a host input exchanges with the engine
// (the ATOM execution model): each stream's positions gathered from its blocks (layout
// rngd-pd/v2) into a dense S-wide K/V per layer, and back the logits and the new position's K/V,
// written into the stream's block with writeBlockColumn. cpu-engine.ts drives it through
// NativeHostDecode; the vendor engine that binds such a runtime implements that interface
// (engine-atom's RBLN decode graph). Knows no vendor library.

import type { KVGeometry } from "@airm/rm-core";

export interface DecodeGraphShape extends KVGeometry {
  vocabSize: number;
}

/** One stream's cache as a graph input: positions [0, n) of dense K [kv_heads, head_dim, S] and V [kv_heads, S, head_dim] per layer. */
export interface DenseKV {
  seqLen: number;
  n: number;
  k: Uint8Array[];
  v: Uint8Array[];
}

/** Bytes of one layer's dense K (or V) at context S. */
export function denseLayerBytes(g: Pick<KVGeometry, "kvHeads" | "headDim">, S: number): number {
  return g.kvHeads * g.headDim * S * 2;
}

export interface HostDecodeResult {
  logits: Float32Array;
  /** Per layer: the new position's K and V, [kv_heads, head_dim] bf16 each. */
  k: Uint8Array[];
  v: Uint8Array[];
}

/**
 * Writes a new position's K and V ([kv_heads, head_dim] bf16, as the graph returns them) into
 * one layer of a block (layout rngd-pd/v2: K [kv_heads, head_dim, block_size], V [kv_heads,
 * block_size, head_dim]) at offset `p` within the block.
 */
export function writeBlockColumn(
  g: Pick<KVGeometry, "kvHeads" | "headDim">,
  blockSize: number,
  p: number,
  kBlock: Uint8Array,
  vBlock: Uint8Array,
  k: Uint8Array,
  v: Uint8Array,
): void {
  for (let r = 0; r < g.kvHeads * g.headDim; r++) {
    const o = (r * blockSize + p) * 2;
    kBlock[o] = k[r * 2];
    kBlock[o + 1] = k[r * 2 + 1];
  }
  const run = g.headDim * 2;
  for (let h = 0; h < g.kvHeads; h++) vBlock.set(v.subarray(h * run, (h + 1) * run), (h * blockSize + p) * run);
}
