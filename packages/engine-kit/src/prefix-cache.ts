// Prompt-prefix KV reuse (vLLM's automatic prefix caching, kept small): the full KV blocks of
// recent prompts stay in the block pool, held by an entry keyed by every block boundary of the
// prompt's tokens; a new prompt that starts with one of those prefixes shares the blocks instead
// of computing them. Chat requests share their template's system prompt, so most of a short chat
// prompt is found here. Knows token ids and block ids; nothing of the model. The caller
// guarantees that computing the rest of the prompt after shared blocks gives the bits of a whole
// prefill (it does for the CPU model: per-token results do not depend on how the prompt is split).

/** What the cache needs from the block pool: holding and letting go of blocks. */
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

interface Entry {
  tokens: number[];
  /** The prompt's full blocks, held (one reference each). */
  blocks: number[];
  /** The sliding-window layers' blocks of the same positions (-1: gone), held; empty without a window. */
  local: number[];
  keys: string[];
}

export interface PrefixHit {
  /** Prompt positions the shared blocks hold (whole blocks, fewer than the prompt's tokens). */
  n: number;
  blocks: number[];
  /** The sliding-window layers' blocks (-1 before the window); empty without a window. */
  local: number[];
}

/** FNV-1a over the ids, one key per block boundary: keys[i] covers tokens [0, (i + 1) * blockSize). */
function blockKeys(blockSize: number, tokens: number[], upTo: number): string[] {
  const keys: string[] = [];
  let h = 0x811c9dc5;
  let h2 = blockSize >>> 0;
  for (let i = 0; i < upTo; i++) {
    const t = tokens[i];
    h = Math.imul(h ^ t, 0x01000193) >>> 0;
    h2 = Math.imul(h2 ^ (t + i), 0x5bd1e995) >>> 0;
    if ((i + 1) % blockSize === 0) keys.push(`${i + 1}:${h.toString(36)}:${h2.toString(36)}`);
  }
  return keys;
}

function samePrefix(a: number[], b: number[], n: number): boolean {
  if (a.length < n || b.length < n) return false;
  for (let j = 0; j < n; j++) if (a[j] !== b[j]) return false;
  return true;
}

export class PrefixCache {
  /** Entries oldest first. */
  private readonly entries: Entry[] = [];
  private readonly byKey = new Map<string, Entry>();
  hits = 0;
  queries = 0;
  reusedTokens = 0;

  /** `capacity` prompts kept (0: off), their blocks of `blockSize` positions held in `pool`. */
  constructor(
    readonly capacity: number,
    readonly blockSize: number,
    private readonly pool: BlockHolder,
    private readonly window: WindowBlocks | null = null,
  ) {}

  /** The longest kept prefix of `tokens` in whole blocks that leaves at least one token to compute. */
  lookup(tokens: number[]): PrefixHit | null {
    if (this.capacity === 0) return null;
    this.queries++;
    const keys = blockKeys(this.blockSize, tokens, tokens.length - 1);
    for (let i = keys.length - 1; i >= 0; i--) {
      const e = this.byKey.get(keys[i]);
      const n = (i + 1) * this.blockSize;
      if (!e || e.blocks.length < i + 1) continue;
      if (!samePrefix(e.tokens, tokens, n)) continue;
      // a prefix whose window's sliding-window blocks are gone cannot be continued
      if (this.window && e.local.slice(this.window.firstLive(n), i + 1).some((id) => id < 0)) continue;
      // Most recently used last.
      this.entries.splice(this.entries.indexOf(e), 1);
      this.entries.push(e);
      this.hits++;
      this.reusedTokens += n;
      return { n, blocks: e.blocks.slice(0, i + 1), local: e.local.slice(0, i + 1) };
    }
    return null;
  }

  /**
   * Keeps the full blocks of a finished prefill of `tokens` (`blocks`: the cache's blocks in
   * order, `local` its sliding-window layers' blocks; one more reference each).
   */
  store(tokens: number[], blocks: readonly number[], local: readonly number[] = []): void {
    const full = Math.min(Math.floor(tokens.length / this.blockSize), blocks.length);
    if (this.capacity === 0 || full === 0) return;
    const keys = blockKeys(this.blockSize, tokens, full * this.blockSize);
    // The same prefix again: nothing new to keep.
    const last = this.byKey.get(keys[keys.length - 1]);
    if (last && samePrefix(last.tokens, tokens, full * this.blockSize)) return;
    const kept = blocks.slice(0, full);
    for (const id of kept) this.pool.retain(id);
    const keptLocal = this.window ? local.slice(0, full) : [];
    for (const id of keptLocal) if (id >= 0) this.window!.pool.retain(id);
    const e: Entry = { tokens: tokens.slice(0, full * this.blockSize), blocks: kept, local: keptLocal, keys };
    this.entries.push(e);
    for (const key of keys) this.byKey.set(key, e);
    while (this.entries.length > this.capacity) this.evict(this.entries[0]);
  }

  /** Lets go of the least recently used entry's blocks; false when none is kept. */
  evictOldest(): boolean {
    const e = this.entries[0];
    if (!e) return false;
    this.evict(e);
    return true;
  }

  clear(): void {
    for (const e of [...this.entries]) this.evict(e);
  }

  get size(): number {
    return this.entries.length;
  }

  /** Blocks that only the kept entries hold (what evicting every entry would free). */
  evictableBlocks(): number {
    const holders = new Map<number, number>();
    for (const e of this.entries) for (const id of e.blocks) holders.set(id, (holders.get(id) ?? 0) + 1);
    let n = 0;
    for (const [id, count] of holders) if (this.pool.refCount(id) === count) n++;
    return n;
  }

  private evict(e: Entry): void {
    this.entries.splice(this.entries.indexOf(e), 1);
    for (const key of e.keys) if (this.byKey.get(key) === e) this.byKey.delete(key);
    for (const id of e.blocks) this.pool.release(id);
    for (const id of e.local) if (id >= 0) this.window!.pool.release(id);
    this.pool.notifyFreed();
  }
}
