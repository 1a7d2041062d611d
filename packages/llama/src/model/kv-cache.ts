// The explicit KV cache of one stream in layout rngd-pd/v1 (rm-core's KV_LAYOUT and blob
// sizes), living in the model's wasm memory. Knows the byte offsets in that memory; filling it is
// the model's job, moving it the transport's.
import { ConfigError, layerBytes } from "@airm/rm-core";
import type { KernelRuntime } from "../kernels/kernel-runtime.ts";

/**
 * One stream's cache: bf16, for a fixed context S.
 * K is [layers][kv_heads][head_dim][S] (positions contiguous), V is [layers][kv_heads][S][head_dim].
 * `layerK(l)` / `layerV(l)` are the per-layer blobs (kvHeads*headDim*S*2 bytes each); views are
 * fresh on every call because the memory may grow.
 */
export interface KVCache {
  readonly S: number;
  /** Positions filled so far (the next token is written at position n). */
  n: number;
  layerK(l: number): Uint8Array;
  layerV(l: number): Uint8Array;
}

/** Slack after the V region: attention reads positions in groups of 4. */
const READ_SLACK = 64;

export class WasmKVCache implements KVCache {
  readonly S: number;
  n = 0;
  readonly layers: number;
  readonly layerBytes: number;
  /** Byte address of K layer 0 and V layer 0 in the model's memory. */
  readonly kPtr: number;
  readonly vPtr: number;
  readonly totalBytes: number;
  freed = false;
  readonly owner: object;
  private readonly rt: KernelRuntime;

  constructor(rt: KernelRuntime, owner: object, layers: number, kvHeads: number, headDim: number, S: number) {
    if (!Number.isInteger(S) || S < 1) throw new ConfigError("S", `context length must be a positive integer, got ${S}`);
    this.rt = rt;
    this.owner = owner;
    this.S = S;
    this.layers = layers;
    this.layerBytes = layerBytes({ kvHeads, headDim }, S);
    this.totalBytes = 2 * layers * this.layerBytes + READ_SLACK;
    this.kPtr = rt.alloc(this.totalBytes);
    this.vPtr = this.kPtr + layers * this.layerBytes;
  }

  private check(l: number): void {
    if (this.freed) throw new ConfigError("cache", "this KV cache was freed; create a new one with model.newCache(S)");
    if (!Number.isInteger(l) || l < 0 || l >= this.layers) throw new ConfigError("layer", `layer ${l} is outside [0, ${this.layers})`);
  }

  layerK(l: number): Uint8Array {
    this.check(l);
    return new Uint8Array(this.rt.memory.buffer, this.kPtr + l * this.layerBytes, this.layerBytes);
  }

  layerV(l: number): Uint8Array {
    this.check(l);
    return new Uint8Array(this.rt.memory.buffer, this.vPtr + l * this.layerBytes, this.layerBytes);
  }
}
