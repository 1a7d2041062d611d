// The SentencePiece tokenizer of GGUF files whose `tokenizer.ggml.model` is "llama" (Gemma, Llama
// 2, Mistral): tokens with scores and types, byte fallback (`<0xAB>` tokens). Encoding follows
// llama.cpp's SPM session: spaces become U+2581, control and user-defined tokens in the text are
// matched first (longest first), and each remaining run of characters is merged pair by pair, the
// pair whose concatenation is the vocabulary's highest-scored token first (leftmost on ties);
// pieces that are no token fall back to their bytes. Knows no model weights or chat templates.

import type { Tokenizer, VocabularyType } from "../checkpoint-types.ts";
import { ModelLoadError } from "../checkpoint/model-load-error.ts";

/** llama.cpp token types. */
const TYPE_CONTROL = 3;
const TYPE_USER_DEFINED = 4;
const TYPE_BYTE = 6;
const SPACE = "\u2581";
const BYTE_TOKEN = /^<0x([0-9A-Fa-f]{2})>$/;

export interface SpmTokenizerOptions {
  tokens: string[];
  scores: number[];
  /** llama.cpp token types (1 normal, 2 unknown, 3 control, 4 user-defined, 5 unused, 6 byte); empty: all normal. */
  types: number[];
  bosTokenId: number | null;
  eosTokenIds: number[];
  /** Prepend BOS when encoding with special tokens (`tokenizer.ggml.add_bos_token`). */
  addBos: boolean;
  /** Prepend a space to the text (`tokenizer.ggml.add_space_prefix`; Gemma: false). */
  addSpacePrefix: boolean;
}

interface Symbol {
  start: number;
  end: number;
  prev: number;
  next: number;
}

interface Bigram {
  left: number;
  right: number;
  score: number;
  size: number;
}

/** A binary max-heap of bigrams: highest score first, then the leftmost. */
class BigramQueue {
  private readonly items: Bigram[] = [];
  get size(): number {
    return this.items.length;
  }
  private before(a: Bigram, b: Bigram): boolean {
    return a.score > b.score || (a.score === b.score && a.left < b.left);
  }
  push(b: Bigram): void {
    const h = this.items;
    h.push(b);
    for (let i = h.length - 1; i > 0; ) {
      const p = (i - 1) >> 1;
      if (!this.before(h[i]!, h[p]!)) break;
      [h[i], h[p]] = [h[p]!, h[i]!];
      i = p;
    }
  }
  pop(): Bigram {
    const h = this.items;
    const top = h[0]!;
    const last = h.pop()!;
    if (h.length > 0) {
      h[0] = last;
      for (let i = 0; ; ) {
        const l = 2 * i + 1;
        const r = l + 1;
        let m = i;
        if (l < h.length && this.before(h[l]!, h[m]!)) m = l;
        if (r < h.length && this.before(h[r]!, h[m]!)) m = r;
        if (m === i) break;
        [h[i], h[m]] = [h[m]!, h[i]!];
        i = m;
      }
    }
    return top;
  }
}

/** A Tokenizer over a SentencePiece vocabulary with scores (see the module comment). */
export class SpmTokenizer implements Tokenizer {
  readonly vocabSize: number;
  readonly bosTokenId: number | null;
  readonly eosTokenIds: number[];
  private readonly tokens: string[];
  private readonly scores: number[];
  private readonly types: number[];
  private readonly ids = new Map<string, number>();
  private readonly byteIds = new Map<number, number>();
  /** Control and user-defined token texts, longest first (matched in the text before merging). */
  private readonly specials: string[];
  private readonly addBos: boolean;
  private readonly addSpacePrefix: boolean;

  constructor(o: SpmTokenizerOptions) {
    this.tokens = o.tokens;
    this.scores = o.scores;
    this.types = o.types;
    this.vocabSize = o.tokens.length;
    this.bosTokenId = o.bosTokenId;
    this.eosTokenIds = [...o.eosTokenIds];
    this.addBos = o.addBos;
    this.addSpacePrefix = o.addSpacePrefix;
    o.tokens.forEach((t, id) => {
      if (!this.ids.has(t)) this.ids.set(t, id);
      const byte = BYTE_TOKEN.exec(t);
      if (byte && (o.types.length === 0 || o.types[id] === TYPE_BYTE)) this.byteIds.set(Number.parseInt(byte[1]!, 16), id);
    });
    this.specials = o.tokens.filter((t, id) => t.length > 0 && (o.types[id] === TYPE_CONTROL || o.types[id] === TYPE_USER_DEFINED)).sort((a, b) => b.length - a.length);
  }

  /** Ids of `text`: BOS first when `addSpecialTokens` (default true) and the file asks for it; special tokens in the text become their ids. */
  encode(text: string, options?: { addSpecialTokens?: boolean }): number[] {
    const out: number[] = [];
    if ((options?.addSpecialTokens ?? true) && this.addBos && this.bosTokenId !== null) out.push(this.bosTokenId);
    const pieces = this.splitSpecials(this.addSpacePrefix ? ` ${text}` : text);
    for (const p of pieces) {
      if (p.special !== undefined) out.push(p.special);
      else this.encodeRun(p.text.replaceAll(" ", SPACE), out);
    }
    return out;
  }

  /** The text split at every occurrence of a control or user-defined token (longest tokens first, as llama.cpp does). */
  private splitSpecials(text: string): { text: string; special?: number }[] {
    let parts: { text: string; special?: number }[] = [{ text }];
    for (const sp of this.specials) {
      if (!text.includes(sp)) continue;
      const next: typeof parts = [];
      for (const p of parts) {
        if (p.special !== undefined || !p.text.includes(sp)) {
          next.push(p);
          continue;
        }
        const chunks = p.text.split(sp);
        chunks.forEach((c, i) => {
          if (i > 0) next.push({ text: sp, special: this.ids.get(sp)! });
          if (c.length > 0) next.push({ text: c });
        });
      }
      parts = next;
    }
    return parts;
  }

  /** llama.cpp's SPM merge loop over one run of text (no special tokens in it). */
  private encodeRun(text: string, out: number[]): void {
    if (text.length === 0) return;
    const symbols: Symbol[] = [];
    for (let i = 0; i < text.length; ) {
      const cp = text.codePointAt(i)!;
      const len = cp > 0xffff ? 2 : 1;
      symbols.push({ start: i, end: i + len, prev: symbols.length - 1, next: i + len < text.length ? symbols.length + 1 : -1 });
      i += len;
    }
    const queue = new BigramQueue();
    const tryAdd = (left: number, right: number): void => {
      if (left < 0 || right < 0) return;
      const piece = text.slice(symbols[left]!.start, symbols[right]!.end);
      const id = this.ids.get(piece);
      if (id === undefined) return;
      queue.push({ left, right, score: this.scores[id] ?? 0, size: piece.length });
    };
    for (let i = 1; i < symbols.length; i++) tryAdd(i - 1, i);
    while (queue.size > 0) {
      const b = queue.pop();
      const l = symbols[b.left]!;
      const r = symbols[b.right]!;
      // stale: one side merged since
      if (l.end === l.start || r.end === r.start || r.end - l.start !== b.size || l.end !== r.start) continue;
      l.end = r.end;
      r.end = r.start;
      l.next = r.next;
      if (r.next >= 0) symbols[r.next]!.prev = b.left;
      tryAdd(l.prev, b.left);
      tryAdd(b.left, l.next);
    }
    // Every merge made a token, so a piece that is no token is one character: its bytes
    // (llama.cpp's resegment reaches its merge history only for pieces that are tokens anyway).
    for (let i = 0; i >= 0 && i < symbols.length; i = symbols[i]!.next) {
      const piece = text.slice(symbols[i]!.start, symbols[i]!.end);
      const id = this.ids.get(piece);
      if (id !== undefined) out.push(id);
      else for (const byte of new TextEncoder().encode(piece)) out.push(this.byteIds.get(byte) ?? this.unknownId(piece));
    }
  }

  private unknownId(piece: string): number {
    throw new ModelLoadError("tokenizer", `${JSON.stringify(piece)} is no token and the vocabulary has no byte tokens for it (<0x..>)`, { item: "tokenizer.ggml.tokens" });
  }

  /** The bytes one token stands for: a byte token's byte, else its text with U+2581 as a space. */
  tokenBytes(id: number): Uint8Array {
    const t = this.tokens[id];
    if (t === undefined) return new Uint8Array(0);
    const byte = BYTE_TOKEN.exec(t);
    if (byte && this.types[id] === TYPE_BYTE) return Uint8Array.of(Number.parseInt(byte[1]!, 16));
    return new TextEncoder().encode(t.replaceAll(SPACE, " "));
  }

  /** Text of `ids` (bytes of byte tokens joined before UTF-8 decoding); `skipSpecialTokens` drops control tokens. */
  decode(ids: number[], options?: { skipSpecialTokens?: boolean }): string {
    const parts: Uint8Array[] = [];
    for (const id of ids) {
      if (id < 0 || id >= this.vocabSize) continue;
      if (options?.skipSpecialTokens && this.types[id] === TYPE_CONTROL) continue;
      parts.push(this.tokenBytes(id));
    }
    const all = new Uint8Array(parts.reduce((a, p) => a + p.length, 0));
    let at = 0;
    for (const p of parts) {
      all.set(p, at);
      at += p.length;
    }
    return new TextDecoder().decode(all);
  }

  idToToken(id: number): string | undefined {
    return this.tokens[id];
  }

  tokenToId(token: string): number | undefined {
    return this.ids.get(token);
  }

  vocabulary(): { tokens: string[]; type: VocabularyType } {
    return { tokens: [...this.tokens], type: "byte_fallback" };
  }
}
