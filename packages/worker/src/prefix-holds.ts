// The prompt blocks a decode worker holds for requests between its kv-hold answer and the decode
// that imports the rest: one engine hold per request id, given back when the decode takes it, when
// the request's lease ends, or after `ttlMs` if no decode ever comes.

import type { PrefixHold } from "@airm/rm-core";

export class PrefixHolds {
  private readonly held = new Map<string, { hold: PrefixHold; timer: NodeJS.Timeout }>();

  constructor(private readonly ttlMs: number) {}

  /** Keeps `hold` for `requestId`; false (nothing kept) when that request already holds one. */
  put(requestId: string, hold: PrefixHold): boolean {
    if (this.held.has(requestId)) return false;
    const timer = setTimeout(() => this.drop(requestId), this.ttlMs);
    timer.unref();
    this.held.set(requestId, { hold, timer });
    return true;
  }

  /** The request's hold, now the caller's to release (undefined when it has none). */
  take(requestId: string): PrefixHold | undefined {
    const h = this.held.get(requestId);
    if (!h) return undefined;
    clearTimeout(h.timer);
    this.held.delete(requestId);
    return h.hold;
  }

  /** Gives back the request's hold, if any. */
  drop(requestId: string): void {
    this.take(requestId)?.release();
  }

  get size(): number {
    return this.held.size;
  }
}
