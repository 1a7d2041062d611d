// Which worker holds which KV block: the index a prefix-aware router keeps from the workers' KV
// events (BlockStored adds a worker's blocks, BlockRemoved takes them away, AllBlocksCleared
// empties the worker). Blocks are named by their 64-bit id (rm-core blockHashId: what the events
// carry), and a prompt's blocks by the ids of its hash chain, so a worker holds a prompt's first
// k blocks exactly when it holds the ids of those k blocks: each id names its whole prefix.

/** A prompt's block ids, first block first. */
export type BlockIds = readonly bigint[];

export class BlockIndex {
  private readonly holders = new Map<bigint, Set<string>>();
  private readonly byWorker = new Map<string, Set<bigint>>();

  /** `worker` keeps these blocks now. */
  stored(worker: string, ids: Iterable<bigint>): void {
    let mine = this.byWorker.get(worker);
    if (!mine) this.byWorker.set(worker, (mine = new Set()));
    for (const id of ids) {
      mine.add(id);
      let h = this.holders.get(id);
      if (!h) this.holders.set(id, (h = new Set()));
      h.add(worker);
    }
  }

  /** `worker` gave these blocks back. */
  removed(worker: string, ids: Iterable<bigint>): void {
    const mine = this.byWorker.get(worker);
    if (!mine) return;
    for (const id of ids) {
      if (!mine.delete(id)) continue;
      const h = this.holders.get(id);
      h?.delete(worker);
      if (h?.size === 0) this.holders.delete(id);
    }
  }

  /** `worker` holds nothing (it cleared its cache, restarted, or left the pool). */
  cleared(worker: string): void {
    const mine = this.byWorker.get(worker);
    if (!mine) return;
    this.removed(worker, [...mine]);
    this.byWorker.delete(worker);
  }

  /** How many of `ids`, from the first, `worker` holds. */
  matched(ids: BlockIds, worker: string): number {
    const mine = this.byWorker.get(worker);
    if (!mine) return 0;
    let n = 0;
    while (n < ids.length && mine.has(ids[n])) n++;
    return n;
  }

  /** The blocks `worker` holds. */
  blocksOf(worker: string): number {
    return this.byWorker.get(worker)?.size ?? 0;
  }

  /** (worker, block) entries in all: the index's size. */
  get size(): number {
    let n = 0;
    for (const s of this.byWorker.values()) n += s.size;
    return n;
  }

  /** The workers with at least one block. */
  workers(): string[] {
    return [...this.byWorker.keys()].filter((w) => this.blocksOf(w) > 0);
  }
}
