// Groups the decode steps of concurrently running requests into one engine.decode call of up to
// B streams. A request awaits its own next token; requests that step in the same event-loop
// turn share a call. Knows nothing about HTTP or the KV handoff.

import type { DecodeResult, DecodeStep } from "@airm/rm-core";
import type { EngineStream, ServingEngine } from "./serving-engine.ts";

interface Pending {
  step: DecodeStep & { stream: EngineStream };
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

  /** Appends the step's token to its stream and resolves with the stream's next token (and log-probabilities when asked). */
  step(step: DecodeStep & { stream: EngineStream }): Promise<DecodeResult> {
    return new Promise((resolve, reject) => {
      this.queue.push({ step, resolve, reject });
      if (!this.scheduled) {
        this.scheduled = true;
        setImmediate(() => void this.drain());
      }
    });
  }

  private async drain(): Promise<void> {
    while (this.queue.length) {
      const group = this.queue.splice(0, this.batch);
      this.onStep(group.length);
      try {
        const next = await this.engine.decode(group.map((g) => g.step));
        for (const [i, g] of group.entries()) {
          if (next[i].error !== undefined) g.reject(next[i].error);
          else g.resolve(next[i]);
        }
      } catch (err) {
        for (const g of group) g.reject(err);
      }
    }
    this.scheduled = false;
  }
}
