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

function runThread(init: ThreadInit): void {
  const port: MessagePort = init.port;
  const sleeping = new Int32Array(init.sleeping);
  // Events of one loop pass leave in one message ("ready"/"failed"/"closed" at once).
  let events: ThreadEvent[] = [];
  const send = (e: ThreadEvent) => {
    if (e.type === "done") events.push(e);
    else port.postMessage(e);
  };
  const flushEvents = () => {
    if (!events.length) return;
    port.postMessage(events.length === 1 ? events[0] : { type: "batch", events });
    events = [];
  };
  let w: UcpWorker;
  let arena: RegisteredMemory;
  let errMode: number;
  let efd: number;
  let resources: string[];
  try {
    w = new UcpWorker({ tls: init.tls, config: init.config, wakeup: true });
    resources = contextResources(w);
    errMode = pickErrMode(resources, init.errMode);
    arena = w.allocate(init.poolBytes);
    efd = w.eventFd();
    send({
      type: "ready",
      version: ucxVersion(),
      address: w.address(),
      rkey: arena.rkey,
      base: arena.base,
      length: arena.length,
      resources,
      errMode: errMode === UCP_ERR_HANDLING_MODE_PEER ? "peer" : "none",
    });
  } catch (e) {
    send({ type: "failed", message: (e as Error).message });
    return;
  }

  const arenaBytes = Buffer.from(koffi.view(pointerAt(arena.base), arena.length));
  const peers = new Map<string, Peer>();
  const ops = new Map<number, Op>();
  let closing = false;
  // Endpoints UCX reported as failed (from inside progress); dropped right after it returns.
  const failedEps: unknown[] = [];
  w.onEndpointError((ep) => failedEps.push(ep));
  const dropFailedPeers = () => {
    while (failedEps.length) {
      const ep = failedEps.pop();
      for (const [id, p] of peers) {
        if (koffi.address(p.ep) === koffi.address(ep)) dropPeer(id);
      }
    }
  };

  const peerFor = (ref: PeerRef): Peer => {
    let p = peers.get(ref.id);
    if (!p) {
      p = { ep: w.connect(ref.address, errMode), rkeys: new Map(), inFlight: false };
      peers.set(ref.id, p);
    }
    return p;
  };
  const rkeyFor = (p: Peer, packed: Uint8Array): unknown => {
    const k = Buffer.from(packed.buffer, packed.byteOffset, packed.byteLength).toString("base64");
    let r = p.rkeys.get(k);
    if (!r) {
      r = w.unpackRkey(p.ep, packed);
      p.rkeys.set(k, r);
    }
    return r;
  };
  const dropPeer = (peerId: string) => {
    const p = peers.get(peerId);
    if (!p) return;
    peers.delete(peerId);
    const closeReq = w.closeEndpoint(p.ep);
    // A forced close completes the peer's outstanding requests with an error; wait a bounded time.
    const until = performance.now() + 2000;
    if (closeReq) {
      while (performance.now() < until) {
        w.progress();
        if (w.poll(closeReq) !== UCS_INPROGRESS) break;
      }
    }
    for (const op of ops.values()) {
      if (op.peerId !== peerId) continue;
      op.requests = op.requests.filter((r) => w.poll(r) === UCS_INPROGRESS);
      const stuck = op.requests.length > 0; // those stay with UCX: the caller must never reuse the slot
      ops.delete(op.id);
      if (op.report) send({ type: "done", id: op.id, status: -16, stuck, message: `the READ was cancelled: ${statusText(-16)}` });
    }
    for (const r of p.rkeys.values()) w.destroyRkey(r);
  };
  /** Polls an op's requests; returns the final status once all finished, else UCS_INPROGRESS. */
  const pollOp = (op: Op): number => {
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
  };
  const finish = (op: Op, status: number) => {
    ops.delete(op.id);
    if (!op.report) return;
    if (status === UCS_OK) send({ type: "done", id: op.id, status });
    else {
      send({ type: "done", id: op.id, status, message: `the READ from the producer failed: ${statusText(status)}` });
      dropPeer(op.peerId);
    }
  };
  const fail = (id: number, peerId: string, report: boolean, e: unknown) => {
    const status = e instanceof UcxStatusError ? e.status : -1;
    if (report) send({ type: "done", id, status, message: (e as Error).message });
    dropPeer(peerId);
  };
  const startRead = (c: Extract<ThreadCommand, { type: "get" }>) => {
    try {
      const p = peerFor(c.peer);
      const rkey = rkeyFor(p, c.peer.rkey);
      let crc = 0;
      let done = 0;
      while (done < c.length) {
        const n = p.inFlight ? c.length : Math.min(READ_PIECE, c.length - done);
        const r = w.get(p.ep, arena.base + c.localOffset + done, n, c.remoteAddr + done, rkey, arena.memh);
        if (r === 0) {
          crc = crc32(arenaBytes.subarray(c.localOffset + done, c.localOffset + done + n), crc);
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
        ops.set(c.id, { id: c.id, requests, peerId: c.peer.id, report: true });
        return;
      }
      send({ type: "done", id: c.id, status: UCS_OK, crc: crc >>> 0 });
    } catch (e) {
      fail(c.id, c.peer.id, true, e);
    }
  };
  const startAck = (c: Extract<ThreadCommand, { type: "ack" }>) => {
    try {
      const p = peerFor(c.peer);
      const r = w.put(p.ep, arena.base + c.localOffset, 4, c.ackAddr, rkeyFor(p, c.peer.rkey), arena.memh);
      if (r !== 0) ops.set(c.id, { id: c.id, requests: [r], peerId: c.peer.id, report: false });
    } catch (e) {
      fail(c.id, c.peer.id, false, e);
    }
  };
  const handle = (c: ThreadCommand) => {
    switch (c.type) {
      case "get":
        startRead(c);
        break;
      case "ack":
        startAck(c);
        break;
      case "abort": {
        const op = ops.get(c.id);
        if (op) dropPeer(op.peerId);
        break;
      }
      case "forget-peer":
        dropPeer(c.peerId);
        break;
      case "close":
        closing = true;
        break;
    }
  };

  let lastBusy = performance.now();
  const spinMs = init.spinMs;
  while (!closing) {
    let busy = false;
    for (let m = receiveMessageOnPort(port); m; m = receiveMessageOnPort(port)) {
      for (const c of m.message as ThreadMessage) handle(c);
      busy = true;
    }
    if (closing) break;
    if (w.progress() > 0) busy = true;
    if (failedEps.length) dropFailedPeers();
    for (const op of ops.values()) {
      const s = pollOp(op);
      if (s !== UCS_INPROGRESS) {
        finish(op, s);
        busy = true;
      }
    }
    flushEvents();
    const now = performance.now();
    if (busy) {
      lastBusy = now;
      continue;
    }
    if (now - lastBusy < spinMs) {
      schedYield();
      continue;
    }
    // Quiet for spinMs: sleep until UCX or the main thread has something. With READs in flight,
    // wake at least every millisecond in case a transport signals no event for their progress.
    // Announce the sleep first, then look for messages once more: a command posted before the
    // flag was set is seen here, one posted after it comes with an eventfd write.
    Atomics.store(sleeping, 0, 1);
    const raced = receiveMessageOnPort(port);
    if (raced) {
      Atomics.store(sleeping, 0, 0);
      for (const c of raced.message as ThreadMessage) handle(c);
      lastBusy = performance.now();
      continue;
    }
    if (w.arm() === UCS_ERR_BUSY) {
      Atomics.store(sleeping, 0, 0);
      continue;
    }
    waitReadable([efd, init.wakeFd], ops.size > 0 ? 1 : 1000);
    Atomics.store(sleeping, 0, 0);
    drainEventFd(init.wakeFd);
  }
  flushEvents();

  for (const id of [...peers.keys()]) dropPeer(id);
  w.unmap(arena);
  w.destroy();
  send({ type: "closed" });
}

runThread((workerData as { init: ThreadInit }).init);
