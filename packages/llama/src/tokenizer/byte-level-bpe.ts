// Trains a GPT-2 style byte-level BPE on a text and writes it as a Hugging Face tokenizer.json
// object (ByteLevel pre-tokenizer and decoder, special tokens as added tokens). Deterministic:
// the same text and sizes give the same vocabulary and merges. Encoding is left to the library.

/** GPT-2's table from byte value to the printable character that stands for it. */
export function bytesToUnicode(): string[] {
  const printable = (b: number) => (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
  const out: string[] = new Array(256);
  let extra = 0;
  for (let b = 0; b < 256; b++) out[b] = String.fromCharCode(printable(b) ? b : 256 + extra++);
  return out;
}

/** The GPT-2 split pattern, as the ByteLevel pre-tokenizer applies it (use_regex: true). */
const GPT2_SPLIT = /'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+/gu;

/** Words of `text` in byte-level form, as the ByteLevel pre-tokenizer produces them. */
export function byteLevelWords(text: string): string[] {
  const table = bytesToUnicode();
  const encoder = new TextEncoder();
  return (text.match(GPT2_SPLIT) ?? []).map((w) => Array.from(encoder.encode(w), (b) => table[b]!).join(""));
}

export interface TrainedBpe {
  /** Token strings in id order: special tokens, the 256 bytes, merged tokens, filler tokens. */
  vocab: string[];
  merges: Array<[string, string]>;
  specialTokens: string[];
  /** How many tokens came from merges (the rest above the bytes are fillers). */
  mergedCount: number;
}

export interface TrainBpeOptions {
  /** Total vocabulary size including special tokens and the 256 byte tokens. */
  vocabSize: number;
  /** Added in front, ids 0.. in this order. */
  specialTokens: string[];
  /** Pairs seen fewer times than this are not merged (default 2). */
  minFrequency?: number;
}

const cmp = (a: string, b: string) => (a < b ? -1 : a > b ? 1 : 0);

/**
 * Trains merges on `corpus` until the vocabulary is full or no pair reaches `minFrequency`; then
 * fills the remaining ids with deterministic filler tokens (concatenations of existing tokens that
 * no merge produces: decodable, never produced by encode). Ties between equally frequent pairs go
 * to the lexicographically smallest pair. Throws RangeError when vocabSize is too small.
 */
export function trainByteLevelBpe(corpus: string, options: TrainBpeOptions): TrainedBpe {
  const { vocabSize, specialTokens } = options;
  const minFrequency = options.minFrequency ?? 2;
  if (vocabSize < specialTokens.length + 256) throw new RangeError(`vocab size ${vocabSize} is below ${specialTokens.length + 256} (special tokens + 256 bytes)`);
  const vocab = [...specialTokens, ...bytesToUnicode()];
  const known = new Set(vocab);
  const counts = new Map<string, number>();
  for (const w of byteLevelWords(corpus)) counts.set(w, (counts.get(w) ?? 0) + 1);
  const words = [...counts.keys()].sort(cmp).map((w) => ({ symbols: Array.from(w), count: counts.get(w)! }));
  const merges: Array<[string, string]> = [];
  while (vocab.length < vocabSize) {
    const pairCounts = new Map<string, number>();
    for (const w of words) {
      for (let i = 0; i + 1 < w.symbols.length; i++) {
        const key = `${w.symbols[i]}\u0000${w.symbols[i + 1]}`;
        pairCounts.set(key, (pairCounts.get(key) ?? 0) + w.count);
      }
    }
    let best: string | null = null;
    let bestCount = 0;
    for (const [key, c] of pairCounts) {
      if (c > bestCount || (c === bestCount && best !== null && cmp(key, best) < 0)) {
        best = key;
        bestCount = c;
      }
    }
    if (best === null || bestCount < minFrequency) break;
    const [a, b] = best.split("\u0000") as [string, string];
    merges.push([a, b]);
    const merged = a + b;
    if (!known.has(merged)) {
      known.add(merged);
      vocab.push(merged);
    }
    for (const w of words) {
      const s = w.symbols;
      for (let i = 0; i + 1 < s.length; i++) {
        if (s[i] === a && s[i + 1] === b) s.splice(i, 2, merged);
      }
    }
  }
  const mergedCount = vocab.length - specialTokens.length - 256;
  // Fillers: concatenations of pairs of whole-character tokens (merged tokens and ASCII letters),
  // in a fixed order, until the vocabulary is full.
  const fromChar = new Map(bytesToUnicode().map((c, b) => [c, b]));
  const strict = new TextDecoder("utf-8", { fatal: true });
  const wholeCharacters = (t: string) => {
    try {
      strict.decode(Uint8Array.from(Array.from(t), (c) => fromChar.get(c)!));
      return true;
    } catch {
      return false;
    }
  };
  const letters = Array.from("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ");
  const pool = [...vocab.slice(specialTokens.length + 256).filter(wholeCharacters), ...letters];
  for (let k = 0; vocab.length < vocabSize; k++) {
    if (k >= pool.length * pool.length) throw new RangeError(`cannot fill a vocabulary of ${vocabSize} from this corpus`);
    const t = pool[k % pool.length]! + pool[Math.floor(k / pool.length)]!;
    if (!known.has(t)) {
      known.add(t);
      vocab.push(t);
    }
  }
  return { vocab, merges, specialTokens: [...specialTokens], mergedCount };
}

/** A tokenizer.json object (Hugging Face format) for a trained byte-level BPE. */
export function byteLevelTokenizerJson(bpe: TrainedBpe): Record<string, unknown> {
  const vocab: Record<string, number> = {};
  for (const [id, t] of bpe.vocab.entries()) vocab[t] = id;
  return {
    version: "1.0",
    truncation: null,
    padding: null,
    added_tokens: bpe.specialTokens.map((content, id) => ({ id, content, single_word: false, lstrip: false, rstrip: false, normalized: false, special: true })),
    normalizer: null,
    pre_tokenizer: { type: "ByteLevel", add_prefix_space: false, trim_offsets: true, use_regex: true },
    post_processor: { type: "ByteLevel", add_prefix_space: true, trim_offsets: false, use_regex: true },
    decoder: { type: "ByteLevel", add_prefix_space: true, trim_offsets: true, use_regex: true },
    model: {
      type: "BPE",
      dropout: null,
      unk_token: null,
      continuing_subword_prefix: null,
      end_of_word_suffix: null,
      fuse_unk: false,
      byte_fallback: false,
      ignore_merges: false,
      vocab,
      merges: bpe.merges,
    },
  };
}
