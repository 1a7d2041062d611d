// The UCX progress thread: owns one UCX context, worker and registered arena, runs the READs and
// acks the main thread asks for, and keeps calling ucp_worker_progress so peers' emulated gets
// (UCX over TCP) are served even while the main thread computes. It polls only for a short
// window after the last activity, then sleeps on the worker's event fd (plus a wake-up eventfd
// the main thread signals), so an idle endpoint costs no CPU. It also takes the CRC-32 of READs
// that complete inside the call (see READ_PIECE); the main thread does it for the others.
// It knows nothing about keys or descriptors; ucx-engine.ts is its other half.

import koffi from "koffi";
import { crc32 } from "@node-rs/crc32";
import { receiveMessageOnPort, workerData, type MessagePort } from "node:worker_threads";
import {
  UCS_ERR_BUSY,
  UCS_INPROGRESS,
  UCS_OK,
  UCP_ERR_HANDLING_MODE_PEER,
  UcpWorker,
  UcxStatusError,
  drainEventFd,
  schedYield,
  statusText,
  waitReadable,
  ucxVersion,
  pointerAt,
  type RegisteredMemory,
} from "./ucp-binding.ts";
import { contextResources, pickErrMode } from "./ucx-resources.ts";
import type { ThreadCommand, ThreadEvent, ThreadInit, ThreadMessage, PeerRef } from "./ucx-thread-protocol.ts";

interface Peer {
  ep: unknown;
  rkeys: Map<string, unknown>;
  /** A READ from this peer went in flight once: READ whole blobs from it from then on. */
  inFlight: boolean;
}

interface Op {
  id: number;
  /** UCX requests still to finish (a READ may be split in two). */
  requests: number[];
  peerId: string;
  /** Tell the main thread when done (acks are fire-and-forget). */
  report: boolean;
}

/**
 * A READ is issued in pieces of this size while they complete at once (shared memory: the copy
 * happens inside ucp_get_nbx), and each piece's CRC-32 is taken right after its copy, while it
 * is still in this core's cache: +3.6 ms per 64 MiB here, against +5.2 ms for a pass after the copy.
 */
const READ_PIECE = 256 * 1024;

/** One UCX context, worker and arena on this thread, and the READs and acks in flight on them. */
class ProgressThread {
  private readonly port: MessagePort;
  private readonly sleeping: Int32Array;
  /** Events of one loop pass leave in one message ("ready"/"failed"/"closed" at once). */
  private events: ThreadEvent[] = [];
  private readonly peers = new Map<string, Peer>();
  private readonly ops = new Map<number, Op>();
  /** Endpoints UCX reported as failed (from inside progress); dropped right after it returns. */
  private readonly failedEps: unknown[] = [];
  private closing = false;

  private constructor(
    private readonly init: ThreadInit,
    private readonly w: UcpWorker,
    private readonly arena: RegisteredMemory,
    private readonly arenaBytes: Buffer,
    private readonly errMode: number,
    private readonly efd: number,
  ) {
    this.port = init.port;
    this.sleeping = new Int32Array(init.sleeping);
    w.onEndpointError((ep) => this.failedEps.push(ep));
  }

  /** Opens UCX and says "ready" (or "failed", returning null). */
  static open(init: ThreadInit): ProgressThread | null {
    try {
      const w = new UcpWorker({ tls: init.tls, config: init.config, wakeup: true });
      const resources = contextResources(w);
      const errMode = pickErrMode(resources, init.errMode);
      const arena = w.allocate(init.poolBytes);
      const t = new ProgressThread(init, w, arena, Buffer.from(koffi.view(pointerAt(arena.base), arena.length)), errMode, w.eventFd());
      t.send({
        type: "ready",
        version: ucxVersion(),
        address: w.address(),
        rkey: arena.rkey,
        base: arena.base,
        length: arena.length,
        resources,
        errMode: errMode === UCP_ERR_HANDLING_MODE_PEER ? "peer" : "none",
      });
      return t;
    } catch (e) {
      init.port.postMessage({ type: "failed", message: (e as Error).message } satisfies ThreadEvent);
      return null;
    }
  }

  private send(e: ThreadEvent): void {
    if (e.type === "done") this.events.push(e);
    else this.port.postMessage(e);
  }

  private flushEvents(): void {
    if (!this.events.length) return;
    this.port.postMessage(this.events.length === 1 ? this.events[0] : { type: "batch", events: this.events });
    this.events = [];
  }

  private dropFailedPeers(): void {
    while (this.failedEps.length) {
      const ep = this.failedEps.pop();
      for (const [id, p] of this.peers) {
        if (koffi.address(p.ep) === koffi.address(ep)) this.dropPeer(id);
      }
    }
  }

  private peerFor(ref: PeerRef): Peer {
    let p = this.peers.get(ref.id);
    if (!p) {
      p = { ep: this.w.connect(ref.address, this.errMode), rkeys: new Map(), inFlight: false };
      this.peers.set(ref.id, p);
    }
    return p;
  }

  private rkeyFor(p: Peer, packed: Uint8Array): unknown {
    const k = Buffer.from(packed.buffer, packed.byteOffset, packed.byteLength).toString("base64");
    let r = p.rkeys.get(k);
    if (!r) {
      r = this.w.unpackRkey(p.ep, packed);
      p.rkeys.set(k, r);
    }
    return r;
  }

  private dropPeer(peerId: string): void {
    const { w } = this;
    const p = this.peers.get(peerId);
    if (!p) return;
    this.peers.delete(peerId);
    const closeReq = w.closeEndpoint(p.ep);
    // A forced close completes the peer's outstanding requests with an error; wait a bounded time.
    const until = performance.now() + 2000;
    if (closeReq) {
      while (performance.now() < until) {
        w.progress();
        if (w.poll(closeReq) !== UCS_INPROGRESS) break;
      }
    }
    for (const op of this.ops.values()) {
      if (op.peerId !== peerId) continue;
      op.requests = op.requests.filter((r) => w.poll(r) === UCS_INPROGRESS);
      const stuck = op.requests.length > 0; // those stay with UCX: the caller must never reuse the slot
      this.ops.delete(op.id);
      if (op.report) this.send({ type: "done", id: op.id, status: -16, stuck, message: `the READ was cancelled: ${statusText(-16)}` });
    }
    for (const r of p.rkeys.values()) w.destroyRkey(r);
  }

  /** Polls an op's requests; returns the final status once all finished, else UCS_INPROGRESS. */
  private pollOp(op: Op): number {
    const { w } = this;
    let failed = UCS_OK;
    op.requests = op.requests.filter((r) => {
      const s = w.poll(r);
      if (s !== UCS_INPROGRESS && s !== UCS_OK) failed = s;
      return s === UCS_INPROGRESS;
    });
    if (failed !== UCS_OK) {
      op.requests = op.requests.filter((r) => w.poll(r) === UCS_INPROGRESS);
      return op.requests.length ? UCS_INPROGRESS : failed;
    }
    return op.requests.length ? UCS_INPROGRESS : UCS_OK;
  }

  private finish(op: Op, status: number): void {
    this.ops.delete(op.id);
    if (!op.report) return;
    if (status === UCS_OK) this.send({ type: "done", id: op.id, status });
    else {
      this.send({ type: "done", id: op.id, status, message: `the READ from the producer failed: ${statusText(status)}` });
      this.dropPeer(op.peerId);
    }
  }

  private fail(id: number, peerId: string, report: boolean, e: unknown): void {
    const status = e instanceof UcxStatusError ? e.status : -1;
    if (report) this.send({ type: "done", id, status, message: (e as Error).message });
    this.dropPeer(peerId);
  }

  private startRead(c: Extract<ThreadCommand, { type: "get" }>): void {
    const { w, arena } = this;
    try {
      const p = this.peerFor(c.peer);
      const rkey = this.rkeyFor(p, c.peer.rkey);
      let crc = 0;
      let done = 0;
      while (done < c.length) {
        const n = p.inFlight ? c.length : Math.min(READ_PIECE, c.length - done);
        const r = w.get(p.ep, arena.base + c.localOffset + done, n, c.remoteAddr + done, rkey, arena.memh);
        if (r === 0) {
          crc = crc32(this.arenaBytes.subarray(c.localOffset + done, c.localOffset + done + n), crc);
          done += n;
          continue;
        }
        // In flight (e.g. TCP): ask for the rest in one go. The main thread takes the CRC-32 on
        // completion, overlapping this thread's progress of the next READs.
        p.inFlight = true;
        const requests = [r];
        const rest = c.length - done - n;
        if (rest > 0) {
          const r2 = w.get(p.ep, arena.base + c.localOffset + done + n, rest, c.remoteAddr + done + n, rkey, arena.memh);
          if (r2 !== 0) requests.push(r2);
        }
        this.ops.set(c.id, { id: c.id, requests, peerId: c.peer.id, report: true });
        return;
      }
      this.send({ type: "done", id: c.id, status: UCS_OK, crc: crc >>> 0 });
    } catch (e) {
      this.fail(c.id, c.peer.id, true, e);
    }
  }

  private startAck(c: Extract<ThreadCommand, { type: "ack" }>): void {
    const { w, arena } = this;
    try {
      const p = this.peerFor(c.peer);
      const r = w.put(p.ep, arena.base + c.localOffset, 4, c.ackAddr, this.rkeyFor(p, c.peer.rkey), arena.memh);
      if (r !== 0) this.ops.set(c.id, { id: c.id, requests: [r], peerId: c.peer.id, report: false });
    } catch (e) {
      this.fail(c.id, c.peer.id, false, e);
    }
  }

  private handle(c: ThreadCommand): void {
    switch (c.type) {
      case "get":
        this.startRead(c);
        break;
      case "ack":
        this.startAck(c);
        break;
      case "abort": {
        const op = this.ops.get(c.id);
        if (op) this.dropPeer(op.peerId);
        break;
      }
      case "forget-peer":
        this.dropPeer(c.peerId);
        break;
      case "close":
        this.closing = true;
        break;
    }
  }

  /** One pass: commands, progress, completions. True when anything happened. */
  private pass(): boolean {
    let busy = false;
    for (let m = receiveMessageOnPort(this.port); m; m = receiveMessageOnPort(this.port)) {
      for (const c of m.message as ThreadMessage) this.handle(c);
      busy = true;
    }
    if (this.closing) return busy;
    if (this.w.progress() > 0) busy = true;
    if (this.failedEps.length) this.dropFailedPeers();
    for (const op of this.ops.values()) {
      const s = this.pollOp(op);
      if (s !== UCS_INPROGRESS) {
        this.finish(op, s);
        busy = true;
      }
    }
    this.flushEvents();
    return busy;
  }

  /**
   * Sleeps until UCX or the main thread has something. With READs in flight it wakes at least
   * every millisecond in case a transport signals no event for their progress. The sleep is
   * announced first, then messages are looked for once more: a command posted before the flag
   * was set is seen here, one posted after it comes with an eventfd write. Returns true when a
   * command was found instead of sleeping.
   */
  private sleepUntilWork(): boolean {
    Atomics.store(this.sleeping, 0, 1);
    const raced = receiveMessageOnPort(this.port);
    if (raced) {
      Atomics.store(this.sleeping, 0, 0);
      for (const c of raced.message as ThreadMessage) this.handle(c);
      return true;
    }
    if (this.w.arm() === UCS_ERR_BUSY) {
      Atomics.store(this.sleeping, 0, 0);
      return false;
    }
    waitReadable([this.efd, this.init.wakeFd], this.ops.size > 0 ? 1 : 1000);
    Atomics.store(this.sleeping, 0, 0);
    drainEventFd(this.init.wakeFd);
    return false;
  }

  /** Runs until "close": polls while busy and for spinMs after, then sleeps on the event fds. */
  run(): void {
    let lastBusy = performance.now();
    while (!this.closing) {
      const busy = this.pass();
      if (this.closing) break;
      const now = performance.now();
      if (busy) {
        lastBusy = now;
        continue;
      }
      if (now - lastBusy < this.init.spinMs) {
        schedYield();
        continue;
      }
      if (this.sleepUntilWork()) lastBusy = performance.now();
    }
    this.flushEvents();
    for (const id of [...this.peers.keys()]) this.dropPeer(id);
    this.w.unmap(this.arena);
    this.w.destroy();
    this.send({ type: "closed" });
  }
}

ProgressThread.open((workerData as { init: ThreadInit }).init)?.run();
