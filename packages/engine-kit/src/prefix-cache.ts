// Prefix caching by block (vLLM's automatic prefix caching): every full KV block a prompt or a
// finished stream leaves behind is kept under its block hash (rm-core's block-hash.ts: a chain
// over the parent's hash and the block's token ids, rooted in the model, the numerics, the block
// size and the request's cache_salt), holding one reference to the block. A new prompt walks its
// own hashes from the first block and shares every block found, up to the first miss. Kept blocks
// that nothing else holds are the evictable ones: when a pool runs short they go back least
// recently used first, the deepest block of a chain before its parents (a parent evicted first
// would strand its children). Knows hashes, token ids and block ids; nothing of the model. The
// caller guarantees that computing the rest of a prompt after shared blocks gives the bits of a
// whole prefill (it does for the CPU model: per-token results do not depend on how the prompt is
// split).

import { blockHashes, blockHashRoot, type BlockEvent, type BlockHashRoot } from "@airm/rm-core";

/** What the cache needs from a block pool: holding and letting go of blocks. */
export interface BlockHolder {
  retain(id: number): void;
  release(id: number): void;
  refCount(id: number): number;
  notifyFreed(): void;
}

/**
 * The sliding-window layers' blocks of a model that keeps them apart: their holder, and the
 * first of them a query at position n or later reads (the ones before are gone).
 */
export interface WindowBlocks {
  pool: BlockHolder;
  firstLive(n: number): number;
}

interface Kept {
  hash: string;
  /** The block (main pool), one reference held. */
  id: number;
  /** The sliding-window layers' block of the same positions (-1: gone, or no window), one reference held. */
  local: number;
}

export interface PrefixHit {
  /** Prompt positions the shared blocks hold (whole blocks, fewer than the prompt's tokens). */
  n: number;
  blocks: number[];
  /** The sliding-window layers' blocks (-1 before the window); empty without a window. */
  local: number[];
}

export type { BlockEvent } from "@airm/rm-core";

export class PrefixCache {
  /** Kept blocks by hash, least recently used first (Map order). */
  private readonly kept = new Map<string, Kept>();
  private readonly roots = new Map<string, string>();
  /** Lookups, lookups that shared at least one block, and the positions shared. */
  queries = 0;
  hits = 0;
  reusedTokens = 0;
  /** Blocks given back to make room. */
  evictions = 0;
  /** Called with every change (for KV events). */
  onEvent: ((e: BlockEvent) => void) | null = null;

  constructor(
    readonly enabled: boolean,
    readonly blockSize: number,
    private root: BlockHashRoot,
    private readonly pool: BlockHolder,
    private readonly window: WindowBlocks | null = null,
  ) {}

  /** The chain's root for a cache_salt ("" for none). */
  rootFor(salt = ""): string {
    let r = this.roots.get(salt);
    if (r === undefined) {
      r = blockHashRoot(this.root, salt);
      if (this.roots.size > 1024) this.roots.clear();
      this.roots.set(salt, r);
    }
    return r;
  }

  /** The hashes of the full blocks of `tokens`. */
  private hashesOf(tokens: readonly number[], salt = "", blocks?: number): string[] {
    return blockHashes(this.rootFor(salt), tokens, this.blockSize, blocks);
  }

  /** The kept blocks of `tokens` from its first block up to the first miss, at most `maxBlocks` (hashed one by one: none past the miss). */
  private chain(tokens: readonly number[], salt: string, maxBlocks: number): Kept[] {
    const found: Kept[] = [];
    let parent = this.rootFor(salt);
    for (let b = 0; b < maxBlocks; b++) {
      const [h] = blockHashes(parent, tokens, this.blockSize, b + 1, b, parent);
      const k = this.kept.get(h);
      if (!k) break;
      found.push(k);
      parent = h;
    }
    return found;
  }

  /**
   * The kept chain of `tokens` from its first block, at most `maxBlocks` blocks, each retained once
   * more (the caller releases them): what a decode worker holds for a handoff that skips them.
   */
  hold(tokens: readonly number[], salt: string, maxBlocks: number): { blocks: number[]; hashes: string[] } {
    if (!this.enabled || this.window) return { blocks: [], hashes: [] };
    const found = this.chain(tokens, salt, Math.min(maxBlocks, Math.floor(tokens.length / this.blockSize)));
    this.touch(found);
    for (const k of found) this.pool.retain(k.id);
    return { blocks: found.map((k) => k.id), hashes: found.map((k) => k.hash) };
  }

  /** The longest kept prefix of `tokens` in whole blocks that leaves at least one token to compute. */
  lookup(tokens: readonly number[], salt = ""): PrefixHit | null {
    if (!this.enabled) return null;
    this.queries++;
    const found = this.chain(tokens, salt, Math.floor((tokens.length - 1) / this.blockSize));
    let k = found.length;
    // A prefix whose window's sliding-window blocks are gone cannot be continued: try a shorter one.
    while (k > 0 && this.window && found.slice(this.window.firstLive(k * this.blockSize), k).some((b) => b.local < 0)) k--;
    if (k === 0) return null;
    const shared = found.slice(0, k);
    this.touch(shared);
    this.hits++;
    this.reusedTokens += k * this.blockSize;
    return {
      n: k * this.blockSize,
      blocks: shared.map((b) => b.id),
      local: this.window ? shared.map((b) => b.local) : [],
    };
  }

  /**
   * Keeps the full blocks of `tokens` (`blocks`: the cache's blocks in order, `local` its
   * sliding-window layers' blocks; one more reference each) under their hashes. A hash already
   * kept stays with its block.
   */
  store(tokens: readonly number[], blocks: readonly number[], local: readonly number[] = [], salt = ""): void {
    if (!this.enabled) return;
    const full = Math.min(Math.floor(tokens.length / this.blockSize), blocks.length);
    if (full === 0) return;
    const hashes = this.hashesOf(tokens, salt, full);
    const chain: Kept[] = [];
    let firstNew = -1;
    for (let i = 0; i < full; i++) {
      let k = this.kept.get(hashes[i]);
      if (!k) {
        const loc = this.window ? (local[i] ?? -1) : -1;
        this.pool.retain(blocks[i]);
        if (loc >= 0) this.window!.pool.retain(loc);
        k = { hash: hashes[i], id: blocks[i], local: loc };
        this.kept.set(k.hash, k);
        if (firstNew < 0) firstNew = i;
      }
      chain.push(k);
    }
    this.touch(chain);
    if (firstNew >= 0 && this.onEvent) {
      this.onEvent({
        kind: "stored",
        hashes: hashes.slice(firstNew),
        parent: firstNew > 0 ? hashes[firstNew - 1] : null,
        tokens: tokens.slice(firstNew * this.blockSize, full * this.blockSize),
        blockSize: this.blockSize,
      });
    }
  }

  /**
   * Gives back the least recently used kept block that only the cache holds (its sliding-window
   * block with it); false when there is none. The pool asks (its reclaim), in the middle of an
   * allocation, so the pool's "blocks freed" listeners are not called.
   */
  evictOldest(): boolean {
    for (const k of this.kept.values()) {
      if (this.pool.refCount(k.id) !== 1) continue;
      this.drop([k], "evict");
      this.evictions++;
      return true;
    }
    return false;
  }

  /** Lets go of every kept block. */
  clear(): void {
    if (this.kept.size === 0) return;
    this.drop([...this.kept.values()], "clear");
    this.onEvent?.({ kind: "cleared" });
  }

  /** Lets go of every kept block and hashes from `root` from now on (new weights). */
  reset(root: BlockHashRoot): void {
    this.clear();
    this.root = root;
    this.roots.clear();
  }

  /** Blocks kept. */
  get size(): number {
    return this.kept.size;
  }

  /** Kept blocks that only the cache holds (what evicting every one would free). */
  evictableBlocks(): number {
    let n = 0;
    for (const k of this.kept.values()) if (this.pool.refCount(k.id) === 1) n++;
    return n;
  }

  /** Most recently used last; within a chain the root last, so a chain's deepest block goes first. */
  private touch(chain: Kept[]): void {
    for (let i = chain.length - 1; i >= 0; i--) {
      this.kept.delete(chain[i].hash);
      this.kept.set(chain[i].hash, chain[i]);
    }
  }

  /**
   * Lets go of kept blocks. `evict`: the pool asked for room (its listeners are not called; the
   * blocks are announced as removed); `clear`: every block goes (listeners called; the caller
   * announces the clear).
   */
  private drop(blocks: Kept[], why: "evict" | "clear"): void {
    for (const k of blocks) {
      this.kept.delete(k.hash);
      this.pool.release(k.id);
      if (k.local >= 0) this.window!.pool.release(k.local);
    }
    if (why === "evict") {
      this.onEvent?.({ kind: "removed", hashes: blocks.map((k) => k.hash) });
      return;
    }
    this.pool.notifyFreed();
    if (this.window && blocks.some((k) => k.local >= 0)) this.window.pool.notifyFreed();
  }
}
