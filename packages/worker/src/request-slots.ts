// Admission to the engine: a fixed number of slots (the batch width), a FIFO of waiters, and the
// waiting/running counts the vllm:* gauges report. Knows nothing about what runs in a slot.

export class RequestSlots {
  private running = 0;
  private readonly waiters: Array<() => void> = [];

  constructor(public capacity: number) {}

  get numRunning(): number {
    return this.running;
  }

  get numWaiting(): number {
    return this.waiters.length;
  }

  /** Waits for a free slot; the returned function frees it (call once). Rejects if `signal` aborts first. */
  acquire(signal?: AbortSignal): Promise<() => void> {
    const grant = (): (() => void) => {
      this.running++;
      let freed = false;
      return () => {
        if (freed) return;
        freed = true;
        this.running--;
        this.waiters.shift()?.();
      };
    };
    if (this.running < this.capacity && this.waiters.length === 0) return Promise.resolve(grant());
    return new Promise((resolve, reject) => {
      const wake = () => {
        signal?.removeEventListener("abort", onAbort);
        resolve(grant());
      };
      const onAbort = () => {
        const i = this.waiters.indexOf(wake);
        if (i >= 0) this.waiters.splice(i, 1);
        reject(signal!.reason ?? new Error("aborted"));
      };
      if (signal?.aborted) return onAbort();
      signal?.addEventListener("abort", onAbort, { once: true });
      this.waiters.push(wake);
    });
  }
}
