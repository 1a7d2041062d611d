// One sequence's KV cache over the model's block pool (kv-pool.ts): a block table (block ids in
// position order), the positions filled, and a capacity. Blocks are taken as positions are
// written (`ensure`), shared with other caches where their positions agree (`fork`, `adopt`:
// copied before a write), and returned on `clear`. Knows which block holds which position and
// the blob form of a layer (rngd-pd/v2); filling the cache is the model's job, moving it the
// transport's.

import { AirmError, ConfigError, ContextOverflowError, KVCacheFullError, KVIntegrityError, blocksFor, zeroBlockTailK, zeroBlockTailV } from "@airm/rm-core";
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

export class PagedKVCache implements KVCache {
  readonly S: number;
  n = 0;
  freed = false;
  readonly owner: object;
  readonly pool: KVBlockPool;
  /** Block ids, in position order. */
  readonly blocks: number[] = [];
  /** Blocks reserved in the pool for this cache: its next allocations spend these first. */
  reservedBlocks = 0;

  constructor(pool: KVBlockPool, owner: object, S: number) {
    if (!Number.isInteger(S) || S < 1) throw new ConfigError("S", `context length must be a positive integer, got ${S}`);
    this.pool = pool;
    this.owner = owner;
    this.S = S;
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
   * when the pool lacks blocks (nothing is changed then).
   */
  ensure(to: number): void {
    this.live();
    if (to > this.S) throw new ContextOverflowError(to, this.S, "", "this cache's capacity");
    const need = this.blocksNeeded(to);
    if (need === 0) return;
    if (need > this.reservedBlocks + this.pool.availableBlocks) {
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
  adopt(ids: readonly number[]): void {
    this.live();
    if (this.blocks.length > 0 || this.n > 0) throw new ConfigError("cache", "adopt needs an empty cache");
    if (ids.length * this.pool.blockSize > this.S) throw new ContextOverflowError(ids.length * this.pool.blockSize, this.S, "", "this cache's capacity");
    for (const id of ids) this.pool.retain(id);
    this.blocks.push(...ids);
    this.n = ids.length * this.pool.blockSize;
  }

  /** A new cache holding the same positions, sharing every block (each copies a shared block before writing to it). */
  fork(): PagedKVCache {
    this.live();
    const c = new PagedKVCache(this.pool, this.owner, this.S);
    for (const id of this.blocks) this.pool.retain(id);
    c.blocks.push(...this.blocks);
    c.n = this.n;
    return c;
  }

  /** Returns every block (and the unspent reservation) to the pool; n becomes 0. The cache stays usable. */
  clear(): void {
    for (const id of this.blocks) this.pool.release(id);
    const had = this.blocks.length > 0 || this.reservedBlocks > 0;
    this.blocks.length = 0;
    this.n = 0;
    this.dropReservation();
    if (had) this.pool.notifyFreed();
  }

  /** Drops the blocks past the first `keep` positions' (n becomes min(n, keep)); shared ones are only let go. */
  truncate(keep: number): void {
    this.live();
    const bs = this.pool.blockSize;
    const blocks = blocksFor(keep, bs);
    if (blocks >= this.blocks.length) {
      this.n = Math.min(this.n, keep);
      return;
    }
    for (const id of this.blocks.splice(blocks)) this.pool.release(id);
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
    for (let j = 0; j < nb; j++) out.set(p.view(this.blocks[j], l, kind), j * p.kBytes);
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
  writeLayer(l: number, k: Uint8Array, v: Uint8Array, n: number): void {
    this.live();
    this.checkLayer(l);
    const p = this.pool;
    const nb = blocksFor(n, p.blockSize);
    if (nb > this.blocks.length) throw new AirmError("KV_INTEGRITY", `writing ${nb} blocks into a cache that holds ${this.blocks.length}; ensure(${n}) first`);
    const want = nb * p.kBytes;
    if (k.byteLength !== want || v.byteLength !== want) throw new KVIntegrityError("shape", `layer ${l}: K ${k.byteLength} / V ${v.byteLength} bytes, expected ${want}`);
    for (let j = 0; j < nb; j++) {
      if (p.refCount(this.blocks[j]) > 1) throw new AirmError("KV_INTEGRITY", `block ${j} of this cache is shared; write only to a cache's own blocks`);
      p.view(this.blocks[j], l, "k").set(k.subarray(j * p.kBytes, (j + 1) * p.kBytes));
      p.view(this.blocks[j], l, "v").set(v.subarray(j * p.kBytes, (j + 1) * p.kBytes));
    }
  }

  private checkLayer(l: number): void {
    if (!Number.isInteger(l) || l < 0 || l >= this.pool.layers) throw new ConfigError("layer", `layer ${l} is outside [0, ${this.pool.layers})`);
  }
}
