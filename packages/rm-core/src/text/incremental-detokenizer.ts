// Turns a stream of token ids into text pieces without ever emitting half a UTF-8 character: a
// piece is released only when the decoded tail no longer ends in U+FFFD (an incomplete byte
// sequence). The pieces concatenate to tokenizer.decode(all ids). Knows only a tokenizer's
// decode; the worker uses it for completion text, @airm/llama's tools for their output.

const REPLACEMENT = "\uFFFD";
/** Tokens kept before the unread ones so the decoder sees context (leading spaces, merges). */
const CONTEXT_TOKENS = 6;

export interface IncrementalDetokenizerOptions {
  skipSpecialTokens?: boolean;
}

/** Incremental detokeniser for one stream. */
export class IncrementalDetokenizer {
  private readonly ids: number[] = [];
  /** Start of the window decoded for context. */
  private prefixOffset = 0;
  /** End of what has been emitted (in tokens). */
  private readOffset = 0;
  private readonly decodeOptions: { skipSpecialTokens?: boolean };
  private emitted = "";

  constructor(
    private readonly tokenizer: { decode(ids: number[], options?: { skipSpecialTokens?: boolean }): string },
    options: IncrementalDetokenizerOptions = {},
  ) {
    this.decodeOptions = { skipSpecialTokens: options.skipSpecialTokens ?? false };
  }

  /** Adds one token; returns the text it completes ("" while a character is still incomplete). */
  push(tokenId: number): string {
    this.ids.push(tokenId);
    const prefixText = this.decode(this.prefixOffset, this.readOffset);
    const fullText = this.decode(this.prefixOffset, this.ids.length);
    if (fullText.length <= prefixText.length || fullText.endsWith(REPLACEMENT) || !fullText.startsWith(prefixText)) return "";
    const piece = fullText.slice(prefixText.length);
    this.readOffset = this.ids.length;
    this.prefixOffset = Math.max(this.prefixOffset, this.readOffset - CONTEXT_TOKENS);
    // keep the context window aligned with what was decoded before, so the next diff is exact
    this.realign();
    this.emitted += piece;
    return piece;
  }

  /** Emits whatever is held back (an incomplete character becomes U+FFFD, as decode() gives). */
  flush(): string {
    if (this.readOffset === this.ids.length) return "";
    const prefixText = this.decode(this.prefixOffset, this.readOffset);
    const fullText = this.decode(this.prefixOffset, this.ids.length);
    const piece = fullText.startsWith(prefixText) ? fullText.slice(prefixText.length) : fullText;
    this.readOffset = this.ids.length;
    this.emitted += piece;
    return piece;
  }

  /** All text emitted so far. */
  get text(): string {
    return this.emitted;
  }

  /** Token ids pushed so far. */
  get tokenIds(): readonly number[] {
    return this.ids;
  }

  private realign(): void {
    // A window that starts inside a multi-byte character would decode with a leading U+FFFD.
    while (this.prefixOffset > 0 && this.decode(this.prefixOffset, this.readOffset).startsWith(REPLACEMENT)) this.prefixOffset--;
  }

  private decode(from: number, to: number): string {
    if (to <= from) return "";
    return this.tokenizer.decode(this.ids.slice(from, to), this.decodeOptions);
  }
}
