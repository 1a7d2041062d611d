// Our Tokenizer interface over @huggingface/tokenizers: built from a tokenizer.json object plus
// tokenizer_config.json (from a folder, or synthesised from GGUF metadata). Knows nothing about
// model weights or chat templates.

import { Tokenizer as HfTokenizerImpl } from "@huggingface/tokenizers";
import type { Tokenizer } from "../checkpoint-types.ts";
import { ModelLoadError } from "../checkpoint/model-load-error.ts";

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

  idToToken(id: number): string | undefined {
    return this.impl.id_to_token(id);
  }

  /** Id of a token string (an added/special token or a vocabulary entry), or undefined. */
  tokenToId(token: string): number | undefined {
    return this.impl.token_to_id(token);
  }
}
