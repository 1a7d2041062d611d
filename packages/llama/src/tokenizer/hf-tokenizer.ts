// Our Tokenizer interface over @huggingface/tokenizers: built from a tokenizer.json object plus
// tokenizer_config.json (from a folder, or synthesised from GGUF metadata). Knows nothing about
// model weights or chat templates.

import { Tokenizer as HfTokenizerImpl } from "@huggingface/tokenizers";
import type { Tokenizer, VocabularyType } from "../checkpoint-types.ts";
import { ModelLoadError } from "../checkpoint/model-load-error.ts";
import { bytesToUnicode } from "./byte-level-bpe.ts";

/** True when a tokenizer.json decoder (or one in its Sequence) is ByteLevel: token strings spell bytes in GPT-2's table. */
function decodesByteLevel(decoder: unknown): boolean {
  const d = decoder as { type?: unknown; decoders?: unknown[] } | null | undefined;
  if (!d) return false;
  if (d.type === "ByteLevel") return true;
  return d.type === "Sequence" && Array.isArray(d.decoders) && d.decoders.some(decodesByteLevel);
}

const BYTE_FALLBACK = /^<0x([0-9A-Fa-f]{2})>$/;

export interface HfTokenizerOptions {
  /** Where the tokenizer came from, for error messages. */
  file: string;
  bosTokenId: number | null;
  eosTokenIds: number[];
}

/** A Tokenizer backed by a Hugging Face tokenizer.json. */
export class HfTokenizer implements Tokenizer {
  readonly vocabSize: number;
  /** Set by the loader when only the tokenizer files know it. */
  bosTokenId: number | null;
  eosTokenIds: number[];
  private readonly impl: HfTokenizerImpl;
  /** Byte of each GPT-2 table character, when the decoder is ByteLevel. */
  private readonly byteOfChar: Map<string, number> | null;
  private readonly addedIds: Set<number>;

  /**
   * `tokenizerJson` is the parsed tokenizer.json, `tokenizerConfig` the parsed
   * tokenizer_config.json (or `{}`). Throws ModelLoadError naming `options.file` when the
   * tokenizer library rejects the definition.
   */
  constructor(tokenizerJson: unknown, tokenizerConfig: Record<string, unknown>, options: HfTokenizerOptions) {
    try {
      this.impl = new HfTokenizerImpl(tokenizerJson as object, { clean_up_tokenization_spaces: false, ...tokenizerConfig });
    } catch (cause) {
      throw new ModelLoadError(options.file, `tokenizer definition rejected: ${(cause as Error).message}`, { cause });
    }
    let maxId = -1;
    for (const id of this.impl.get_vocab(true).values()) if (id > maxId) maxId = id;
    this.vocabSize = maxId + 1;
    this.bosTokenId = options.bosTokenId;
    this.eosTokenIds = [...options.eosTokenIds];
    const json = tokenizerJson as { decoder?: unknown; added_tokens?: { id?: unknown }[] };
    this.byteOfChar = decodesByteLevel(json.decoder) ? new Map(bytesToUnicode().map((c, b) => [c, b])) : null;
    this.addedIds = new Set((json.added_tokens ?? []).map((t) => t.id).filter((id): id is number => typeof id === "number"));
  }

  /**
   * The bytes one token stands for: a byte-level token's bytes (possibly part of a UTF-8
   * character), a byte-fallback token's byte (`<0x0A>`), an added token's UTF-8; otherwise the
   * UTF-8 of the token decoded alone. Empty for an id outside the vocabulary.
   */
  tokenBytes(id: number): Uint8Array {
    const token = this.impl.id_to_token(id);
    if (token === undefined) return new Uint8Array(0);
    const utf8 = new TextEncoder();
    if (this.addedIds.has(id)) return utf8.encode(token);
    const fallback = BYTE_FALLBACK.exec(token);
    if (fallback) return Uint8Array.of(Number.parseInt(fallback[1]!, 16));
    if (this.byteOfChar) {
      const out: number[] = [];
      for (const ch of token) {
        const b = this.byteOfChar.get(ch);
        if (b === undefined) return utf8.encode(this.decode([id]));
        out.push(b);
      }
      return Uint8Array.from(out);
    }
    return utf8.encode(this.decode([id]));
  }

  /** Token ids of `text`. `addSpecialTokens` (default true, as in Hugging Face) runs the post-processor. */
  encode(text: string, options?: { addSpecialTokens?: boolean }): number[] {
    return this.impl.encode(text, { add_special_tokens: options?.addSpecialTokens ?? true }).ids;
  }

  /** Text of `ids`; an empty list decodes to "". Ids outside the vocabulary decode to nothing. */
  decode(ids: number[], options?: { skipSpecialTokens?: boolean }): string {
    const known = ids.filter((id) => this.impl.id_to_token(id) !== undefined);
    if (known.length === 0) return "";
    return this.impl.decode(known, { skip_special_tokens: options?.skipSpecialTokens ?? false });
  }

  /**
   * Token strings by id ("" for an unused id) and how they spell bytes: GPT-2's byte table
   * (byte_level), `<0xAB>` byte tokens (byte_fallback), or the text itself (raw).
   */
  vocabulary(): { tokens: string[]; type: VocabularyType } {
    const tokens: string[] = [];
    for (let id = 0; id < this.vocabSize; id++) tokens.push(this.impl.id_to_token(id) ?? "");
    const type: VocabularyType = this.byteOfChar ? "byte_level" : tokens.some((t) => BYTE_FALLBACK.test(t)) ? "byte_fallback" : "raw";
    return { tokens, type };
  }

  idToToken(id: number): string | undefined {
    return this.impl.id_to_token(id);
  }

  /** Id of a token string (an added/special token or a vocabulary entry), or undefined. */
  tokenToId(token: string): number | undefined {
    return this.impl.token_to_id(token);
  }
}
