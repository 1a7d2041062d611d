// Finds stop strings in streamed text: text is released as soon as it cannot be the start of a
// stop string; a possible partial match at the end is held back until the next piece decides it.
// Knows nothing about tokens.

export interface StopResult {
  /** Text that may be shown now. */
  text: string;
  /** The stop string that matched, once one has (the stream must end). */
  stoppedBy: string | null;
}

/** Stop-string matcher for one stream. */
export class StopStringMatcher {
  private held = "";
  private stopped: string | null = null;
  private readonly stops: string[];

  /** `stops` are the stop strings; empty strings are ignored. */
  constructor(stops: readonly string[]) {
    this.stops = stops.filter((s) => s.length > 0);
  }

  /**
   * Adds a piece of text. Returns the text that is safe to emit and, when a stop string has
   * appeared (possibly across pieces), which one: the returned text then ends right before it.
   * After a stop, further pushes return nothing.
   */
  push(piece: string): StopResult {
    if (this.stopped !== null) return { text: "", stoppedBy: this.stopped };
    const buf = this.held + piece;
    let at = -1;
    let which: string | null = null;
    for (const s of this.stops) {
      const i = buf.indexOf(s);
      if (i !== -1 && (at === -1 || i < at || (i === at && s.length > which!.length))) {
        at = i;
        which = s;
      }
    }
    if (which !== null) {
      this.stopped = which;
      this.held = "";
      return { text: buf.slice(0, at), stoppedBy: which };
    }
    const keep = this.partialMatchLength(buf);
    this.held = buf.slice(buf.length - keep);
    return { text: buf.slice(0, buf.length - keep), stoppedBy: null };
  }

  /** Releases held-back text at the end of the stream (no stop string matched). */
  flush(): string {
    const out = this.stopped === null ? this.held : "";
    this.held = "";
    return out;
  }

  get stoppedBy(): string | null {
    return this.stopped;
  }

  /** Length of the longest suffix of `buf` that is a proper prefix of some stop string. */
  private partialMatchLength(buf: string): number {
    let best = 0;
    for (const s of this.stops) {
      for (let k = Math.min(s.length - 1, buf.length); k > best; k--) {
        if (buf.endsWith(s.slice(0, k))) {
          best = k;
          break;
        }
      }
    }
    return best;
  }
}
