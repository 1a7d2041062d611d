// The main-thread half of a UCX endpoint: starts the progress thread (ucx-thread.ts), maps its
// registered arena into this thread, hands out arena ranges and ack tickets, and turns READ
// requests into promises with deadlines. Engines are pooled per process and reused after a
// transport closes, because arena memory is never unmapped while a view of it might be alive.
// It knows nothing about keys or descriptors (nixl-ucx-transport.ts does).

import { Worker, MessageChannel, type MessagePort } from "node:worker_threads";
import { existsSync, readFileSync } from "node:fs";
import { dirname, join } from "node:path";
import { createRequire } from "node:module";
import { fileURLToPath, pathToFileURL } from "node:url";
import koffi from "koffi";
import { RangeAllocator, TransportError, TransportTimeoutError } from "@airm/rm-core";
import { closeFd, createEventFd, pointerAt, signalEventFd } from "./ucp-binding.ts";
import type { PeerRef, ThreadCommand, ThreadEvent, ThreadInit } from "./ucx-thread-protocol.ts";

/** Ack words producers watch (4 bytes each), then the words consumers put from, then slots. */
const ACK_WORDS = 16384;
/** How many pushed blobs one endpoint can have outstanding (one ack word each). */
export const ACK_WORDS_PER_ENDPOINT = ACK_WORDS;
const SOURCE_WORDS = 16384;
const HEADER_BYTES = (ACK_WORDS + SOURCE_WORDS) * 4;

export interface EngineConfig {
  poolBytes: number;
  /** UCX_TLS for this endpoint only; undefined = the process environment's UCX_TLS. */
  tls?: string;
  errMode: "auto" | "peer" | "none";
  spinMs: number;
}

export interface AckTicket {
  index: number;
  value: number;
  /** Absolute address of the ack word in this arena. */
  addr: number;
}

function threadEntry(): { entry: string; tsx?: string } {
  const ts = new URL("./ucx-thread.ts", import.meta.url);
  if (existsSync(fileURLToPath(ts))) {
    // The thread runs the TypeScript source too: register tsx's ESM loader there first.
    const pkgPath = createRequire(import.meta.url).resolve("tsx/package.json");
    const pkg = JSON.parse(readFileSync(pkgPath, "utf8")) as { exports: Record<string, { import: { default: string } }> };
    return { entry: ts.href, tsx: pathToFileURL(join(dirname(pkgPath), pkg.exports["./esm/api"].import.default)).href };
  }
  return { entry: new URL("./ucx-thread.js", import.meta.url).href };
}

/** Engines with commands issued in this tick. */
const toFlush: UcxEngine[] = [];

/**
 * Every engine's commands of one tick go out together: first all messages, then the wake-ups.
 * (Waking a thread can hand it this CPU at once; posting first keeps the other lanes from
 * waiting behind it.)
 */
function scheduleFlush(e: UcxEngine): void {
  toFlush.push(e);
  if (toFlush.length > 1) return;
  process.nextTick(() => {
    const engines = toFlush.splice(0);
    const sleepers = engines.filter((x) => x.post());
    for (const x of sleepers) x.wake();
  });
}

const BOOTSTRAP = `
const { workerData } = require("node:worker_threads");
(async () => {
  if (workerData.tsx) (await import(workerData.tsx)).register();
  await import(workerData.entry);
})().catch((e) => { workerData.init.port.postMessage({ type: "failed", message: String(e && e.stack || e) }); });
`;

/** One UCX context + worker + registered arena, driven by its own progress thread. */
export class UcxEngine {
  readonly config: EngineConfig;
  readonly version: string;
  readonly address: Uint8Array;
  readonly rkey: Uint8Array;
  readonly base: number;
  readonly resources: string[];
  readonly errMode: "peer" | "none";
  /** The whole arena, mapped in this thread. */
  readonly memory: Uint8Array;
  private readonly slots: RangeAllocator;
  private readonly ackWords: Uint32Array;
  private readonly sourceWords: Uint32Array;
  private readonly ackGeneration = new Uint32Array(ACK_WORDS);
  private readonly freeAcks: number[] = [];
  private nextSource = 0;
  private nextId = 1;
  private readonly pending = new Map<number, { resolve: (crc: number | undefined) => void; reject: (e: Error) => void; settle: (stuck: boolean) => void }>();
  private closed = false;

  private constructor(
    private readonly worker: Worker,
    private readonly port: MessagePort,
    private readonly wakeFd: number,
    private readonly sleeping: Int32Array,
    config: EngineConfig,
    ready: Extract<ThreadEvent, { type: "ready" }>,
  ) {
    this.config = config;
    this.version = ready.version;
    this.address = ready.address;
    this.rkey = ready.rkey;
    this.base = ready.base;
    this.resources = ready.resources;
    this.errMode = ready.errMode;
    this.memory = new Uint8Array(koffi.view(pointerAt(ready.base), ready.length));
    this.ackWords = new Uint32Array(this.memory.buffer, 0, ACK_WORDS);
    this.sourceWords = new Uint32Array(this.memory.buffer, ACK_WORDS * 4, SOURCE_WORDS);
    this.slots = new RangeAllocator(ready.length - HEADER_BYTES);
    for (let i = ACK_WORDS - 1; i >= 0; i--) this.freeAcks.push(i);
    port.on("message", (e: ThreadEvent) => this.onEvent(e));
    port.unref();
    worker.unref();
    const died = (why: string) => {
      if (this.closed) return;
      this.dead = why;
      for (const [, p] of this.pending) {
        p.reject(new TransportError(`nixl-ucx: the UCX progress thread stopped (${why}); this endpoint cannot READ any more: create a new one`));
        p.settle(true);
      }
      this.pending.clear();
    };
    worker.on("error", (e) => died(e.message));
    worker.on("exit", (code) => died(`exit code ${code}`));
  }

  /** Why the progress thread is gone, if it is. */
  private dead: string | undefined;

  /** False once the progress thread stopped or shutdown() ran. */
  get alive(): boolean {
    return !this.dead && !this.closed;
  }

  /** Starts a progress thread with its own UCX context. Throws TransportError if UCX cannot start. */
  static async start(config: EngineConfig): Promise<UcxEngine> {
    if (config.poolBytes <= HEADER_BYTES) throw new TransportError(`the UCX arena must be larger than ${HEADER_BYTES} bytes`);
    const wakeFd = createEventFd();
    const { port1, port2 } = new MessageChannel();
    const sleeping = new SharedArrayBuffer(4);
    const init: ThreadInit = { port: port2, wakeFd, poolBytes: config.poolBytes, tls: config.tls, errMode: config.errMode, spinMs: config.spinMs, sleeping };
    const { entry, tsx } = threadEntry();
    const worker = new Worker(BOOTSTRAP, { eval: true, workerData: { entry, tsx, init }, transferList: [port2] });
    const ready = await new Promise<ThreadEvent>((resolve, reject) => {
      port1.once("message", resolve);
      worker.once("error", reject);
      worker.once("exit", (code) => reject(new Error(`the UCX progress thread exited (code ${code}) before it was ready`)));
    }).catch((e: Error) => ({ type: "failed" as const, message: e.message }));
    if (ready.type !== "ready") {
      await worker.terminate();
      closeFd(wakeFd);
      const message = ready.type === "failed" ? ready.message : `unexpected ${ready.type}`;
      throw new TransportError(`nixl-ucx: UCX did not start: ${message}`);
    }
    return new UcxEngine(worker, port1, wakeFd, new Int32Array(sleeping), config, ready);
  }

  /** Commands issued in this tick; they go to the thread in one message. */
  private outbox: ThreadCommand[] = [];

  private send(c: ThreadCommand): void {
    this.outbox.push(c);
    if (this.outbox.length === 1) scheduleFlush(this);
  }

  /** Posts the outbox; returns whether the thread sleeps (then it needs wake()). */
  post(): boolean {
    const batch = this.outbox;
    if (!batch.length) return false;
    this.outbox = [];
    this.port.postMessage(batch);
    // A read-modify-write, so it is ordered after the postMessage on every CPU. A polling thread
    // sees the message on its next pass; only a sleeping one needs the eventfd.
    return Atomics.compareExchange(this.sleeping, 0, 1, 1) !== 0;
  }

  wake(): void {
    signalEventFd(this.wakeFd);
  }

  private flush(): void {
    if (this.post()) this.wake();
  }

  private onEvent(e: ThreadEvent): void {
    if (e.type === "batch") {
      for (const x of e.events) this.onEvent(x);
      return;
    }
    if (e.type !== "done") return;
    const p = this.pending.get(e.id);
    if (!p) return;
    this.pending.delete(e.id);
    if (e.status === 0) p.resolve(e.crc);
    else p.reject(new TransportError(`nixl-ucx: ${e.message ?? `READ failed with UCX status ${e.status}`}`));
    p.settle(e.stuck === true);
  }

  /** Address of a slot offset. */
  addressOf(offset: number): number {
    return this.base + HEADER_BYTES + offset;
  }

  /** A view of `length` bytes of the slot at `offset`. */
  view(offset: number, length: number): Uint8Array {
    return this.memory.subarray(HEADER_BYTES + offset, HEADER_BYTES + offset + length);
  }

  /** A slot of at least `length` bytes, or -1 when the arena has no room. */
  allocate(length: number): number {
    return this.slots.allocate(Math.max(1, length));
  }

  free(offset: number): void {
    this.slots.release(offset);
  }

  get slotBytes(): number {
    return this.slots.size;
  }

  largestFree(): number {
    return this.slots.largestFree();
  }

  /** A fresh ack word (its value is never one the word held before), or undefined when all are taken. */
  takeAck(): AckTicket | undefined {
    const index = this.freeAcks.pop();
    if (index === undefined) return undefined;
    let value = (this.ackGeneration[index] + 1) >>> 0;
    if (value === 0) value = 1;
    this.ackGeneration[index] = value;
    return { index, value, addr: this.base + index * 4 };
  }

  /** True once a consumer has put the ticket's value into its word. */
  acked(t: AckTicket): boolean {
    return this.ackWords[t.index] === t.value;
  }

  returnAck(t: AckTicket): void {
    this.freeAcks.push(t.index);
  }

  /**
   * READs `length` bytes at `remoteAddr` of `peer` into the slot at `localOffset`; resolves with the
   * CRC-32 of the bytes that arrived when the thread took it (else undefined). Rejects with TransportError on a failed READ and
   * TransportTimeoutError after `timeoutMs`. `settled` resolves once UCX no longer touches the
   * slot (`stuck` true means it never will be safe to reuse).
   */
  read(peer: PeerRef, remoteAddr: number, length: number, localOffset: number, timeoutMs: number): { done: Promise<number | undefined>; settled: Promise<boolean> } {
    if (this.closed || this.dead) {
      const e = Promise.reject(
        this.dead
          ? new TransportError(`nixl-ucx: the UCX progress thread stopped (${this.dead}); create a new endpoint`)
          : new TransportError("nixl-ucx: the endpoint is closed", "TRANSPORT_CLOSED"),
      );
      return { done: e, settled: Promise.resolve(false) };
    }
    const id = this.nextId++;
    let settle!: (stuck: boolean) => void;
    const settled = new Promise<boolean>((r) => (settle = r));
    const done = new Promise<number | undefined>((resolve, reject) => {
      const timer = setTimeout(
        () => {
          reject(new TransportTimeoutError(`nixl-ucx: the READ of ${length} bytes did not complete within ${timeoutMs} ms; is the producer process alive?`));
          this.send({ type: "abort", id });
        },
        Math.max(1, timeoutMs),
      );
      this.pending.set(id, {
        resolve: (crc) => {
          clearTimeout(timer);
          resolve(crc);
        },
        reject: (e) => {
          clearTimeout(timer);
          reject(e);
        },
        settle,
      });
    });
    this.send({ type: "get", id, peer, remoteAddr, length, localOffset: HEADER_BYTES + localOffset });
    return { done, settled };
  }

  /** Tells a producer its blob was read: puts `value` into its ack word (fire and forget). */
  ack(peer: PeerRef, ackAddr: number, value: number): void {
    if (this.closed) return;
    const i = this.nextSource;
    this.nextSource = (i + 1) % SOURCE_WORDS;
    this.sourceWords[i] = value;
    this.send({ type: "ack", id: this.nextId++, peer, ackAddr, localOffset: ACK_WORDS * 4 + i * 4 });
  }

  /** Drops the cached connection to a producer (after a failure). */
  forgetPeer(peerId: string): void {
    if (!this.closed) this.send({ type: "forget-peer", peerId });
  }

  /** Stops the thread and unmaps the arena. Every view of `memory` must be dead by now. */
  async shutdown(): Promise<void> {
    if (this.closed) return;
    this.closed = true;
    for (const [, p] of this.pending) {
      p.reject(new TransportError("nixl-ucx: the endpoint closed during a READ", "TRANSPORT_CLOSED"));
      p.settle(true);
    }
    this.pending.clear();
    const closedMsg = new Promise<void>((resolve) => {
      this.port.on("message", (e: ThreadEvent) => e.type === "closed" && resolve());
      this.worker.once("exit", () => resolve());
    });
    this.port.ref();
    this.send({ type: "close" });
    this.flush();
    const t = setTimeout(() => void this.worker.terminate(), 5000);
    await closedMsg;
    clearTimeout(t);
    await this.worker.terminate();
    this.port.close();
    closeFd(this.wakeFd);
  }
}

// ---------------------------------------------------------------------------------------------
// Per-process pool: a closed transport gives its engine back; the next create() with the same
// settings takes it, so arena memory is reused instead of unmapped under live views.

const POOL_KEY = Symbol.for("@airm/kv-nixl-ucx/engine-pool");
type Pool = { idle: UcxEngine[]; all: Set<UcxEngine> };
const pool: Pool = ((globalThis as Record<symbol, unknown>)[POOL_KEY] as Pool | undefined) ?? { idle: [], all: new Set() };
(globalThis as Record<symbol, unknown>)[POOL_KEY] = pool;

function sameConfig(a: EngineConfig, b: EngineConfig): boolean {
  return a.poolBytes === b.poolBytes && a.tls === b.tls && a.errMode === b.errMode && a.spinMs === b.spinMs;
}

/** An idle engine with these settings, or a new one. */
export async function acquireEngine(config: EngineConfig): Promise<UcxEngine> {
  pool.idle = pool.idle.filter((e) => e.alive);
  const i = pool.idle.findIndex((e) => sameConfig(e.config, config));
  if (i >= 0) return pool.idle.splice(i, 1)[0];
  const e = await UcxEngine.start(config);
  pool.all.add(e);
  return e;
}

/** Returns an engine whose transport closed (all its slots and acks already freed). */
export function releaseEngine(engine: UcxEngine): void {
  if (engine.alive && pool.all.has(engine) && !pool.idle.includes(engine)) pool.idle.push(engine);
}

/**
 * Stops every pooled engine's thread and unmaps the arenas. Only for process shutdown or tests:
 * any array a pull returned becomes invalid (reading it would fault).
 */
export async function shutdownEngines(): Promise<void> {
  const all = [...pool.all];
  pool.all.clear();
  pool.idle = [];
  await Promise.all(all.map((e) => e.shutdown()));
}
