// One sequence's KV cache over the model's block pools (kv-pool.ts): a block table (block ids in
// position order), the positions filled, and a capacity. Blocks are taken as positions are
// written (`ensure`), shared with other caches where their positions agree (`fork`, `adopt`:
// copied before a write), and returned on `clear`. Knows which block holds which position and
// the blob form of a layer (rngd-pd/v2); filling the cache is the model's job, moving it the
// transport's.
//
// A model with sliding-window layers (Gemma 3) keeps those layers in a pool of their own with a
// second table (`local`): once the filled positions move past a block's positions by the window,
// no later query reads it, and the block goes back to that pool (its entry becomes -1). The
// whole-context layers keep every block in the main table.

import { AirmError, ConfigError, ContextOverflowError, KVCacheFullError, KVIntegrityError, blocksFor, firstLiveBlock, zeroBlockTailK, zeroBlockTailV } from "@airm/rm-core";
import type { KVBlockPool } from "./kv-pool.ts";

/**
 * One sequence's cache. `S`: the most positions it may hold. `blockIds`: the blocks holding
 * positions [0, n) in order (block j holds [j*blockSize, (j+1)*blockSize)).
 */
export interface KVCache {
  readonly S: number;
  /** Positions filled so far (the next token is written at position n). */
  n: number;
  readonly blockSize: number;
  readonly blockIds: readonly number[];
  /**
   * Layer l's K as a blob of layout rngd-pd/v2: the blocks of positions [0, upTo) (default n) in
   * order, positions past upTo zero (a copy). `upTo` past n reads what a pass is writing (onLayer).
   */
  layerK(l: number, upTo?: number): Uint8Array;
  /** Layer l's V, as layerK. */
  layerV(l: number, upTo?: number): Uint8Array;
}

/**
 * Where each layer of a model keeps its KV: `slot[l]` is the layer's index within the blocks of
 * its pool; with `local` (a sliding window), the layers with `windowed[l]` live in local.pool.
 */
export interface LayerHomes {
  windowed: readonly boolean[];
  slot: readonly number[];
  local: { pool: KVBlockPool; window: number } | null;
}

/** The homes of a model whose layers all read the whole context: one pool, slot = layer. */
export function wholeContextHomes(layers: number): LayerHomes {
  return { windowed: new Array<boolean>(layers).fill(false), slot: Array.from({ length: layers }, (_, l) => l), local: null };
}

export class PagedKVCache implements KVCache {
  readonly S: number;
  private filled = 0;
  freed = false;
  readonly owner: object;
  readonly pool: KVBlockPool;
  readonly homes: LayerHomes;
  /** Block ids, in position order. */
  readonly blocks: number[] = [];
  /** The sliding-window layers' block ids (local pool), in position order; -1 for a block that left the window. */
  readonly local: number[] = [];
  /** Blocks reserved in the pool for this cache: its next allocations spend these first. */
  reservedBlocks = 0;

  constructor(pool: KVBlockPool, owner: object, S: number, homes: LayerHomes = wholeContextHomes(pool.layers)) {
    if (!Number.isInteger(S) || S < 1) throw new ConfigError("S", `context length must be a positive integer, got ${S}`);
    this.pool = pool;
    this.owner = owner;
    this.S = S;
    this.homes = homes;
  }

  /** Positions filled so far; moving it forward lets the sliding-window blocks it leaves behind go. */
  get n(): number {
    return this.filled;
  }

  set n(v: number) {
    const forward = v > this.filled;
    this.filled = v;
    if (forward) this.dropOutOfWindow();
  }

  /** The first local block a later query reads (local.length when there is no window). */
  get firstLiveLocal(): number {
    const w = this.homes.local;
    return w ? firstLiveBlock(this.filled, w.window, this.pool.blockSize) : 0;
  }

  /** Returns the sliding-window blocks no later query reads to their pool. */
  private dropOutOfWindow(): void {
    const w = this.homes.local;
    if (!w) return;
    const end = Math.min(this.firstLiveLocal, this.local.length);
    let freed = false;
    for (let j = 0; j < end; j++) {
      if (this.local[j] < 0) continue;
      w.pool.release(this.local[j]);
      this.local[j] = -1;
      freed = true;
    }
    if (freed) w.pool.notifyFreed();
  }

  /** Byte address of block j's copy of layer l (the layer's K; its V follows at kBytes). */
  layerAddress(j: number, l: number): number {
    const local = this.homes.local;
    if (local && this.homes.windowed[l]) {
      const id = this.local[j];
      if (!(id >= 0)) throw new AirmError("KV_INTEGRITY", `block ${j} of sliding-window layer ${l} left the window of ${local.window} positions`);
      return local.pool.address(id) + this.homes.slot[l] * local.pool.layerStride;
    }
    return this.pool.address(this.blocks[j]) + this.homes.slot[l] * this.pool.layerStride;
  }

  /** Layer l's K (or V) of block j as a fresh view. */
  view(j: number, l: number, kind: "k" | "v"): Uint8Array {
    const at = this.layerAddress(j, l) + (kind === "v" ? this.pool.kBytes : 0);
    return new Uint8Array(this.pool.memoryBuffer(), at, this.pool.kBytes);
  }

  get blockSize(): number {
    return this.pool.blockSize;
  }

  get blockIds(): readonly number[] {
    return this.blocks;
  }

  private live(): void {
    if (this.freed) throw new ConfigError("cache", "this KV cache was freed; create a new one with model.newCache(S)");
  }

  /**
   * Blocks a write of positions [n, to) would take from the pool: new blocks past the table,
   * and a copy of the block holding position n when another cache shares it.
   */
  blocksNeeded(to: number): number {
    const bs = this.pool.blockSize;
    let need = Math.max(0, blocksFor(to, bs) - this.blocks.length);
    const j = Math.floor(this.n / bs);
    if (to > this.n && j < this.blocks.length && this.pool.refCount(this.blocks[j]) > 1) need++;
    return need;
  }

  /**
   * Makes positions [n, to) writable: takes the blocks past the table and copies a shared block
   * that holds position n (copy on write). Throws ContextOverflowError past S, KVCacheFullError
   * when the pool lacks blocks (nothing is changed then). `liveFrom` (default n): the sliding-window
   * layers take no block that a query at liveFrom or later does not read (an import passes its n).
   */
  ensure(to: number, liveFrom = this.n): void {
    this.live();
    if (to > this.S) throw new ContextOverflowError(to, this.S, "", "this cache's capacity");
    const need = this.blocksNeeded(to);
    if (need === 0) return;
    if (need > this.reservedBlocks && !this.pool.makeAvailable(need - this.reservedBlocks)) {
      throw new KVCacheFullError(`a write of positions [${this.n}, ${to}) needs ${need} KV blocks; ${this.pool.availableBlocks} are free`);
    }
    const bs = this.pool.blockSize;
    const j = Math.floor(this.n / bs);
    if (to > this.n && j < this.blocks.length && this.pool.refCount(this.blocks[j]) > 1) {
      const copy = this.take();
      this.pool.copyBlock(this.blocks[j], copy);
      this.pool.release(this.blocks[j]);
      this.blocks[j] = copy;
    }
    while (this.blocks.length < blocksFor(to, bs)) this.blocks.push(this.take());
    this.ensureLocal(to, liveFrom);
  }

  /**
   * The sliding-window layers' blocks for positions [n, to): a shared block at n copied, new
   * ones past the table, none for blocks that are out of the window already. The local pool is
   * not budgeted: it never holds more blocks than the main table it mirrors.
   */
  private ensureLocal(to: number, liveFrom: number): void {
    const w = this.homes.local;
    if (!w) return;
    const bs = this.pool.blockSize;
    const j = Math.floor(this.n / bs);
    if (to > this.n && j < this.local.length && this.local[j] >= 0 && w.pool.refCount(this.local[j]) > 1) {
      const copy = w.pool.allocate(false);
      w.pool.copyBlock(this.local[j], copy);
      w.pool.release(this.local[j]);
      this.local[j] = copy;
    }
    const live = firstLiveBlock(liveFrom, w.window, bs);
    while (this.local.length < blocksFor(to, bs)) this.local.push(this.local.length < live ? -1 : w.pool.allocate(false));
  }

  private take(): number {
    const fromReservation = this.reservedBlocks > 0;
    const id = this.pool.allocate(fromReservation);
    if (fromReservation) this.reservedBlocks--;
    return id;
  }

  /** Moves `n` blocks already reserved in the pool to this cache (its allocations spend them first). */
  addReservation(n: number): void {
    this.reservedBlocks += n;
  }

  /** Returns this cache's unspent reservation to the pool. */
  dropReservation(): void {
    if (this.reservedBlocks > 0) this.pool.unreserve(this.reservedBlocks);
    this.reservedBlocks = 0;
  }

  /**
   * Starts this empty cache with `ids` (full blocks of another cache holding the same first
   * positions) as its first blocks, shared; n becomes ids.length * blockSize.
   */
  adopt(ids: readonly number[], local: readonly number[] = []): void {
    this.live();
    if (this.blocks.length > 0 || this.n > 0) throw new ConfigError("cache", "adopt needs an empty cache");
    if (ids.length * this.pool.blockSize > this.S) throw new ContextOverflowError(ids.length * this.pool.blockSize, this.S, "", "this cache's capacity");
    const w = this.homes.local;
    const n = ids.length * this.pool.blockSize;
    if (w) {
      // the sliding-window layers' blocks a query at n reads must all be there
      const live = firstLiveBlock(n, w.window, this.pool.blockSize);
      if (local.length !== ids.length || local.slice(live).some((id) => id < 0)) {
        throw new AirmError("KV_INTEGRITY", `adopting ${ids.length} blocks needs the sliding-window layers' blocks ${live}..${ids.length - 1}`);
      }
      for (let j = 0; j < local.length; j++) {
        const id = j < live ? -1 : local[j];
        if (id >= 0) w.pool.retain(id);
        this.local.push(id);
      }
    }
    for (const id of ids) this.pool.retain(id);
    this.blocks.push(...ids);
    this.n = n;
  }

  /** A new cache holding the same positions, sharing every block (each copies a shared block before writing to it). */
  fork(): PagedKVCache {
    this.live();
    const c = new PagedKVCache(this.pool, this.owner, this.S, this.homes);
    for (const id of this.blocks) this.pool.retain(id);
    c.blocks.push(...this.blocks);
    for (const id of this.local) if (id >= 0) this.homes.local!.pool.retain(id);
    c.local.push(...this.local);
    c.n = this.n;
    return c;
  }

  /** Returns every block (and the unspent reservation) to the pool; n becomes 0. The cache stays usable. */
  clear(): void {
    for (const id of this.blocks) this.pool.release(id);
    const had = this.blocks.length > 0 || this.reservedBlocks > 0;
    this.blocks.length = 0;
    this.releaseLocal(0);
    this.n = 0;
    this.dropReservation();
    if (had) this.pool.notifyFreed();
  }

  /** Lets go of the sliding-window blocks from block `from` on. */
  private releaseLocal(from: number): void {
    const w = this.homes.local;
    if (!w || this.local.length <= from) return;
    for (const id of this.local.splice(from)) if (id >= 0) w.pool.release(id);
    w.pool.notifyFreed();
  }

  /** Drops the blocks past the first `keep` positions' (n becomes min(n, keep)); shared ones are only let go. */
  truncate(keep: number): void {
    this.live();
    const bs = this.pool.blockSize;
    const blocks = blocksFor(keep, bs);
    const w = this.homes.local;
    if (w && keep < this.n) {
      const live = firstLiveBlock(keep, w.window, bs);
      if (this.local.slice(live, blocks).some((id) => id < 0)) {
        throw new AirmError("KV_INTEGRITY", `cannot go back to ${keep} positions: the sliding-window layers dropped blocks a query there reads`);
      }
    }
    if (blocks >= this.blocks.length) {
      this.n = Math.min(this.n, keep);
      return;
    }
    for (const id of this.blocks.splice(blocks)) this.pool.release(id);
    this.releaseLocal(blocks);
    this.n = Math.min(this.n, keep);
    this.pool.notifyFreed();
  }

  layerK(l: number, upTo = this.n): Uint8Array {
    return this.layerBlob(l, "k", upTo);
  }

  layerV(l: number, upTo = this.n): Uint8Array {
    return this.layerBlob(l, "v", upTo);
  }

  /** Layer l's K or V blob (rngd-pd/v2): the blocks of positions [0, upTo), positions past upTo zero. */
  layerBlob(l: number, kind: "k" | "v", upTo = this.n): Uint8Array {
    this.live();
    this.checkLayer(l);
    const p = this.pool;
    const nb = blocksFor(upTo, p.blockSize);
    if (nb > this.blocks.length) throw new ConfigError("upTo", `${upTo} positions are past this cache's ${this.blocks.length} blocks`);
    const out = new Uint8Array(nb * p.kBytes);
    // A sliding-window layer's blocks that no query after upTo reads stay zero (they may be gone).
    const w = this.homes.local;
    const from = w && this.homes.windowed[l] ? firstLiveBlock(upTo, w.window, p.blockSize) : 0;
    for (let j = from; j < nb; j++) out.set(this.view(j, l, kind), j * p.kBytes);
    const tail = upTo - (nb - 1) * p.blockSize;
    if (nb > 0 && tail < p.blockSize) {
      const last = out.subarray((nb - 1) * p.kBytes);
      if (kind === "k") zeroBlockTailK(p, p.blockSize, tail, last);
      else zeroBlockTailV(p, p.blockSize, tail, last);
    }
    return out;
  }

  /**
   * Writes layer l's K and V blobs (rngd-pd/v2, blocks of [0, n)) into this cache's blocks, which
   * must hold n positions already (ensure(n) first). Throws KVIntegrityError for a wrong size.
   */
  writeLayer(l: number, k: Uint8Array, v: Uint8Array, n: number, fromBlock = 0): void {
    this.live();
    this.checkLayer(l);
    const p = this.pool;
    const nb = blocksFor(n, p.blockSize);
    if (nb > this.blocks.length) throw new AirmError("KV_INTEGRITY", `writing ${nb} blocks into a cache that holds ${this.blocks.length}; ensure(${n}) first`);
    const want = (nb - fromBlock) * p.kBytes;
    if (k.byteLength !== want || v.byteLength !== want) throw new KVIntegrityError("shape", `layer ${l}: K ${k.byteLength} / V ${v.byteLength} bytes, expected ${want}`);
    const w = this.homes.local && this.homes.windowed[l] ? this.homes.local : null;
    for (let j = fromBlock; j < nb; j++) {
      const [pool, id] = w ? [w.pool, this.local[j]] : [p, this.blocks[j]];
      if (id < 0) continue; // out of the window: nothing reads it
      if (pool.refCount(id) > 1) throw new AirmError("KV_INTEGRITY", `block ${j} of this cache is shared; write only to a cache's own blocks`);
      const at = (j - fromBlock) * p.kBytes;
      this.view(j, l, "k").set(k.subarray(at, at + p.kBytes));
      this.view(j, l, "v").set(v.subarray(at, at + p.kBytes));
    }
  }

  private checkLayer(l: number): void {
    const layers = this.homes.slot.length;
    if (!Number.isInteger(l) || l < 0 || l >= layers) throw new ConfigError("layer", `layer ${l} is outside [0, ${layers})`);
  }
}
