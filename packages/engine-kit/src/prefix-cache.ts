// Prompt-prefix KV reuse for prefill (what vLLM calls automatic prefix caching): the KV of recent
// prompts is kept, keyed by every block-aligned prefix of their tokens, and a new prompt that
// starts with one of those prefixes copies that KV instead of computing it. Chat requests share
// their template's system prompt, so most of a short chat prompt is found here. Knows token ids
// and per-layer KV arrays; nothing of the model. The caller guarantees that computing the rest of
// the prompt against the copied positions gives the bits of a whole prefill (it does for the CPU
// model: per-token results do not depend on how the prompt is split).

/** Prefixes are reused in blocks of this many tokens. */
export const PREFIX_BLOCK = 4;

interface Entry {
  seqLen: number;
  tokens: number[];
  /** Full per-layer K and V arrays of a cache of context seqLen holding `tokens` (read only). */
  k: Uint8Array[];
  v: Uint8Array[];
  keys: string[];
}

export interface PrefixHit {
  /** Prompt positions whose KV the hit holds (a multiple of PREFIX_BLOCK, < the prompt length). */
  n: number;
  k: Uint8Array[];
  v: Uint8Array[];
}

/** FNV-1a over the ids, one key per block boundary: keys[i] covers tokens [0, (i + 1) * PREFIX_BLOCK). */
function blockKeys(seqLen: number, tokens: number[], upTo: number): string[] {
  const keys: string[] = [];
  let h = 0x811c9dc5;
  let h2 = seqLen >>> 0;
  for (let i = 0; i < upTo; i++) {
    const t = tokens[i];
    h = Math.imul(h ^ t, 0x01000193) >>> 0;
    h2 = Math.imul(h2 ^ (t + i), 0x5bd1e995) >>> 0;
    if ((i + 1) % PREFIX_BLOCK === 0) keys.push(`${seqLen}:${i + 1}:${h.toString(36)}:${h2.toString(36)}`);
  }
  return keys;
}

export class PrefixCache {
  /** Entries oldest first. */
  private readonly entries: Entry[] = [];
  private readonly byKey = new Map<string, Entry>();
  hits = 0;
  queries = 0;
  reusedTokens = 0;

  /** `capacity` prompts kept (0: off). */
  constructor(readonly capacity: number) {}

  /** The longest kept prefix of `tokens` at context `seqLen` that leaves at least one token to compute. */
  lookup(seqLen: number, tokens: number[]): PrefixHit | null {
    if (this.capacity === 0) return null;
    this.queries++;
    const keys = blockKeys(seqLen, tokens, tokens.length - 1);
    for (let i = keys.length - 1; i >= 0; i--) {
      const e = this.byKey.get(keys[i]);
      const n = (i + 1) * PREFIX_BLOCK;
      if (!e || e.seqLen !== seqLen || e.tokens.length < n) continue;
      let same = true;
      for (let j = 0; j < n && same; j++) same = e.tokens[j] === tokens[j];
      if (!same) continue;
      // Most recently used last.
      this.entries.splice(this.entries.indexOf(e), 1);
      this.entries.push(e);
      this.hits++;
      this.reusedTokens += n;
      return { n, k: e.k, v: e.v };
    }
    return null;
  }

  /** Keeps the KV of a finished prefill of `tokens` (the arrays are kept as they are: never write to them). */
  store(seqLen: number, tokens: number[], k: Uint8Array[], v: Uint8Array[]): void {
    if (this.capacity === 0 || tokens.length < PREFIX_BLOCK) return;
    const keys = blockKeys(seqLen, tokens, tokens.length);
    // The same prompt again: nothing new to keep.
    const last = this.byKey.get(keys[keys.length - 1]);
    if (last && last.tokens.length === tokens.length && last.tokens.every((t, i) => t === tokens[i])) return;
    const e: Entry = { seqLen, tokens: tokens.slice(), k, v, keys };
    this.entries.push(e);
    for (const key of keys) this.byKey.set(key, e);
    while (this.entries.length > this.capacity) this.evict(this.entries[0]);
  }

  clear(): void {
    for (const e of [...this.entries]) this.evict(e);
  }

  get size(): number {
    return this.entries.length;
  }

  private evict(e: Entry): void {
    this.entries.splice(this.entries.indexOf(e), 1);
    for (const key of e.keys) if (this.byKey.get(key) === e) this.byKey.delete(key);
  }
}
