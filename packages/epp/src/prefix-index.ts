// Prefix affinity without a tokenizer: a prompt's first blocks of characters are hashed in a
// chain (each block's hash covers every character before it, and the model name), and an LRU map
// remembers which endpoint took each block hash last. Two prompts that share their first k
// blocks share their first k hashes, so the endpoint that holds those KV blocks can be found.

export interface PrefixOptions {
  /** Characters per block (default 256). */
  blockChars?: number;
  /** Blocks hashed per prompt (default 8). */
  maxBlocks?: number;
  /** Block hashes remembered (default 100 000). */
  capacity?: number;
}

const FNV_OFFSET = 0x811c9dc5;
const FNV_PRIME = 0x01000193;

/** 32-bit FNV-1a of `text` continued from state `h`. */
function fnv1a(h: number, text: string, from: number, to: number): number {
  for (let i = from; i < to; i++) {
    h ^= text.charCodeAt(i);
    h = Math.imul(h, FNV_PRIME);
  }
  return h >>> 0;
}

/**
 * The chained hashes of the prompt's whole blocks (a last partial block is not hashed: it is not
 * a stable prefix). Each hash is a 52-bit number made of two 32-bit FNV-1a chains with different
 * starting states, so unrelated prompts collide about once in 2^52.
 */
export function promptBlockHashes(model: string, prompt: string, blockChars = 256, maxBlocks = 8): number[] {
  const blocks = Math.min(maxBlocks, Math.floor(prompt.length / blockChars));
  const out: number[] = [];
  let a = fnv1a(FNV_OFFSET, model, 0, model.length);
  let b = fnv1a(0x9e3779b9, model, 0, model.length);
  for (let i = 0; i < blocks; i++) {
    a = fnv1a(a, prompt, i * blockChars, (i + 1) * blockChars);
    b = fnv1a(b ^ i, prompt, i * blockChars, (i + 1) * blockChars);
    out.push((a & 0xfffff) * 0x100000000 + b);
  }
  return out;
}

/** Block hash -> the endpoint ("ip:port") that took it last, least recently used dropped first. */
export class PrefixIndex {
  private readonly owner = new Map<number, string>();
  readonly blockChars: number;
  readonly maxBlocks: number;
  readonly capacity: number;

  constructor(options: PrefixOptions = {}) {
    this.blockChars = options.blockChars ?? 256;
    this.maxBlocks = options.maxBlocks ?? 8;
    this.capacity = options.capacity ?? 100_000;
  }

  hashes(model: string, prompt: string): number[] {
    return promptBlockHashes(model, prompt, this.blockChars, this.maxBlocks);
  }

  /** How many leading blocks of `hashes` `key` took last (0 when the first block is not its). */
  matchedBlocks(hashes: number[], key: string): number {
    let n = 0;
    while (n < hashes.length && this.owner.get(hashes[n]) === key) n++;
    return n;
  }

  /** Records that `key` took every block of `hashes` (and marks them recently used). */
  record(hashes: number[], key: string): void {
    for (const h of hashes) {
      this.owner.delete(h);
      this.owner.set(h, key);
    }
    while (this.owner.size > this.capacity) this.owner.delete(this.owner.keys().next().value as number);
  }

  get size(): number {
    return this.owner.size;
  }
}
