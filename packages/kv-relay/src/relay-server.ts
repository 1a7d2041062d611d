// airm-kv-relay: keeps KV blobs in a byte-capped pool of pre-touched buffers and hands them to
// pullers over the frame protocol of frame.ts. Knows sockets, the store, waiting pulls, TTLs and
// CRC checks; the client side (pooling, retries, CRC on receive) lives in relay-client.ts. With
// TLS material it serves mutual TLS only: a caller without a certificate of the deployment's CA
// is refused at the handshake, before any frame.

import { createHash } from "node:crypto";
import net from "node:net";
import tls from "node:tls";
import { crc32 } from "@node-rs/crc32";
import { isAirmError, refusalReason, requestIdOf, sameSecret, serveReloads, serverTlsOptions, validateKey, validateRequestId, type TlsMaterial } from "@airm/rm-core";
import { pino, type Logger } from "pino";
import { BlobPool, type PoolSlot } from "./blob-pool.ts";
import {
  FLAG_CRC,
  HEADER_BYTES,
  MAX_FRAME_KEY_BYTES,
  MAX_HELLO_BYTES,
  Op,
  RESPONSE_BIT,
  Status,
  checkRequestHeader,
  decodeHeader,
  encodeHead,
  type FrameHeader,
  type StatusCode,
} from "./frame.ts";
import { RelayMetrics, type RelayStats, startMetricsServer, type MetricsServer } from "./relay-metrics.ts";
import { feed, stagedOnRead } from "./staged-read.ts";
import { formatHostPort } from "./address.ts";
import { RELAY_CONFIG } from "./relay-config.ts";

export interface RelayOptions {
  /** Address to listen on (default 127.0.0.1). */
  host?: string;
  /** TCP port (default 7400; 0 picks a free one). */
  port?: number;
  /** Byte cap on blob memory (default 1024 MiB; the CLI reads AIRM_KV_TCP_MAX_MB). */
  maxBytes?: number;
  /** Lifetime of an unreleased blob in ms (default 300 s; the CLI reads AIRM_KV_TCP_TTL_S). */
  ttlMs?: number;
  /** Port of the /metrics and /health HTTP server (0 picks one; unset: none). */
  metricsPort?: number;
  /** Check the pusher's CRC-32 on push (default true). */
  crc?: boolean;
  /** Log size and SHA-256 of every blob stored (default false). */
  log?: boolean;
  /** Reuse pre-touched blob buffers (default true; measurements only). */
  reusePool?: boolean;
  /** Read payloads straight into their blob buffer (default true; measurements only). */
  directReads?: boolean;
  /**
   * The deployment's internal token (the CLI reads AIRM_INTERNAL_TOKEN). When set, every
   * connection must open with a HELLO carrying it; anything else is answered UNAUTHORIZED and
   * the connection is closed. Unset: any caller is served (a HELLO is answered OK and ignored).
   */
  token?: string;
  /**
   * The deployment's TLS material (the CLI reads AIRM_TLS_DIR): serve mutual TLS, refusing at the
   * handshake a caller whose certificate ca.crt did not issue (or none). Unset: plain TCP.
   */
  tls?: TlsMaterial;
}

export interface RelayServer {
  host: string;
  port: number;
  /** "host:port" for AIRM_KV_TCP_ADDR. */
  address: string;
  metricsPort?: number;
  close(): Promise<void>;
}

interface StoredBlob {
  key: string;
  requestId: string;
  slot: PoolSlot;
  size: number;
  crc: number | undefined;
  pushedAt: number;
  read: boolean;
  /** 1 for the store plus 1 per send in progress; the slot is freed at 0. */
  refs: number;
}

interface PullWaiter {
  key: string;
  conn: RelayConnection;
  tag: number;
  timer: NodeJS.Timeout;
}

interface SpaceWaiter {
  conn: RelayConnection;
  tag: number;
  bytes: number;
  timer: NodeJS.Timeout;
}

enum ReadState {
  Header,
  Key,
  Small,
  Payload,
  Discard,
}

/** The longest a pull or space wait may park in the relay (ms); a longer request is clamped. */
const MAX_WAIT_MS = 3_600_000;
/** Released request ids remembered (for the TTL) to drop late pushes: ~100 bytes each. */
const MAX_RELEASED = 100_000;
/** How long a refused connection may linger (its answer going out, its peer closing) before it is cut. */
const REFUSED_LINGER_MS = 2_000;

/**
 * One client connection: a request-frame parser that says where its next bytes go (the rest of
 * the header, key or payload slot); staged-read.ts reads payloads straight into their slot.
 */
class RelayConnection {
  readonly pullWaits = new Set<PullWaiter>();
  readonly spaceWaits = new Set<SpaceWaiter>();
  closed = false;
  /** Whether this connection presented the relay's token (always, for a relay without one). */
  private authenticated: boolean;
  private state = ReadState.Header;
  private readonly hdr = Buffer.alloc(HEADER_BYTES);
  private hdrFill = 0;
  private h!: FrameHeader;
  private readonly keyBuf = Buffer.alloc(MAX_FRAME_KEY_BYTES);
  private keyFill = 0;
  private key = "";
  /** Short fixed payloads: WAIT_SPACE's 8 bytes, HELLO's token. */
  private readonly small = Buffer.alloc(MAX_HELLO_BYTES);
  private smallFill = 0;
  private slot: PoolSlot | undefined;
  private payFill = 0;
  private crcState = 0;
  private discardLeft = 0;
  private lingerTimer: NodeJS.Timeout | undefined;

  socket!: net.Socket;

  constructor(
    readonly relay: Relay,
    readonly remote: string,
  ) {
    this.authenticated = relay.token === undefined;
  }

  /** True while a frame is partly read (for the truncated-frame check at EOF). */
  get midFrame(): boolean {
    return this.state !== ReadState.Header || this.hdrFill > 0;
  }

  /** Where the next socket read lands: the exact rest of the header, key or payload (never empty). */
  nextBuffer(): Buffer {
    switch (this.state) {
      case ReadState.Header:
        return this.hdr.subarray(this.hdrFill);
      case ReadState.Key:
        return this.keyBuf.subarray(this.keyFill, this.h.keyLength);
      case ReadState.Small:
        return this.small.subarray(this.smallFill, this.h.payloadLength);
      case ReadState.Payload:
        return this.slot!.buf.subarray(this.payFill, this.h.payloadLength);
      case ReadState.Discard:
        return this.relay.discardScratch.subarray(0, Math.min(this.relay.discardScratch.length, this.discardLeft));
    }
  }

  /** `n` bytes were read into the buffer nextBuffer() returned. */
  onRead(n: number): void {
    this.relay.bytesIn += n;
    switch (this.state) {
      case ReadState.Header:
        this.hdrFill += n;
        if (this.hdrFill === HEADER_BYTES) this.onHeader();
        return;
      case ReadState.Key:
        this.keyFill += n;
        if (this.keyFill === this.h.keyLength) this.onKey();
        return;
      case ReadState.Small:
        this.smallFill += n;
        if (this.smallFill === this.h.payloadLength) this.onSmallBody();
        return;
      case ReadState.Payload:
        if (this.relay.crcEnabled && this.h.flags & FLAG_CRC) {
          this.crcState = crc32(this.slot!.buf.subarray(this.payFill, this.payFill + n), this.crcState);
        }
        this.payFill += n;
        if (this.payFill === this.h.payloadLength) this.onPushComplete();
        return;
      case ReadState.Discard:
        this.discardLeft -= n;
        if (this.discardLeft === 0) this.state = ReadState.Header;
        return;
    }
  }

  /** The fallback path (no direct reads): copies each chunk once into where nextBuffer() points. */
  onData(chunk: Buffer): void {
    feed(this, chunk, 0, chunk.length);
  }

  private onHeader(): void {
    this.hdrFill = 0;
    const h = decodeHeader(this.hdr);
    const bad = checkRequestHeader(h);
    if (bad) {
      this.reject(bad.reason, bad.detail);
      return;
    }
    if (!this.authenticated && h.op !== Op.HELLO) {
      // Refused on its header: the key and payload are never read (nor room made for them).
      this.refuse(h.op, h.tag, "unauthenticated", `op ${h.op} before HELLO; this relay requires AIRM_INTERNAL_TOKEN`);
      return;
    }
    this.h = h;
    this.keyFill = 0;
    if (h.keyLength > 0) this.state = ReadState.Key;
    else this.onKey();
  }

  private onKey(): void {
    const h = this.h;
    this.key = this.keyBuf.toString("latin1", 0, h.keyLength);
    this.state = ReadState.Header;
    switch (h.op) {
      case Op.PUSH:
        this.beginPush();
        return;
      case Op.PULL:
        this.relay.handlePull(this, h.tag, this.key, h.arg);
        return;
      case Op.RELEASE:
        this.relay.handleRelease(this, h.tag, this.key);
        return;
      case Op.WAIT_SPACE:
        this.smallFill = 0;
        this.state = ReadState.Small;
        return;
      case Op.HELLO:
        this.smallFill = 0;
        if (h.payloadLength > 0) this.state = ReadState.Small;
        else this.onHello();
        return;
    }
  }

  private onSmallBody(): void {
    this.state = ReadState.Header;
    if (this.h.op === Op.HELLO) {
      this.onHello();
      return;
    }
    const bytes = this.small.readUInt32LE(0) + this.small.readUInt32LE(4) * 0x1_0000_0000;
    this.relay.handleWaitSpace(this, this.h.tag, bytes, this.h.arg);
  }

  /** A HELLO: OK when its token is the relay's (or the relay has none), else a refusal. */
  private onHello(): void {
    const { tag, payloadLength } = this.h;
    const token = this.relay.token;
    const got = this.small.toString("utf8", 0, payloadLength);
    this.small.fill(0, 0, payloadLength); // no copy of a token left behind
    if (token !== undefined && !sameSecret(token, got)) {
      this.refuse(Op.HELLO, tag, "bad_token", payloadLength ? "HELLO with a token that is not this relay's" : "HELLO without a token; this relay requires AIRM_INTERNAL_TOKEN");
      return;
    }
    this.authenticated = true;
    this.reply(Op.HELLO, tag, Status.OK);
  }

  /**
   * Refuses a caller without the relay's token: answers the frame UNAUTHORIZED, counts and logs
   * it, stops parsing (whatever follows, a payload included, is dropped as it arrives, never
   * buffered) and closes the connection once the answer is out.
   */
  private refuse(op: number, tag: number, reason: "unauthenticated" | "bad_token", detail: string): void {
    this.reply(op, tag, Status.UNAUTHORIZED, `relay ${this.relay.address}: AIRM_INTERNAL_TOKEN is missing or differs from the relay's`);
    this.relay.onRejected(this, reason, detail);
    this.closed = true;
    this.state = ReadState.Header;
    this.socket.end();
    this.lingerTimer = setTimeout(() => this.socket.destroy(), REFUSED_LINGER_MS);
    this.lingerTimer.unref();
  }

  private beginPush(): void {
    const { tag, payloadLength } = this.h;
    const refuse = (status: StatusCode, message: string) => {
      this.reply(Op.PUSH, tag, status, message);
      this.discard(payloadLength);
    };
    try {
      validateKey(this.key);
    } catch (e) {
      refuse(Status.INVALID_KEY, (e as Error).message);
      return;
    }
    const relay = this.relay;
    if (payloadLength > relay.pool.maxBytes) {
      refuse(
        Status.TOO_LARGE,
        `blob ${this.key} is ${payloadLength} bytes, more than the relay's whole cap of ${relay.pool.maxBytes} bytes; raise AIRM_KV_TCP_MAX_MB on the relay`,
      );
      return;
    }
    const slot = relay.pool.tryReserve(payloadLength);
    if (!slot) {
      refuse(Status.NO_SPACE, relay.fullMessage(payloadLength));
      return;
    }
    this.slot = slot;
    this.payFill = 0;
    this.crcState = 0;
    if (payloadLength === 0) this.onPushComplete();
    else this.state = ReadState.Payload;
  }

  private onPushComplete(): void {
    this.state = ReadState.Header;
    const slot = this.slot!;
    this.slot = undefined;
    const h = this.h;
    const hasCrc = (h.flags & FLAG_CRC) !== 0;
    if (hasCrc && this.relay.crcEnabled && this.crcState >>> 0 !== h.crc >>> 0) {
      this.relay.releaseSlot(slot);
      this.relay.onCrcFailure(this, this.key, h.crc, this.crcState);
      this.reply(
        Op.PUSH,
        h.tag,
        Status.CRC_MISMATCH,
        `blob ${this.key} arrived at the relay with CRC-32 0x${(this.crcState >>> 0).toString(16)}, the pusher sent 0x${(h.crc >>> 0).toString(16)}: ` +
          `the bytes were damaged on the way; push it again and check the link`,
      );
      return;
    }
    if (this.relay.wasReleased(this.key)) {
      // Its request was released while the bytes were on their way (a consumer gave up, a link
      // cut stalled the push): storing them would hold them until the TTL. Nobody will pull them,
      // so the pusher is answered as usual (its request's fate is told by whoever released it).
      this.relay.releaseSlot(slot);
      this.relay.onLatePush(this.key, h.payloadLength);
      this.reply(Op.PUSH, h.tag, Status.OK, "", this.relay.expired);
      return;
    }
    this.relay.store(this.key, slot, h.payloadLength, hasCrc ? h.crc >>> 0 : undefined);
    this.reply(Op.PUSH, h.tag, Status.OK, "", this.relay.expired);
  }

  private discard(bytes: number): void {
    if (bytes > 0) {
      this.discardLeft = bytes;
      this.state = ReadState.Discard;
    }
  }

  /** A status-only response (an error carries its message as the payload). */
  reply(op: number, tag: number, status: StatusCode, message = "", arg = 0): void {
    if (this.closed) return;
    const msg = message ? Buffer.from(message, "utf8") : undefined;
    const head = encodeHead({ op: op | RESPONSE_BIT, flags: 0, status, tag, payloadLength: msg?.length ?? 0, crc: 0, arg });
    this.socket.write(head);
    if (msg) this.socket.write(msg);
  }

  /** Sends a stored blob: header and payload corked into one writev, the payload straight from its slot. */
  sendBlob(tag: number, blob: StoredBlob): void {
    if (this.closed) return;
    blob.refs++;
    blob.read = true;
    const head = encodeHead({
      op: Op.PULL | RESPONSE_BIT,
      flags: blob.crc === undefined ? 0 : FLAG_CRC,
      status: Status.OK,
      tag,
      payloadLength: blob.size,
      crc: blob.crc ?? 0,
      arg: 0,
    });
    const s = this.socket;
    s.cork();
    s.write(head);
    s.write(blob.slot.buf.subarray(0, blob.size), () => this.relay.unrefBlob(blob));
    s.uncork();
    this.relay.bytesOut += blob.size;
  }

  /** Closes this connection because of a malformed frame; everyone else keeps being served. */
  reject(reason: string, detail: string): void {
    this.relay.onRejected(this, reason, detail);
    this.closed = true;
    this.socket.destroy();
  }

  /** Called once the socket is gone: frees a half-received push and forgets waits. */
  cleanup(): void {
    this.closed = true;
    if (this.lingerTimer) clearTimeout(this.lingerTimer);
    if (this.slot) {
      this.relay.releaseSlot(this.slot);
      this.slot = undefined;
    }
    for (const w of this.pullWaits) {
      clearTimeout(w.timer);
      this.relay.forgetPullWaiter(w);
    }
    this.pullWaits.clear();
    for (const w of this.spaceWaits) {
      clearTimeout(w.timer);
      this.relay.spaceWaiters.delete(w);
    }
    this.spaceWaits.clear();
  }
}

/** The relay: a TCP server, the blob store and its counters. Start one with startRelay(). */
export class Relay implements RelayServer {
  host = "";
  port = 0;
  address = "";
  metricsPort?: number;
  readonly pool: BlobPool;
  readonly crcEnabled: boolean;
  readonly logBlobs: boolean;
  readonly ttlMs: number;
  readonly log: Logger;
  readonly metrics: RelayMetrics;
  readonly spaceWaiters = new Set<SpaceWaiter>();
  readonly discardScratch = Buffer.allocUnsafe(64 * 1024);
  /** The token every connection must present in its HELLO (unset: none asked). */
  readonly token: string | undefined;
  /** The TLS material it serves mutual TLS with (unset: plain TCP). */
  readonly tls: TlsMaterial | undefined;
  bytesOut = 0;
  bytesIn = 0;
  expired = 0;
  crcFailures = 0;
  framesRejected = 0;
  private readonly blobs = new Map<string, StoredBlob>();
  private readonly byRequest = new Map<string, Set<string>>();
  /**
   * Requests released in the last TTL (request id -> when), oldest first, at most
   * MAX_RELEASED: a push of theirs that completes later is dropped, not held until the TTL.
   */
  private readonly released = new Map<string, number>();
  latePushes = 0;
  private readonly pullWaiters = new Map<string, Set<PullWaiter>>();
  private readonly conns = new Set<RelayConnection>();
  private bytesHeld = 0;
  private readonly server: net.Server;
  private sweeper: NodeJS.Timeout | undefined;
  private metricsServer: MetricsServer | undefined;
  private closing: Promise<void> | undefined;

  private readonly directReads: boolean;

  constructor(opts: {
    maxBytes: number;
    ttlMs: number;
    crc: boolean;
    log: boolean;
    reusePool?: boolean;
    directReads?: boolean;
    logger?: Logger;
    token?: string;
    tls?: TlsMaterial;
  }) {
    this.token = opts.token || undefined;
    this.tls = opts.tls;
    this.pool = new BlobPool(opts.maxBytes, opts.reusePool ?? true);
    this.crcEnabled = opts.crc;
    this.logBlobs = opts.log;
    this.ttlMs = opts.ttlMs;
    this.log = opts.logger ?? pino({ name: "airm-kv-relay", base: undefined }, pino.destination(2));
    this.metrics = new RelayMetrics(this);
    this.directReads = opts.directReads ?? true;
    this.server = this.tls ? this.tlsServer(this.tls) : net.createServer({ noDelay: true, pauseOnConnect: true }, (socket) => this.accept(socket));
  }

  /**
   * A server of mutual TLS: connections are taken once their handshake verified the caller's
   * certificate; refused handshakes are logged (at warn when a certificate was refused, at debug
   * when the caller just went away, e.g. a port probe) and counted as rejected frames. Reloaded
   * files (AIRM_TLS_RELOAD_S) serve the handshakes after.
   */
  private tlsServer(material: TlsMaterial): net.Server {
    const server = tls.createServer({ ...serverTlsOptions(material), noDelay: true }, (socket) => this.accept(socket));
    const stop = serveReloads(server, material, () => this.log.info({ dir: material.dir, generation: material.generation }, "TLS certificates reloaded"));
    server.once("close", stop);
    server.on("tlsClientError", (err: Error, socket: tls.TLSSocket) => {
      const remote = `${socket.remoteAddress}:${socket.remotePort}`;
      const reason = refusalReason(err, socket);
      if (!reason) return this.log.debug({ remote, err: err.message }, "TLS handshake aborted");
      this.framesRejected++;
      this.metrics.framesRejected.inc({ reason: "tls_handshake" });
      this.log.warn({ remote, reason }, `TLS handshake from ${remote} refused: ${reason}`);
    });
    return server;
  }

  /** Listens and starts the TTL sweep (and the metrics server when a port is given). */
  async listen(host: string, port: number, metricsPort?: number): Promise<void> {
    await new Promise<void>((resolve, reject) => {
      const onError = (e: Error) => reject(e);
      this.server.once("error", onError);
      this.server.listen(port, host, () => {
        this.server.off("error", onError);
        resolve();
      });
    });
    this.server.on("error", (e) => this.log.error({ err: e }, "relay server error"));
    const a = this.server.address() as net.AddressInfo;
    this.host = host;
    this.port = a.port;
    this.address = formatHostPort(host, a.port);
    const every = Math.max(50, Math.min(1000, Math.floor(this.ttlMs / 4)));
    this.sweeper = setInterval(() => this.sweep(), every);
    this.sweeper.unref();
    if (metricsPort !== undefined) {
      try {
        this.metricsServer = await startMetricsServer(this, host, metricsPort);
      } catch (e) {
        await this.close();
        throw e;
      }
      this.metricsPort = this.metricsServer.port;
    }
  }

  stats(): RelayStats {
    return {
      blobs: this.blobs.size,
      bytesHeld: this.bytesHeld,
      poolHeldBytes: this.pool.heldBytes,
      poolIdleBytes: this.pool.idleBytes,
      maxBytes: this.pool.maxBytes,
      expired: this.expired,
      crcFailures: this.crcFailures,
      connections: this.conns.size,
      framesRejected: this.framesRejected,
      slotsReused: this.pool.reused,
      slotsAllocated: this.pool.allocated,
    };
  }

  /** The Prometheus exposition text (what GET /metrics serves). */
  metricsText(): Promise<string> {
    return this.metrics.registry.metrics();
  }

  /**
   * Takes an accepted connection. Where Node exposes the accepted handle, the socket is re-wrapped
   * with `onread` so the kernel copies payload bytes straight into their pool slot; otherwise (and
   * over TLS, whose handle decrypts in place of the kernel's copy) each 'data' chunk is copied
   * once into place.
   */
  private accept(accepted: net.Socket): void {
    const conn = new RelayConnection(this, `${accepted.remoteAddress}:${accepted.remotePort}`);
    const handle = this.tls ? undefined : (accepted as unknown as { _handle?: unknown })._handle;
    let socket: net.Socket;
    if (this.directReads && handle) {
      (accepted as unknown as { _handle: unknown })._handle = null;
      accepted.destroy(); // only the wrapper: the handle now belongs to the socket below
      const reader = stagedOnRead(conn);
      // The accepted socket's libuv handle (typed as net's BoundSocket since @types/node 24).
      socket = new net.Socket({
        handle: handle as net.SocketConstructorOpts["handle"],
        readable: true,
        writable: true,
        onread: {
          buffer: reader.buffer,
          callback: (n: number) => {
            // Answers to a burst of small requests (descriptor pulls) leave in one writev.
            socket.cork();
            try {
              reader.callback(n);
            } finally {
              socket.uncork();
            }
            return true;
          },
        },
      } as net.SocketConstructorOpts);
    } else {
      socket = accepted;
      socket.on("data", (chunk: Buffer) => conn.onData(chunk));
      socket.resume();
    }
    conn.socket = socket;
    socket.setNoDelay(true);
    this.conns.add(conn);
    socket.on("end", () => {
      if (conn.midFrame && !conn.closed) conn.reject("truncated", "truncated frame: the connection ended in the middle of a frame");
    });
    socket.on("error", (e) => this.log.debug({ remote: conn.remote, err: e.message }, "connection error"));
    socket.on("close", () => {
      conn.cleanup();
      this.conns.delete(conn);
    });
  }

  fullMessage(bytes: number): string {
    return (
      `relay ${this.address} is full: ${this.pool.heldBytes} of ${this.pool.maxBytes} bytes held, a blob of ${bytes} bytes does not fit; ` +
      `release finished requests, lower the requests in flight, or raise AIRM_KV_TCP_MAX_MB on the relay`
    );
  }

  /** Counts and logs (once, at warn) a connection closed for a malformed frame or a refused caller. Never logs a token. */
  onRejected(conn: RelayConnection, reason: string, detail: string): void {
    this.framesRejected++;
    this.metrics.framesRejected.inc({ reason });
    this.log.warn({ remote: conn.remote, reason }, `closing connection from ${conn.remote}: ${detail}`);
  }

  onCrcFailure(conn: RelayConnection, key: string, sent: number, got: number): void {
    this.crcFailures++;
    this.log.warn({ remote: conn.remote, key, sent: sent >>> 0, got: got >>> 0 }, `CRC-32 mismatch on push of ${key}`);
  }

  store(key: string, slot: PoolSlot, size: number, crc: number | undefined): void {
    const old = this.blobs.get(key);
    if (old) this.drop(old);
    const requestId = requestIdOf(key);
    const blob: StoredBlob = { key, requestId, slot, size, crc, pushedAt: Date.now(), read: false, refs: 1 };
    this.blobs.set(key, blob);
    let keys = this.byRequest.get(requestId);
    if (!keys) this.byRequest.set(requestId, (keys = new Set()));
    keys.add(key);
    this.bytesHeld += size;
    if (this.logBlobs) {
      const sha256 = createHash("sha256").update(slot.buf.subarray(0, size)).digest("hex");
      this.log.info({ key, bytes: size, sha256 }, "blob stored");
    }
    const waiters = this.pullWaiters.get(key);
    if (waiters) {
      this.pullWaiters.delete(key);
      for (const w of waiters) {
        clearTimeout(w.timer);
        w.conn.pullWaits.delete(w);
        w.conn.sendBlob(w.tag, blob);
      }
    }
  }

  /** Removes a blob from the store; its slot returns to the pool once no send still reads it. */
  private drop(blob: StoredBlob): void {
    this.blobs.delete(blob.key);
    const keys = this.byRequest.get(blob.requestId);
    if (keys) {
      keys.delete(blob.key);
      if (!keys.size) this.byRequest.delete(blob.requestId);
    }
    this.bytesHeld -= blob.size;
    this.unrefBlob(blob);
  }

  unrefBlob(blob: StoredBlob): void {
    if (--blob.refs === 0) this.releaseSlot(blob.slot);
  }

  releaseSlot(slot: PoolSlot): void {
    this.pool.free(slot);
    if (this.spaceWaiters.size) this.wakeSpaceWaiters();
  }

  private wakeSpaceWaiters(): void {
    for (const w of this.spaceWaiters) {
      if (!this.pool.fits(w.bytes)) continue;
      clearTimeout(w.timer);
      this.spaceWaiters.delete(w);
      w.conn.spaceWaits.delete(w);
      w.conn.reply(Op.WAIT_SPACE, w.tag, Status.OK);
    }
  }

  handlePull(conn: RelayConnection, tag: number, key: string, waitMs: number): void {
    try {
      validateKey(key);
    } catch (e) {
      conn.reply(Op.PULL, tag, Status.INVALID_KEY, (e as Error).message);
      return;
    }
    const blob = this.blobs.get(key);
    if (blob) {
      conn.sendBlob(tag, blob);
      return;
    }
    const ms = Math.min(waitMs, MAX_WAIT_MS);
    const w: PullWaiter = {
      key,
      conn,
      tag,
      timer: setTimeout(() => {
        this.forgetPullWaiter(w);
        conn.pullWaits.delete(w);
        conn.reply(Op.PULL, tag, Status.TIMEOUT, `no blob ${key} was pushed to relay ${this.address} within ${ms} ms`);
      }, ms),
    };
    let set = this.pullWaiters.get(key);
    if (!set) this.pullWaiters.set(key, (set = new Set()));
    set.add(w);
    conn.pullWaits.add(w);
  }

  forgetPullWaiter(w: PullWaiter): void {
    const set = this.pullWaiters.get(w.key);
    if (set?.delete(w) && !set.size) this.pullWaiters.delete(w.key);
  }

  handleRelease(conn: RelayConnection, tag: number, requestId: string): void {
    try {
      validateRequestId(requestId);
    } catch (e) {
      conn.reply(Op.RELEASE, tag, Status.INVALID_KEY, isAirmError(e) ? e.message : String(e));
      return;
    }
    const keys = this.byRequest.get(requestId);
    let n = 0;
    this.released.delete(requestId);
    this.released.set(requestId, Date.now());
    if (this.released.size > MAX_RELEASED) this.released.delete(this.released.keys().next().value!);
    if (keys) {
      for (const key of [...keys]) {
        const blob = this.blobs.get(key);
        if (blob) {
          this.drop(blob);
          n++;
        }
      }
    }
    conn.reply(Op.RELEASE, tag, Status.OK, "", n);
  }

  handleWaitSpace(conn: RelayConnection, tag: number, bytes: number, waitMs: number): void {
    if (bytes > this.pool.maxBytes) {
      conn.reply(Op.WAIT_SPACE, tag, Status.TOO_LARGE, `${bytes} bytes exceed the relay's cap of ${this.pool.maxBytes} bytes; raise AIRM_KV_TCP_MAX_MB`);
      return;
    }
    if (this.pool.fits(bytes)) {
      conn.reply(Op.WAIT_SPACE, tag, Status.OK);
      return;
    }
    const ms = Math.min(waitMs, MAX_WAIT_MS);
    const w: SpaceWaiter = {
      conn,
      tag,
      bytes,
      timer: setTimeout(() => {
        this.spaceWaiters.delete(w);
        conn.spaceWaits.delete(w);
        conn.reply(Op.WAIT_SPACE, tag, Status.NO_SPACE, this.fullMessage(bytes));
      }, ms),
    };
    this.spaceWaiters.add(w);
    conn.spaceWaits.add(w);
  }

  /** True when `key`'s request was released within the TTL. */
  wasReleased(key: string): boolean {
    return this.released.has(requestIdOf(key));
  }

  onLatePush(key: string, bytes: number): void {
    this.latePushes++;
    this.log.info({ key, bytes }, `dropped blob ${key}: its request was released before the push completed`);
  }

  /**
   * Drops blobs older than the TTL (the map is in push order, so the scan stops at the first young
   * one), and forgets releases older than the TTL.
   */
  private sweep(): void {
    const cutoff = Date.now() - this.ttlMs;
    for (const [rid, at] of this.released) {
      if (at > cutoff) break;
      this.released.delete(rid);
    }
    for (const blob of this.blobs.values()) {
      if (blob.pushedAt > cutoff) break;
      this.expired++;
      this.metrics.expired.inc({ read: String(blob.read) });
      if (!blob.read) this.log.warn({ key: blob.key, bytes: blob.size }, `blob ${blob.key} expired unread after ${this.ttlMs} ms`);
      this.drop(blob);
    }
  }

  /** Stops listening, drops every connection, blob and timer. Idempotent. */
  close(): Promise<void> {
    this.closing ??= (async () => {
      if (this.sweeper) clearInterval(this.sweeper);
      const closed = new Promise<void>((resolve) => this.server.close(() => resolve()));
      for (const c of this.conns) {
        c.closed = true;
        c.socket.destroy();
      }
      await closed;
      for (const blob of [...this.blobs.values()]) this.drop(blob);
      for (const set of this.pullWaiters.values()) for (const w of set) clearTimeout(w.timer);
      this.pullWaiters.clear();
      for (const w of this.spaceWaiters) clearTimeout(w.timer);
      this.spaceWaiters.clear();
      await this.metricsServer?.close();
    })();
    return this.closing;
  }
}

/**
 * Starts a relay; unset options take RELAY_CONFIG's defaults (the CLI resolves them from the
 * AIRM_KV_TCP_* variables). Throws the listen error (EADDRINUSE...) as is.
 */
export async function startRelay(opts: RelayOptions = {}): Promise<Relay> {
  const d = RELAY_CONFIG.resolve({});
  const relay = new Relay({
    maxBytes: opts.maxBytes ?? Math.floor(d.maxMb * 1024 * 1024),
    ttlMs: opts.ttlMs ?? d.ttlS * 1000,
    crc: opts.crc ?? d.crc,
    log: opts.log ?? d.log,
    reusePool: opts.reusePool ?? d.reusePool,
    directReads: opts.directReads ?? d.directReads,
    token: opts.token,
    tls: opts.tls,
  });
  await relay.listen(opts.host ?? "127.0.0.1", opts.port ?? 7400, opts.metricsPort);
  return relay;
}
