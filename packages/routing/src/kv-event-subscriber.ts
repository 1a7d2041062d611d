// Follows one worker's KV events into a BlockIndex: a ZMQ SUB socket on the worker's event
// endpoint (vLLM's wire format: [topic, 8-byte big-endian sequence number, msgpack KVEventBatch])
// and, when the worker has one, its replay endpoint (a ROUTER: send the first sequence number
// wanted, get every batch it still keeps from there, then an end marker with sequence -1).
//
// Batches are applied in sequence order. At the start, and after any gap, the missing batches
// are asked from the replay endpoint while live ones wait; a sequence number lower than the one
// expected means the worker restarted (its numbering starts again at 0, with AllBlocksCleared
// first), so its entries go and the replay starts from 0. A router that restarts thus rebuilds
// its index from the replay, and one that misses events catches up instead of routing blind.
// Without a replay endpoint a gap is counted and skipped.

import { decode } from "@msgpack/msgpack";
import type { BlockIndex } from "./block-index.ts";

/** One decoded KV event: blocks a worker stored or removed, or all of them cleared. */
export type KvEvent = { kind: "stored"; ids: bigint[] } | { kind: "removed"; ids: bigint[] } | { kind: "cleared" };

/** A block hash as events carry it (an integer, or bytes whose last 8 are the id) as a 64-bit id. */
export function blockIdOf(h: unknown): bigint {
  if (typeof h === "bigint") return BigInt.asUintN(64, h);
  if (typeof h === "number" && Number.isInteger(h)) return BigInt.asUintN(64, BigInt(h));
  if (h instanceof Uint8Array && h.length >= 8) return Buffer.from(h.buffer, h.byteOffset, h.byteLength).readBigUInt64BE(h.length - 8);
  throw new TypeError(`not a block hash: ${String(h)}`);
}

/** A vLLM event (a map with "type", or the array form with the tag first) as a KvEvent; null for a kind a router does not use. */
export function kvEventOf(e: unknown): KvEvent | null {
  let type: unknown;
  let hashes: unknown;
  if (Array.isArray(e)) [type, hashes] = e;
  else if (e && typeof e === "object") ({ type, block_hashes: hashes } = e as { type?: unknown; block_hashes?: unknown });
  if (type === "AllBlocksCleared") return { kind: "cleared" };
  if (type !== "BlockStored" && type !== "BlockRemoved") return null;
  if (!Array.isArray(hashes)) throw new TypeError(`${type} without block_hashes`);
  return { kind: type === "BlockStored" ? "stored" : "removed", ids: hashes.map(blockIdOf) };
}

/** A KVEventBatch's msgpack bytes ([ts, events, data_parallel_rank]) as its events. */
export function decodeBatch(payload: Uint8Array): KvEvent[] {
  const batch = decode(payload, { useBigInt64: true });
  if (!Array.isArray(batch) || !Array.isArray(batch[1])) throw new TypeError("a KVEventBatch is [ts, events, rank]");
  return batch[1].map(kvEventOf).filter((e): e is KvEvent => e !== null);
}

/** Applies one worker's events to the index. */
export function applyEvents(index: BlockIndex, worker: string, events: KvEvent[]): void {
  for (const e of events) {
    if (e.kind === "cleared") index.cleared(worker);
    else if (e.kind === "stored") index.stored(worker, e.ids);
    else index.removed(worker, e.ids);
  }
}

export interface SubscriberOptions {
  /** The worker's name in the index (its URL). */
  worker: string;
  /** Its event endpoint to connect to (tcp://host:port or ipc://path). */
  endpoint: string;
  /** Its replay endpoint (null: none). */
  replayEndpoint: string | null;
  index: BlockIndex;
  /** How long a replay may take before the batches it missed are given up (ms, default 2000). */
  replayTimeoutMs?: number;
  /** Told about what a log would want: a replay, a restart seen, a gap given up, a bad batch. */
  onNote?(what: "replay" | "restart" | "gap" | "bad_batch", detail: string): void;
}

const seqBytes = (seq: bigint): Buffer => {
  const b = Buffer.alloc(8);
  b.writeBigInt64BE(seq);
  return b;
};

type Zmq = typeof import("zeromq");

export class KvEventSubscriber {
  /** The next sequence number to apply (null: nothing applied yet). */
  private next: bigint | null = null;
  private readonly waiting = new Map<bigint, Uint8Array>();
  private replaying = false;
  private closed = false;
  private sub: import("zeromq").Subscriber | null = null;
  /** Batches and events applied, replays asked, batches given up. */
  readonly counts = { batches: 0, events: 0, replays: 0, missed: 0 };

  constructor(private readonly o: SubscriberOptions) {}

  /** Connects and asks for everything the worker still keeps; resolves once connected (the replay runs on). */
  async start(): Promise<void> {
    const zmq: Zmq = await import("zeromq");
    if (this.closed) return;
    this.sub = new zmq.Subscriber();
    this.sub.connect(this.o.endpoint);
    this.sub.subscribe();
    void this.receive(this.sub);
    void this.catchUp(0n);
  }

  /** Drops the worker's entries and rebuilds them from the replay (its process changed). */
  reset(): void {
    this.o.index.cleared(this.o.worker);
    this.next = null;
    this.waiting.clear();
    void this.catchUp(0n);
  }

  close(): void {
    this.closed = true;
    this.sub?.close();
    this.o.index.cleared(this.o.worker);
  }

  private async receive(sub: import("zeromq").Subscriber): Promise<void> {
    try {
      for await (const [, seq, payload] of sub) {
        if (this.closed) return;
        if (seq?.length !== 8 || !payload) continue;
        this.live(seq.readBigInt64BE(0), payload);
      }
    } catch {
      // closed
    }
  }

  private live(seq: bigint, payload: Uint8Array): void {
    if (this.replaying) {
      this.waiting.set(seq, payload);
      return;
    }
    if (this.next === null || seq === this.next) return void this.apply(seq, payload);
    if (seq < this.next) {
      // Numbering started again: the worker restarted.
      this.o.onNote?.("restart", `sequence ${seq} after ${this.next - 1n}`);
      this.o.index.cleared(this.o.worker);
      this.next = null;
      this.waiting.set(seq, payload);
      return void this.catchUp(0n);
    }
    this.waiting.set(seq, payload);
    void this.catchUp(this.next);
  }

  private apply(seq: bigint, payload: Uint8Array): void {
    try {
      const events = decodeBatch(payload);
      applyEvents(this.o.index, this.o.worker, events);
      this.counts.batches++;
      this.counts.events += events.length;
    } catch (err) {
      this.o.onNote?.("bad_batch", `sequence ${seq}: ${(err as Error).message}`);
    }
    this.next = seq + 1n;
  }

  /** Asks the replay endpoint for the batches from `from`, applies them, then the live ones that waited. */
  private async catchUp(from: bigint): Promise<void> {
    if (this.replaying || this.closed) return;
    this.replaying = true;
    try {
      if (this.o.replayEndpoint) await this.replay(from);
    } finally {
      this.replaying = false;
    }
    this.drain();
  }

  private async replay(from: bigint): Promise<void> {
    this.counts.replays++;
    this.o.onNote?.("replay", `from sequence ${from}`);
    const zmq: Zmq = await import("zeromq");
    const dealer = new zmq.Dealer({ receiveTimeout: this.o.replayTimeoutMs ?? 2000, linger: 0 });
    try {
      dealer.connect(this.o.replayEndpoint!);
      await dealer.send([Buffer.alloc(0), seqBytes(from)]);
      for (;;) {
        const frames = await dealer.receive();
        const [, , seq, payload] = frames;
        if (seq?.length !== 8) continue;
        const s = seq.readBigInt64BE(0);
        if (s < 0n) return;
        if (this.next === null || s >= this.next) {
          if (this.next !== null && s > this.next) this.gap(this.next, s);
          this.apply(s, payload);
        }
      }
    } catch (err) {
      if (!this.closed) this.o.onNote?.("gap", `replay from ${from} failed: ${(err as Error).message}`);
    } finally {
      dealer.close();
    }
  }

  /** Applies the live batches that waited, in order; a hole left after a replay is given up (counted). */
  private drain(): void {
    const seqs = [...this.waiting.keys()].sort((a, b) => (a < b ? -1 : a > b ? 1 : 0));
    for (const s of seqs) {
      const payload = this.waiting.get(s)!;
      this.waiting.delete(s);
      if (this.next !== null && s < this.next) continue;
      if (this.next !== null && s > this.next) this.gap(this.next, s);
      this.apply(s, payload);
    }
  }

  private gap(expected: bigint, got: bigint): void {
    this.counts.missed += Number(got - expected);
    this.o.onNote?.("gap", `batches ${expected} to ${got - 1n} are gone`);
  }
}
