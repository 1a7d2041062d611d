// Admission to the engine by KV blocks: a request runs once the engine has set aside the blocks
// its prompt needs (a reservation) and fewer than max_num_seqs requests run; otherwise it waits,
// first come first served, and is admitted when blocks come back (the engine says when) or a
// request ends. A preempted stream waiting to be recomputed goes ahead of new requests. The
// waiting and running counts are what the vllm:* gauges report. Knows the engine's reserve and
// its freed-blocks signal; nothing of what runs.

import { ConfigError, isAirmError, type KVReservation } from "@airm/rm-core";

/** What admission needs of the engine. */
export interface BlockSource {
  reserve(positions: number, extra?: number): KVReservation | null;
  onBlocksFreed(listener: () => void): () => void;
}

/** A granted admission: the reserved blocks, and `release()` (call once, when the request ends) frees the running slot and any unspent blocks. */
export interface Admitted {
  reservation: KVReservation;
  release(): void;
}

interface Waiter {
  positions: number;
  extra: number;
  /** Takes no running slot (a preempted stream's recompute: it kept its slot). */
  slotless: boolean;
  grant(r: KVReservation): void;
  fail(e: unknown): void;
}

export class Admission {
  private running = 0;
  private readonly waiters: Waiter[] = [];
  private source: BlockSource | null = null;
  private unsubscribe: (() => void) | null = null;
  /** Preempted streams waiting for their blocks (counted as waiting, not running, as vLLM does). */
  private preemptedWaiting = 0;

  /** `maxRunning`: requests that run at once (max_num_seqs). */
  constructor(public maxRunning: number) {}

  /** Where blocks come from (the loaded engine). */
  attach(source: BlockSource): void {
    this.unsubscribe?.();
    this.source = source;
    this.unsubscribe = source.onBlocksFreed(() => this.pump());
  }

  /** Requests admitted and not preempted. */
  get numRunning(): number {
    return this.running - this.preemptedWaiting;
  }

  /** Requests waiting for blocks or a slot (preempted streams included). */
  get numWaiting(): number {
    return this.waiters.filter((w) => !w.slotless).length + this.preemptedWaiting;
  }

  /**
   * Waits until blocks for `positions` positions (plus `extra` blocks) are reserved and a running
   * slot is free. Rejects with the signal's reason if it aborts first, and at once with
   * ContextOverflowError when the pool can never hold them.
   */
  acquire(o: { positions: number; extra?: number; signal?: AbortSignal }): Promise<Admitted> {
    return this.enqueue({ positions: o.positions, extra: o.extra ?? 0, slotless: false, front: false, signal: o.signal }).then((reservation) => {
      let released = false;
      return {
        reservation,
        release: () => {
          if (released) return;
          released = true;
          reservation.release();
          this.running--;
          this.pump();
        },
      };
    });
  }

  /**
   * Blocks for a preempted stream of an admitted request (it keeps its running slot): ahead of
   * every new request. The stream counts as waiting until they are granted.
   */
  async readmit(o: { positions: number; signal?: AbortSignal }): Promise<KVReservation> {
    this.preemptedWaiting++;
    try {
      return await this.enqueue({ positions: o.positions, extra: 0, slotless: true, front: true, signal: o.signal });
    } finally {
      this.preemptedWaiting--;
    }
  }

  private enqueue(o: { positions: number; extra: number; slotless: boolean; front: boolean; signal?: AbortSignal }): Promise<KVReservation> {
    if (!this.source) return Promise.reject(new ConfigError("engine", "admission before the engine loaded"));
    return new Promise<KVReservation>((resolve, reject) => {
      const onAbort = () => {
        const i = this.waiters.indexOf(w);
        if (i >= 0) this.waiters.splice(i, 1);
        reject(o.signal!.reason ?? new Error("aborted"));
        this.pump();
      };
      const w: Waiter = {
        positions: o.positions,
        extra: o.extra,
        slotless: o.slotless,
        grant: (r) => {
          o.signal?.removeEventListener("abort", onAbort);
          resolve(r);
        },
        fail: (e) => {
          o.signal?.removeEventListener("abort", onAbort);
          reject(e);
        },
      };
      if (o.signal?.aborted) return reject(o.signal.reason ?? new Error("aborted"));
      o.signal?.addEventListener("abort", onAbort, { once: true });
      if (o.front) this.waiters.unshift(w);
      else this.waiters.push(w);
      this.pump();
    });
  }

  /** Grants waiters in order while blocks and slots last; the first that cannot go holds the rest (first come, first served). */
  private pump(): void {
    while (this.waiters.length > 0 && this.source) {
      const w = this.waiters[0];
      if (!w.slotless && this.running >= this.maxRunning) return;
      let r: KVReservation | null;
      try {
        r = this.source.reserve(w.positions, w.extra);
      } catch (e) {
        this.waiters.shift();
        w.fail(isAirmError(e) ? e : new Error(String(e)));
        continue;
      }
      if (!r) return;
      this.waiters.shift();
      if (!w.slotless) this.running++;
      w.grant(r);
    }
  }
}
