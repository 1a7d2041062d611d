// Incremental detokenization for one completion: token ids in, text deltas out, never half a
// UTF-8 character (a delta is held while the decoded tail ends in U+FFFD). The deltas
// concatenate to the tokenizer's decode of all ids. Knows only `decode`.

const REPLACEMENT = "\uFFFD";
/** Tokens decoded before the new ones so merges and leading spaces come out as in a full decode. */
const CONTEXT = 5;

export class TextStream {
  private readonly ids: number[] = [];
  private prefix = 0;
  private read = 0;

  constructor(private readonly decode: (ids: number[]) => string) {}

  /** Adds a token; returns the text it completes ("" while a character is incomplete). */
  push(id: number): string {
    this.ids.push(id);
    const before = this.decode(this.ids.slice(this.prefix, this.read));
    const after = this.decode(this.ids.slice(this.prefix));
    if (after.length <= before.length || after.endsWith(REPLACEMENT) || !after.startsWith(before)) return "";
    this.read = this.ids.length;
    this.prefix = Math.max(0, this.read - CONTEXT);
    while (this.prefix > 0 && this.decode(this.ids.slice(this.prefix, this.read)).startsWith(REPLACEMENT)) this.prefix--;
    return after.slice(before.length);
  }

  /** The text still held back at the end (an incomplete character becomes U+FFFD). */
  flush(): string {
    if (this.read === this.ids.length) return "";
    const before = this.decode(this.ids.slice(this.prefix, this.read));
    const after = this.decode(this.ids.slice(this.prefix));
    this.read = this.ids.length;
    return after.startsWith(before) ? after.slice(before.length) : after;
  }
}
