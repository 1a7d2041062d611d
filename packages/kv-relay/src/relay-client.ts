// The client side of the relay protocol: a per-process pool of connections per relay address,
// each multiplexing exchanges by tag and reading every payload straight into its destination
// (net.connect onread), and RelayClient, whose push/pull/release turn the relay's statuses into
// rm-core's typed errors. A client given the deployment's token (AIRM_INTERNAL_TOKEN) opens every
// connection with a HELLO carrying it; given its TLS material (AIRM_TLS_DIR) it connects with
// tls.connect, presenting its certificate, and reads through the same `onread` staged reader
// (Node decrypts straight into the destination). Knows frames, sockets and reconnecting; what a
// blob means (a KV layer, a UCX descriptor) is the caller's.

import net from "node:net";
import tls from "node:tls";
import { crc32 } from "@node-rs/crc32";
import { ConfigError, InvalidKeyError, KVIntegrityError, TransportError, TransportTimeoutError, clientTlsOptions, isTlsError, kvCrc32, type TlsMaterial } from "@airm/rm-core";
import { FLAG_CRC, HEADER_BYTES, MAGIC, MAX_HELLO_BYTES, Op, PROTOCOL_VERSION, RESPONSE_BIT, Status, decodeHeader, encodeHead, type FrameHeader } from "./frame.ts";
import { formatHostPort, parseHostPort } from "./address.ts";
import { stagedOnRead } from "./staged-read.ts";

/** The connection carrying an exchange closed before its answer arrived (the exchange may be retried). */
export class ConnectionLostError extends TransportError {
  constructor(message: string) {
    super(message, "TRANSPORT_ERROR");
  }
}

export interface ExchangeResult {
  status: number;
  arg: number;
  /** The error text the relay sent with a non-OK status. */
  message: string;
  /** The blob of a successful PULL: a view of `into` or a fresh buffer. */
  payload?: Uint8Array;
  /** Set when the blob's CRC-32 was checked and did not match. */
  crcMismatch?: { sent: number; got: number };
  /** The CRC-32 computed over the payload as it arrived, when it was checked and matched. */
  crc?: number;
  /** A PULL's blob: from its header to its last byte (performance.now() ms), the relay's wait for the push excluded. */
  transfer?: { startMs: number; endMs: number };
}

export interface Exchange {
  op: number;
  key: string;
  /** Who started it (a transport), so its close() can cancel it. */
  owner: object;
  /** Destination of a PULL's payload. */
  into?: Uint8Array;
  /** Check the CRC-32 of a PULL's payload when the relay sent one. */
  checkCrc: boolean;
  resolve(r: ExchangeResult): void;
  reject(e: Error): void;
  settled: boolean;
  timer?: NodeJS.Timeout;
  conn?: ClientConnection;
  tag?: number;
}

/** What a caller refused by the relay (UNAUTHORIZED) gets: which relay, and what to fix. */
export function unauthorizedError(address: string): TransportError {
  return new TransportError(
    `the KV relay at ${address} refused this connection: AIRM_INTERNAL_TOKEN is missing or differs from the relay's; ` +
      `give every part of the deployment the same AIRM_INTERNAL_TOKEN`,
  );
}

/** Settles an exchange once (later answers are ignored). */
export function settle(ex: Exchange, r: ExchangeResult | Error): void {
  if (ex.settled) return;
  ex.settled = true;
  if (ex.timer) clearTimeout(ex.timer);
  ex.conn?.forget(ex);
  if (r instanceof Error) ex.reject(r);
  else ex.resolve(r);
}

const DISCARD_BYTES = 64 * 1024;
/** Error texts from the relay are short; anything longer is a broken stream. */
const MAX_MESSAGE_BYTES = 64 * 1024;

enum BodyKind {
  Blob,
  Message,
  Discard,
}

interface Body {
  h: FrameHeader;
  ex: Exchange | undefined;
  kind: BodyKind;
  target: Uint8Array;
  fill: number;
  left: number;
  crcState: number;
  checkCrc: boolean;
  /** Why the blob is being thrown away (a destination too small). */
  refusal?: Error;
  /** When its header arrived (performance.now()): the relay sends a blob's header as it starts sending the blob. */
  startedAt: number;
}

/** What a failed connection's error says about TLS: a hint naming the setting to check, or "". */
function tlsHint(e: Error | undefined): string {
  return e && isTlsError(e) ? " (TLS: the relay and this part need certificates of the same CA in AIRM_TLS_DIR, in force, and both ends TLS or neither)" : "";
}

/**
 * Opens the socket of a connection: plain TCP, or mutual TLS with `material`. Both read through
 * `onread` (tls.connect takes it too: TLS records are decrypted straight into the buffers the
 * frame parser names). Resolves on "connect", or on "secureConnect" once the server's
 * certificate is verified.
 */
function openSocket(host: string, port: number, onread: net.OnReadOpts, material: TlsMaterial | undefined): { socket: net.Socket; readyEvent: string } {
  if (!material) return { socket: net.connect({ host, port, noDelay: true, onread }), readyEvent: "connect" };
  // tls.connect documents `onread` (without a `socket` option); @types/node does not declare it.
  const options: tls.ConnectionOptions & { onread: net.OnReadOpts } = { host, port, onread, ...clientTlsOptions(material) };
  const socket = tls.connect(options);
  socket.setNoDelay(true);
  return { socket, readyEvent: "secureConnect" };
}

/** One TCP (or TLS) connection to a relay. */
export class ClientConnection {
  readonly socket: net.Socket;
  readonly ready: Promise<void>;
  readonly pending = new Map<number, Exchange>();
  closed = false;
  /** Exchanges and payload bytes assigned to this connection and not finished (load balancing). */
  load = 0;
  loadBytes = 0;
  private nextTag = 1;
  private readonly hdr = Buffer.alloc(HEADER_BYTES);
  private hdrFill = 0;
  private body: Body | undefined;
  private readonly scratch = Buffer.allocUnsafe(DISCARD_BYTES);
  private lastError: Error | undefined;
  /** Set once the relay answered UNAUTHORIZED: every exchange on this connection fails with it. */
  private refusal: TransportError | undefined;

  /** `token`: sent in a HELLO ahead of every other frame (the relay's AIRM_INTERNAL_TOKEN); `material`: connect over mutual TLS. */
  constructor(
    readonly host: string,
    readonly port: number,
    private readonly onClosed: (c: ClientConnection) => void,
    token?: string,
    material?: TlsMaterial,
  ) {
    const { socket, readyEvent } = openSocket(host, port, stagedOnRead(this), material);
    this.socket = socket;
    this.ready = new Promise<void>((resolve, reject) => {
      this.socket.once(readyEvent, () => {
        if (!this.pending.size) this.socket.unref(); // an idle pooled connection does not keep the process alive
        resolve();
      });
      this.socket.once("close", () => reject(this.lastError ?? new Error("closed before connecting")));
    });
    this.ready.catch(() => {});
    this.socket.on("error", (e) => (this.lastError = e));
    this.socket.on("drain", () => this.flushQueue());
    this.socket.on("close", () => this.onClose());
    if (token !== undefined) this.hello(token);
  }

  get address(): string {
    return formatHostPort(this.host, this.port);
  }

  /**
   * Queues the HELLO before anything else is written (the socket sends it first once connected).
   * Nothing waits for its answer: frames sent after it ride behind it, and an UNAUTHORIZED answer
   * fails every exchange of the connection (onRefused).
   */
  private hello(token: string): void {
    const payload = Buffer.from(token, "utf8");
    const ex: Exchange = {
      op: Op.HELLO,
      key: "",
      owner: this,
      checkCrc: false,
      settled: false,
      resolve: (r) => {
        if (r.status === Status.OK || r.status === Status.UNAUTHORIZED) return; // UNAUTHORIZED: finishBody refuses the connection
        this.lastError = new Error(`relay ${this.address} answered HELLO with status ${r.status}: ${r.message}`);
        this.socket.destroy();
      },
      reject: () => {}, // the connection closed first: its other exchanges say so
    };
    this.send(ex, (tag) => encodeHead({ op: Op.HELLO, flags: 0, status: 0, tag, payloadLength: payload.length, crc: 0, arg: 0 }), payload);
  }

  /**
   * Sends one request frame: the header+key and the payload in one corked write (a writev, shared
   * with the other frames sent in the same tick). While
   * the socket has more queued than the kernel takes, frames wait here in order, and `head` (which
   * may checksum the payload) runs only when its frame goes out: checksumming the next blob
   * overlaps with the kernel draining the previous one.
   */
  send(ex: Exchange, head: (tag: number) => Buffer, payload?: Uint8Array): void {
    if (this.sendQueue.length || this.socket.writableNeedDrain) {
      this.sendQueue.push(() => this.sendNow(ex, head, payload));
      return;
    }
    this.sendNow(ex, head, payload);
  }

  private readonly sendQueue: (() => void)[] = [];

  private flushQueue(): void {
    while (this.sendQueue.length && !this.socket.writableNeedDrain && !this.closed) this.sendQueue.shift()!();
  }

  private sendNow(ex: Exchange, head: (tag: number) => Buffer, payload?: Uint8Array): void {
    if (ex.settled) return;
    if (this.refusal) {
      settle(ex, this.refusal);
      return;
    }
    if (this.closed) {
      settle(ex, new ConnectionLostError(`connection to relay ${this.address} is closed`));
      return;
    }
    const tag = this.nextTag;
    this.nextTag = this.nextTag >= 0xffff_ffff ? 1 : this.nextTag + 1;
    ex.conn = this;
    ex.tag = tag;
    this.pending.set(tag, ex);
    if (this.pending.size === 1) this.socket.ref();
    const s = this.socket;
    if (!this.corked) {
      // Frames sent in the same tick (a burst of pulls) leave in one writev.
      this.corked = true;
      s.cork();
      process.nextTick(() => {
        this.corked = false;
        s.uncork();
      });
    }
    s.write(head(tag));
    if (payload?.byteLength) s.write(payload);
  }

  private corked = false;

  unassign(bytes: number): void {
    this.load--;
    this.loadBytes -= bytes;
  }

  forget(ex: Exchange): void {
    if (ex.tag !== undefined && this.pending.get(ex.tag) === ex) {
      this.pending.delete(ex.tag);
      if (!this.pending.size) this.socket.unref();
    }
  }

  close(): void {
    this.socket.destroy();
  }

  /** Where the next bytes go: header bytes, or the exact rest of the current payload. Never empty. */
  nextBuffer(): Uint8Array {
    const b = this.body;
    if (!b) return this.hdr.subarray(this.hdrFill);
    if (b.kind === BodyKind.Discard) return this.scratch.subarray(0, Math.min(DISCARD_BYTES, b.left));
    return b.target.subarray(b.fill);
  }

  onRead(n: number): void {
    const b = this.body;
    if (!b) {
      this.hdrFill += n;
      if (this.hdrFill === HEADER_BYTES) {
        this.hdrFill = 0;
        this.onHeader();
      }
      return;
    }
    if (b.kind === BodyKind.Discard) {
      b.left -= n;
    } else {
      if (b.checkCrc) b.crcState = crc32(b.target.subarray(b.fill, b.fill + n), b.crcState);
      b.fill += n;
      b.left -= n;
    }
    if (b.left === 0) this.finishBody(b);
  }

  private onHeader(): void {
    const h = decodeHeader(this.hdr);
    if (h.magic !== MAGIC || h.version !== PROTOCOL_VERSION || (h.op & RESPONSE_BIT) === 0) {
      this.lastError = new Error(`relay ${this.address} sent a malformed frame (magic 0x${h.magic.toString(16)}, version ${h.version}, op ${h.op})`);
      this.socket.destroy();
      return;
    }
    const ex = this.pending.get(h.tag);
    if (ex?.timer) {
      clearTimeout(ex.timer);
      ex.timer = undefined;
    }
    const body: Body = { h, ex, kind: BodyKind.Discard, target: this.scratch, fill: 0, left: h.payloadLength, crcState: 0, checkCrc: false, startedAt: performance.now() };
    if (ex && !ex.settled) {
      if (h.status === Status.OK && (h.op & ~RESPONSE_BIT) === ex.op && ex.op === Op.PULL) {
        if (ex.into && ex.into.byteLength < h.payloadLength) {
          body.refusal = new TransportError(`pull of ${ex.key}: the destination holds ${ex.into.byteLength} bytes but the blob is ${h.payloadLength}; pass a larger \`into\``);
        } else {
          body.kind = BodyKind.Blob;
          body.target = ex.into ? ex.into.subarray(0, h.payloadLength) : Buffer.allocUnsafeSlow(h.payloadLength);
          body.checkCrc = ex.checkCrc && (h.flags & FLAG_CRC) !== 0;
        }
      } else if (h.payloadLength <= MAX_MESSAGE_BYTES) {
        body.kind = BodyKind.Message;
        body.target = Buffer.allocUnsafe(h.payloadLength);
      } else {
        this.lastError = new Error(`relay ${this.address} sent a ${h.payloadLength}-byte answer where a short message was expected`);
        this.socket.destroy();
        return;
      }
    }
    if (h.payloadLength === 0) this.finishBody(body);
    else this.body = body;
  }

  private finishBody(b: Body): void {
    this.body = undefined;
    if (b.ex) this.settleBody(b, b.ex);
    if (b.h.status === Status.UNAUTHORIZED) this.onRefused();
  }

  private settleBody(b: Body, ex: Exchange): void {
    if (b.refusal) {
      settle(ex, b.refusal);
      return;
    }
    const r: ExchangeResult = { status: b.h.status, arg: b.h.arg, message: "" };
    if (b.kind === BodyKind.Message) r.message = Buffer.from(b.target.buffer, b.target.byteOffset, b.target.byteLength).toString("utf8");
    else if (b.kind === BodyKind.Blob) {
      r.payload = b.target;
      r.transfer = { startMs: b.startedAt, endMs: performance.now() };
      if (b.checkCrc) {
        if (b.crcState >>> 0 !== b.h.crc >>> 0) r.crcMismatch = { sent: b.h.crc >>> 0, got: b.crcState >>> 0 };
        else r.crc = b.crcState >>> 0;
      }
    }
    settle(ex, r);
  }

  /** The relay refused this connection (it closes it): every exchange on it fails with the same TransportError, none is retried. */
  private onRefused(): void {
    this.refusal ??= unauthorizedError(this.address);
    const queued = this.sendQueue.splice(0);
    for (const run of queued) run(); // each finds the refusal and fails its exchange
    for (const ex of [...this.pending.values()]) settle(ex, this.refusal);
    this.socket.destroy();
  }

  private onClose(): void {
    this.closed = true;
    this.onClosed(this);
    const why = this.lastError ? `: ${this.lastError.message}${tlsHint(this.lastError)}` : "";
    const queued = this.sendQueue.splice(0);
    for (const run of queued) run(); // each finds the connection closed and fails its exchange
    for (const ex of [...this.pending.values()]) {
      settle(ex, this.refusal ?? new ConnectionLostError(`connection to relay ${this.address} closed before it answered ${ex.key ? `(${ex.key})` : ""}${why}`));
    }
    this.pending.clear();
  }
}

const CONNECT_ERRORS = new Set(["ECONNREFUSED", "ECONNRESET", "ETIMEDOUT", "EHOSTUNREACH", "ENETUNREACH", "EAI_AGAIN", "EPIPE"]);

/** The connections of this process to one relay address (with one token and TLS material), shared by every transport pointed at it. */
export class RelayPool {
  users = 0;
  private readonly conns: ClientConnection[] = [];

  constructor(
    readonly host: string,
    readonly port: number,
    readonly maxConnections: number,
    /** Sent in a HELLO on every connection opened (unset: none). */
    readonly token?: string,
    /** Every connection is mutual TLS with it (unset: plain TCP). */
    readonly tls?: TlsMaterial,
  ) {}

  get address(): string {
    return formatHostPort(this.host, this.port);
  }

  /**
   * A connected connection with `bytes` assigned to it (give them back with conn.unassign): an idle
   * one, a new one while fewer than maxConnections are open, else the least loaded. Retries refused
   * connects (a relay restarting) until `deadline` (epoch ms).
   * Throws TransportError when the relay cannot be reached in time.
   */
  async pick(deadline: number, bytes: number): Promise<ClientConnection> {
    let delay = 25;
    for (;;) {
      let best: ClientConnection | undefined;
      for (const c of this.conns) if (!best || c.loadBytes < best.loadBytes || (c.loadBytes === best.loadBytes && c.load < best.load)) best = c;
      const conn = !best || (best.load > 0 && this.conns.length < this.maxConnections) ? this.open() : best;
      conn.load++;
      conn.loadBytes += bytes;
      try {
        await conn.ready;
        return conn;
      } catch (e) {
        conn.unassign(bytes);
        const code = (e as NodeJS.ErrnoException).code ?? "";
        const left = deadline - Date.now();
        if (!CONNECT_ERRORS.has(code) || left <= 0) {
          throw new TransportError(
            `cannot reach the KV relay at ${this.address} (${(e as Error).message})${tlsHint(e as Error)}; start it with \`airm-kv-relay --listen ${this.address}\` ` +
              `or point AIRM_KV_TCP_ADDR at the running relay`,
            "TRANSPORT_ERROR",
            { cause: e },
          );
        }
        await new Promise((r) => setTimeout(r, Math.min(delay, left)));
        delay = Math.min(delay * 2, 500);
      }
    }
  }

  private open(): ClientConnection {
    const c = new ClientConnection(
      this.host,
      this.port,
      (gone) => {
        const i = this.conns.indexOf(gone);
        if (i >= 0) this.conns.splice(i, 1);
      },
      this.token,
      this.tls,
    );
    this.conns.push(c);
    return c;
  }

  /** Cancels every exchange started by `owner` with `error`. */
  cancel(owner: object, error: Error): void {
    for (const c of this.conns) for (const ex of [...c.pending.values()]) if (ex.owner === owner) settle(ex, error);
  }

  destroy(): void {
    for (const c of [...this.conns]) c.close();
    this.conns.length = 0;
  }
}

const pools = new Map<string, RelayPool>();

/** A pool's id: its address, token and TLS folder (clients with different ones do not share connections). */
const poolId = (host: string, port: number, token: string | undefined, material: TlsMaterial | undefined) =>
  `${formatHostPort(host, port)}\0${token ?? ""}\0${material ? `tls:${material.dir}` : ""}`;

/** The process-wide pool for host:port, token and TLS material (created on first use); pair with releasePool(). */
export function acquirePool(host: string, port: number, maxConnections: number, token?: string, material?: TlsMaterial): RelayPool {
  const id = poolId(host, port, token, material);
  let p = pools.get(id);
  if (!p) pools.set(id, (p = new RelayPool(host, port, maxConnections, token, material)));
  p.users++;
  return p;
}

/** Drops one user of a pool; the last one closes its connections. */
export function releasePool(p: RelayPool): void {
  if (--p.users > 0) return;
  p.destroy();
  const id = poolId(p.host, p.port, p.token, p.tls);
  if (pools.get(id) === p) pools.delete(id);
}

// ---------------------------------------------------------------------------------------------
// The calls: push (waiting for space), pull (waiting for the blob), release, with the relay's
// statuses turned into rm-core's typed errors.

/** Default wait of a push for relay space, and of a pull for its blob (ms). */
export const DEFAULT_TIMEOUT_MS = 30_000;
/** How long past its own wait a call gives a silent relay before giving up (ms). */
const ANSWER_GRACE_MS = 5_000;
const RELEASE_TIMEOUT_MS = 10_000;
const MAX_WAIT_ARG = 0xffff_ffff;

export interface RelayClientOptions {
  /** Send and check CRC-32s (a push computes one unless given; a pull checks the relay's). */
  crc: boolean;
  /** Connections per relay address in this process. */
  connections: number;
  /**
   * The deployment's internal token (AIRM_INTERNAL_TOKEN), sent in a HELLO at the start of every
   * connection; a relay started with a token refuses connections without it. Unset: no HELLO.
   */
  token?: string;
  /** The deployment's TLS material (AIRM_TLS_DIR): connect over mutual TLS. Unset: plain TCP. */
  tls?: TlsMaterial;
}

/**
 * One user of the relay at an address: push, pull and release over the process's shared pool of
 * connections. A call whose connection dies before the answer is retried once on a fresh one
 * (every op is idempotent); refused connects are retried until the call's own deadline.
 */
export class RelayClient {
  private readonly pool: RelayPool;
  private closed = false;

  constructor(
    host: string,
    port: number,
    private readonly o: RelayClientOptions,
  ) {
    const token = o.token || undefined;
    if (token !== undefined && Buffer.byteLength(token, "utf8") > MAX_HELLO_BYTES) {
      throw new ConfigError("token", `the relay token is ${Buffer.byteLength(token, "utf8")} bytes; a HELLO carries at most ${MAX_HELLO_BYTES} (AIRM_INTERNAL_TOKEN)`);
    }
    this.pool = acquirePool(host, port, o.connections, token, o.tls);
  }

  /** A client of the relay at "host:port" (CRC on, 2 connections, no token and no TLS unless given). Throws ConfigError. */
  static connect(addr: string, options: Partial<RelayClientOptions> = {}): RelayClient {
    const { host, port } = parseHostPort(addr, "addr");
    return new RelayClient(host, port, { crc: options.crc ?? true, connections: options.connections ?? 2, token: options.token, tls: options.tls });
  }

  get address(): string {
    return this.pool.address;
  }

  /**
   * Stores `data` under `key`, waiting up to `timeoutMs` for space. Returns the relay's count of
   * expired blobs. Throws TransportError (NO_SPACE, unreachable), KVIntegrityError (the relay found
   * the bytes did not match `crc32`), InvalidKeyError; TransportError too when the relay refuses
   * this client's token (UNAUTHORIZED).
   */
  async push(key: string, data: Uint8Array, options: { timeoutMs?: number; crc32?: number } = {}): Promise<{ relayExpired: number }> {
    const timeoutMs = options.timeoutMs ?? DEFAULT_TIMEOUT_MS;
    const deadline = Date.now() + timeoutMs;
    // The caller's CRC-32 when it has one (the relay checks the bytes against it); else computed
    // at the first send, not here: a burst of pushes then overlaps checksumming with sending.
    let crc: number | undefined = this.o.crc ? options.crc32 : 0;
    const crcOf = () => (crc ??= this.o.crc ? kvCrc32(data) : 0);
    for (;;) {
      const r = await this.exchange(Op.PUSH, key, data, { flags: this.o.crc ? FLAG_CRC : 0, crc: crcOf, guardMs: deadline - Date.now() });
      if (r.status === Status.OK) return { relayExpired: r.arg };
      if (r.status !== Status.NO_SPACE) throw this.errorFor(r, key);
      const left = deadline - Date.now();
      if (left <= 0) throw new TransportError(`push of ${key} gave up after its timeout: ${r.message}`, "TRANSPORT_NO_SPACE");
      const wanted = Buffer.alloc(8);
      wanted.writeUInt32LE(data.byteLength % 0x1_0000_0000, 0);
      wanted.writeUInt32LE(Math.floor(data.byteLength / 0x1_0000_0000), 4);
      const w = await this.exchange(Op.WAIT_SPACE, "", wanted, { arg: Math.min(left, MAX_WAIT_ARG), guardMs: left + ANSWER_GRACE_MS, connectMs: left });
      if (w.status === Status.NO_SPACE) throw new TransportError(`push of ${key} waited ${timeoutMs} ms for space: ${w.message}`, "TRANSPORT_NO_SPACE");
      if (w.status !== Status.OK) throw this.errorFor(w, key);
    }
  }

  /**
   * The blob under `key`, waiting up to `timeoutMs` for it to be pushed; into `into` when given.
   * `crc32` is the CRC measured over the bytes as they arrived (null without CRCs). Throws
   * TransportTimeoutError, KVIntegrityError (damaged on the way), TransportError.
   */
  async pull(
    key: string,
    options: { timeoutMs?: number; into?: Uint8Array } = {},
  ): Promise<{ bytes: Uint8Array; crc32: number | null; transfer?: { startMs: number; endMs: number } }> {
    const waitMs = Math.min(Math.max(0, options.timeoutMs ?? DEFAULT_TIMEOUT_MS), MAX_WAIT_ARG);
    const r = await this.exchange(Op.PULL, key, undefined, { arg: waitMs, guardMs: waitMs + ANSWER_GRACE_MS, connectMs: waitMs, into: options.into });
    if (r.status !== Status.OK) throw this.errorFor(r, key);
    if (r.crcMismatch) {
      throw new KVIntegrityError(
        "crc32",
        `blob ${key} from relay ${this.address} has CRC-32 0x${r.crcMismatch.got.toString(16)} but was pushed with 0x${r.crcMismatch.sent.toString(16)}: ` +
          `the bytes were damaged on the way; do not use them, pull again or re-run the request`,
      );
    }
    return { bytes: r.payload!, crc32: r.crc ?? null, ...(r.transfer ? { transfer: r.transfer } : {}) };
  }

  /** Frees every blob of one request in the relay. Throws TransportError, InvalidKeyError. */
  async release(requestId: string): Promise<void> {
    const r = await this.exchange(Op.RELEASE, requestId, undefined, { guardMs: RELEASE_TIMEOUT_MS });
    if (r.status !== Status.OK) throw this.errorFor(r, requestId);
  }

  /** Cancels this client's calls in flight with `error` and drops its share of the pool. */
  close(error: Error = new TransportError(`relay client for ${this.address} was closed while this call was in flight`, "TRANSPORT_CLOSED")): void {
    if (this.closed) return;
    this.closed = true;
    this.pool.cancel(this, error);
    releasePool(this.pool);
  }

  private errorFor(r: ExchangeResult, key: string): Error {
    switch (r.status) {
      case Status.TIMEOUT:
        return new TransportTimeoutError(`${r.message}; check that the producer pushes ${key} to the same relay (${this.address}, AIRM_KV_TCP_ADDR)`);
      case Status.NO_SPACE:
      case Status.TOO_LARGE:
        return new TransportError(r.message, "TRANSPORT_NO_SPACE");
      case Status.CRC_MISMATCH:
        return new KVIntegrityError("crc32", r.message);
      case Status.INVALID_KEY:
        return new InvalidKeyError(r.message);
      case Status.UNAUTHORIZED:
        return unauthorizedError(this.address);
      default:
        return new TransportError(`relay ${this.address} answered ${key} with unknown status ${r.status}: ${r.message}`);
    }
  }

  /**
   * One request/answer with the relay. `guardMs` bounds the wait for the answer's header;
   * `connectMs` (default guardMs) bounds retrying refused connects.
   */
  private async exchange(
    op: number,
    key: string,
    payload: Uint8Array | undefined,
    o: { flags?: number; crc?: number | (() => number); arg?: number; guardMs: number; connectMs?: number; into?: Uint8Array },
  ): Promise<ExchangeResult> {
    const { flags = 0, crc = 0, arg = 0, guardMs, into } = o;
    const start = Date.now();
    const deadline = start + Math.max(guardMs, 1000);
    const connectDeadline = start + Math.max(o.connectMs ?? guardMs, 100);
    const bytes = payload?.byteLength ?? 0;
    for (let attempt = 0; ; attempt++) {
      const conn = await this.pool.pick(Math.min(deadline, connectDeadline), bytes);
      try {
        if (this.closed) throw new TransportError(`relay client for ${this.address} is closed`, "TRANSPORT_CLOSED");
        return await new Promise<ExchangeResult>((resolve, reject) => {
          const ex: Exchange = { op, key, owner: this, into, checkCrc: this.o.crc, resolve, reject, settled: false };
          ex.timer = setTimeout(
            () => settle(ex, new TransportTimeoutError(`relay ${this.address} did not answer ${opName(op)} ${key} within ${guardMs} ms; is it overloaded or stuck?`)),
            Math.max(1, deadline - Date.now()),
          );
          const head = (tag: number) => encodeHead({ op, flags, status: 0, tag, payloadLength: bytes, crc: typeof crc === "function" ? crc() : crc, arg }, key);
          conn.send(ex, head, payload);
        });
      } catch (e) {
        if (e instanceof ConnectionLostError && attempt === 0 && Date.now() < deadline && !this.closed) continue;
        throw e;
      } finally {
        conn.unassign(bytes);
      }
    }
  }
}

function opName(op: number): string {
  return op === Op.PUSH ? "push of" : op === Op.PULL ? "pull of" : op === Op.RELEASE ? "release of" : "space wait for";
}
