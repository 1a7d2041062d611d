// Stop strings on the completion text as it streams: holds back only the tail that could still
// become a stop string, and cuts the text at the first stop found. Knows nothing about tokens.

export class StopStringFilter {
  private pending = "";
  private stopped = false;
  private readonly holdBack: number;

  constructor(private readonly stops: string[]) {
    this.holdBack = stops.reduce((m, s) => Math.max(m, s.length - 1), 0);
  }

  /** True once a stop string was seen; later input is ignored. */
  get hit(): boolean {
    return this.stopped;
  }

  /** Adds a delta; returns the text that is safe to emit now (never any part of a stop string). */
  push(delta: string): string {
    if (this.stopped) return "";
    if (this.stops.length === 0) return delta;
    this.pending += delta;
    let cut = -1;
    for (const s of this.stops) {
      const i = this.pending.indexOf(s);
      if (i >= 0 && (cut < 0 || i < cut)) cut = i;
    }
    if (cut >= 0) {
      this.stopped = true;
      const out = this.pending.slice(0, cut);
      this.pending = "";
      return out;
    }
    let keep = Math.min(this.holdBack, this.pending.length);
    // Keep only a tail that is a prefix of some stop string.
    while (keep > 0 && !this.stops.some((s) => s.startsWith(this.pending.slice(this.pending.length - keep)))) keep--;
    const out = this.pending.slice(0, this.pending.length - keep);
    this.pending = this.pending.slice(this.pending.length - keep);
    return out;
  }

  /** The held-back text at the end of the completion (no stop string followed). */
  flush(): string {
    const out = this.stopped ? "" : this.pending;
    this.pending = "";
    return out;
  }
}
