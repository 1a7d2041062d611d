// Groups the decode steps of concurrently running requests into one engine.decode call of up to
// B streams. A request awaits its own next token; requests that step in the same event-loop
// turn share a call, and one call runs per turn. Knows nothing about HTTP or the KV handoff.

import type { DecodeResult, DecodeStep } from "@airm/rm-core";
import type { EngineStream, ServingEngine } from "./serving-engine.ts";

interface Pending {
  step: DecodeStep & { stream: EngineStream };
  onGroup?: (size: number) => void;
  resolve(next: DecodeResult): void;
  reject(err: unknown): void;
}

export class DecodeBatcher {
  private readonly queue: Pending[] = [];
  private scheduled = false;

  constructor(
    private readonly engine: Pick<ServingEngine, "decode">,
    private readonly batch: number,
    private readonly onStep: (streams: number) => void = () => {},
  ) {}

  /**
   * Appends the step's token to its stream and resolves with the stream's next token (and
   * log-probabilities when asked). `onGroup` is told how many streams shared the engine call.
   */
  step(step: DecodeStep & { stream: EngineStream }, onGroup?: (size: number) => void): Promise<DecodeResult> {
    return new Promise((resolve, reject) => {
      this.queue.push({ step, onGroup, resolve, reject });
      if (!this.scheduled) {
        this.scheduled = true;
        setImmediate(() => void this.drain());
      }
    });
  }

  /**
   * Runs one group, then leaves the rest to the next turn of the event loop. Looping here instead
   * would starve it: a stream resolved by one step pushes its next step while the following step's
   * await settles, so with streams out of phase (arrived apart, or several choices) the queue is
   * never empty and nothing else (token writes, /health, new requests) would run until every
   * stream had finished. A turn also lets every resolved stream rejoin before the next group.
   */
  private async drain(): Promise<void> {
    const group = this.queue.splice(0, this.batch);
    this.onStep(group.length);
    for (const g of group) g.onGroup?.(group.length);
    try {
      const next = await this.engine.decode(group.map((g) => g.step));
      for (const [i, g] of group.entries()) {
        if (next[i].error !== undefined) g.reject(next[i].error);
        else g.resolve(next[i]);
      }
    } catch (err) {
      for (const g of group) g.reject(err);
    }
    if (this.queue.length) setImmediate(() => void this.drain());
    else this.scheduled = false;
  }
}
