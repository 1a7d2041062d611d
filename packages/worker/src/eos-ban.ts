// min_tokens: a token constraint that takes the end-of-sequence ids out of what may come next, on
// top of the request's grammar matcher (or of every id when it has none), until the completion
// has its minimum length. Knows bitmasks and the vocabulary's size; not the engine.

import type { TokenConstraint } from "@airm/rm-core";

export class EosBan implements TokenConstraint {
  private all: Int32Array | null = null;

  /**
   * `vocabSize` ids, `eosIds` to ban while `banned()` holds; `inner` is the request's own
   * constraint (its mask is copied, never written).
   */
  constructor(
    private readonly vocabSize: number,
    private readonly eosIds: number[],
    private readonly inner: TokenConstraint | undefined,
    private readonly banned: () => boolean,
  ) {}

  allowedTokens(): Int32Array | null {
    const mask = this.inner?.allowedTokens() ?? null;
    if (!this.banned()) return mask;
    const out = mask ? mask.slice() : (this.all ??= new Int32Array(Math.ceil(this.vocabSize / 32)).fill(-1)).slice();
    for (const id of this.eosIds) out[id >> 5] &= ~(1 << (id & 31));
    return out;
  }
}
