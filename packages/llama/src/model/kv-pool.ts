// The paged KV cache of one model: blocks of `blockSize` positions in the model's wasm memory,
// each holding every layer's K and V (a model with sliding-window layers has two pools: one for
// its whole-context layers, one for its sliding-window layers; see kv-cache.ts) in layout rngd-pd/v2 (rm-core's kv-layout): layer l at
// l * layerStride, K [kv_heads][head_dim][block_size] then V [kv_heads][block_size][head_dim].
// Blocks carry reference counts (a block shared by several caches is copied before one of them
// writes to it), and a budget (maxBlocks) of which some can be set aside (reservations) for work
// that was admitted but has not allocated yet. Memory is taken from the wasm memory in chunks as
// blocks are first needed, and freed blocks are reused last-freed-first, so the memory touched
// follows the most blocks ever in use at once, not the budget. Knows bytes and ids; which block
// holds which positions is each cache's business (kv-cache.ts).

import { AirmError, ConfigError, KVCacheFullError, blockLayerBytes, checkBlockSize, DEFAULT_BLOCK_SIZE } from "@airm/rm-core";
import type { KernelRuntime } from "../kernels/kernel-runtime.ts";

/** Bytes of wasm memory taken per growth step (at least one block). */
const CHUNK_BYTES = 8 * 2 ** 20;

export interface KVPoolOptions {
  /** Positions per block (default 16, vLLM's). One of rm-core's BLOCK_SIZES. */
  blockSize?: number;
  /** The most blocks the pool holds at once (default: as many as the wasm memory takes). */
  maxBlocks?: number;
}

export interface KVPoolShape {
  layers: number;
  kvHeads: number;
  headDim: number;
}

export class KVBlockPool {
  readonly blockSize: number;
  readonly layers: number;
  readonly kvHeads: number;
  readonly headDim: number;
  /** Bytes of one layer's K (or V) in one block. */
  readonly kBytes: number;
  /** Bytes of one layer (K then V) in one block. */
  readonly layerStride: number;
  /** Bytes of one block (every layer). */
  readonly blockBytes: number;
  private budget: number;
  /** Block id -> byte address in the runtime's main memory. */
  private readonly addr: number[] = [];
  /** Block id -> reference count (0: free). */
  private readonly refs: number[] = [];
  /** Free block ids, the last freed on top. */
  private readonly freeIds: number[] = [];
  private reserved = 0;
  private used = 0;
  /** Called after blocks went back to the free list. */
  onFreed: (() => void) | null = null;
  /**
   * Asked for a block when none is available (a prefix cache giving back a kept one): true when
   * it freed one. Called in the middle of reserve / allocate, so it must not call onFreed.
   */
  reclaim: (() => boolean) | null = null;

  constructor(
    private readonly rt: KernelRuntime,
    shape: KVPoolShape,
    opts: KVPoolOptions = {},
  ) {
    const bs = opts.blockSize ?? DEFAULT_BLOCK_SIZE;
    try {
      checkBlockSize(bs);
    } catch (e) {
      throw new ConfigError("blockSize", (e as Error).message);
    }
    this.blockSize = bs;
    this.layers = shape.layers;
    this.kvHeads = shape.kvHeads;
    this.headDim = shape.headDim;
    this.kBytes = blockLayerBytes(shape, bs);
    this.layerStride = 2 * this.kBytes;
    this.blockBytes = this.layers * this.layerStride;
    const max = opts.maxBlocks ?? Number.POSITIVE_INFINITY;
    if (!(max === Number.POSITIVE_INFINITY || (Number.isInteger(max) && max >= 1))) throw new ConfigError("maxBlocks", `must be an integer >= 1, got ${max}`);
    this.budget = max;
  }

  /** The budget: the most blocks held at once. */
  get totalBlocks(): number {
    return this.budget;
  }

  /** Blocks held by at least one cache. */
  get usedBlocks(): number {
    return this.used;
  }

  /** Blocks set aside by reservations and not allocated yet. */
  get reservedBlocks(): number {
    return this.reserved;
  }

  /** Blocks an allocation outside any reservation can take. */
  get availableBlocks(): number {
    return this.budget - this.used - this.reserved;
  }

  /** Blocks whose memory the pool has taken so far (touched at most once each). */
  get materializedBlocks(): number {
    return this.addr.length;
  }

  /** Changes the budget; throws ConfigError below the blocks in use and reserved. */
  setMaxBlocks(max: number): void {
    if (!(max === Number.POSITIVE_INFINITY || (Number.isInteger(max) && max >= 1))) throw new ConfigError("maxBlocks", `must be an integer >= 1, got ${max}`);
    if (max < this.used + this.reserved) throw new ConfigError("maxBlocks", `${max} is below the ${this.used + this.reserved} blocks in use or reserved`);
    this.budget = max;
  }

  /** Asks `reclaim` for blocks until `n` are available (or it has none to give); true when they are. */
  makeAvailable(n: number): boolean {
    while (n > this.availableBlocks && n <= this.budget - this.reserved && this.reclaim?.()) {
      // a kept block went back
    }
    return n <= this.availableBlocks;
  }

  /** Sets `n` blocks aside; false (nothing changed) when fewer are available. */
  reserve(n: number): boolean {
    if (!Number.isInteger(n) || n < 0) throw new ConfigError("blocks", `must be an integer >= 0, got ${n}`);
    if (!this.makeAvailable(n)) return false;
    this.reserved += n;
    return true;
  }

  /** Returns `n` reserved blocks to the available ones. */
  unreserve(n: number): void {
    if (n > this.reserved) throw new AirmError("KV_INTEGRITY", `unreserving ${n} blocks, only ${this.reserved} are reserved`);
    this.reserved -= n;
    if (n > 0) this.onFreed?.();
  }

  /**
   * A block for one cache (reference count 1). `fromReservation`: one of the reserved blocks
   * is spent. Throws KVCacheFullError when none is available (or the wasm memory is full).
   */
  allocate(fromReservation: boolean): number {
    if (fromReservation) {
      if (this.reserved < 1) throw new AirmError("KV_INTEGRITY", "allocating from a reservation, but no block is reserved");
    } else if (this.availableBlocks < 1 && !this.reclaim?.()) {
      throw new KVCacheFullError(`the KV cache's ${this.budget} blocks of ${this.blockSize} positions are all in use or reserved`);
    }
    const id = this.freeIds.pop() ?? this.grow();
    if (fromReservation) this.reserved--;
    this.refs[id] = 1;
    this.used++;
    return id;
  }

  /** One more cache holds `id`. */
  retain(id: number): void {
    if (!(this.refs[id] > 0)) throw new AirmError("KV_INTEGRITY", `KV block ${id} is not in use`);
    this.refs[id]++;
  }

  /** One cache less holds `id`; the last one frees it. */
  release(id: number): void {
    if (!(this.refs[id] > 0)) throw new AirmError("KV_INTEGRITY", `KV block ${id} is not in use`);
    if (--this.refs[id] === 0) {
      this.used--;
      this.freeIds.push(id);
    }
  }

  /** Calls onFreed (after a batch of releases). */
  notifyFreed(): void {
    this.onFreed?.();
  }

  refCount(id: number): number {
    return this.refs[id] ?? 0;
  }

  /** Byte address of block `id` in the main memory. */
  address(id: number): number {
    return this.addr[id];
  }

  /** The memory the blocks live in (the buffer changes when the memory grows). */
  memoryBuffer(): ArrayBufferLike {
    return this.rt.memory.buffer;
  }

  /** Layer `l`'s K (or V) of block `id` as a fresh view (the memory may grow between calls). */
  view(id: number, l: number, kind: "k" | "v"): Uint8Array {
    const at = this.addr[id] + l * this.layerStride + (kind === "v" ? this.kBytes : 0);
    return new Uint8Array(this.rt.memory.buffer, at, this.kBytes);
  }

  /** Copies every layer of block `src` into block `dst`. */
  copyBlock(src: number, dst: number): void {
    this.rt.u8.copyWithin(this.addr[dst], this.addr[src], this.addr[src] + this.blockBytes);
  }

  /** Takes memory for more blocks (a chunk of them) and returns one id; the rest go to the free list. */
  private grow(): number {
    const room = this.budget === Number.POSITIVE_INFINITY ? Number.POSITIVE_INFINITY : this.budget - this.addr.length;
    const count = Math.max(1, Math.min(room, Math.floor(CHUNK_BYTES / this.blockBytes)));
    let base: number;
    try {
      base = this.rt.alloc(count * this.blockBytes);
    } catch (e) {
      // The wasm memory is full: the budget is what exists now.
      this.budget = Math.max(this.addr.length, this.used + this.reserved);
      throw new KVCacheFullError(`the wasm memory holds no more KV blocks (${this.addr.length} exist): ${(e as Error).message}; set a smaller KV cache budget`);
    }
    const first = this.addr.length;
    for (let i = 0; i < count; i++) {
      this.addr.push(base + i * this.blockBytes);
      this.refs.push(0);
    }
    // Lowest ids on top, so a fresh pool hands out blocks in address order.
    for (let id = first + count - 1; id > first; id--) this.freeIds.push(id);
    return first;
  }
}
