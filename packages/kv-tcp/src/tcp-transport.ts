// The `tcp` KV transport: push/pull/release against an airm-kv-relay, CRC-32 per blob (computed
// here on push, checked here on pull), typed errors, local accounting for stats(). Connections and
// framing live in relay-client.ts; the relay itself in relay-server.ts.

import { createHash } from "node:crypto";
import {
  ConfigError,
  InvalidKeyError,
  KVIntegrityError,
  KV_LAYOUT,
  TransportError,
  TransportTimeoutError,
  checkBlobSpec,
  kvCrc32,
  noteBlobCrc32,
  requestIdOf,
  validateKey,
  validateRequestId,
  type ConformanceFixture,
  type KVTransport,
  type KVTransportPlugin,
  type PullOptions,
  type PushOptions,
  type TransportStats,
  type TransportSupport,
} from "@airm/rm-core";
import { pino, type Logger } from "pino";
import { FLAG_CRC, Op, Status, encodeHead } from "./frame.ts";
import { ConnectionLostError, acquirePool, releasePool, settle, type Exchange, type ExchangeResult, type RelayPool } from "./relay-client.ts";
import { startRelay } from "./relay-server.ts";
import { DEFAULT_ADDR, envFlag, parseHostPort } from "./tcp-config.ts";

export const TCP_SUPPORT: TransportSupport = {
  scope: ["same-host", "cross-node"],
  tiers: ["host-dram"],
  dtypes: ["bf16", "fp16"],
  layouts: [KV_LAYOUT],
  copyOnly: false,
};

/** Default wait of a push for relay space, and of a pull for its blob (ms). */
export const DEFAULT_TIMEOUT_MS = 30_000;
/** How long past its own wait a pull gives a silent relay before giving up (ms). */
const ANSWER_GRACE_MS = 5_000;
const RELEASE_TIMEOUT_MS = 10_000;
const MAX_WAIT_ARG = 0xffff_ffff;

export interface TcpTransportOptions {
  /** Relay "host:port" (default AIRM_KV_TCP_ADDR, else 127.0.0.1:7400). */
  addr?: string;
  /** Compute and check CRC-32 per blob (default AIRM_KV_TCP_CRC, else true). */
  crc?: boolean;
  /** Log size and SHA-256 per blob (default AIRM_KV_TCP_LOG, else false). */
  log?: boolean;
  /** Connections per relay address in this process (default 2; more did not help on loopback). */
  connections?: number;
}

let blobLogger: Logger | undefined;

class TcpTransport implements KVTransport {
  readonly name = "tcp";
  readonly support = TCP_SUPPORT;
  private closed = false;
  private readonly pool: RelayPool;
  /** Bytes pushed by this endpoint and not yet released, per request and key. */
  private readonly held = new Map<string, Map<string, number>>();
  private heldBlobs = 0;
  private heldBytes = 0;
  private relayExpired = 0;

  constructor(
    host: string,
    port: number,
    private readonly crc: boolean,
    private readonly logBlobs: boolean,
    connections: number,
  ) {
    this.pool = acquirePool(host, port, connections);
  }

  get address(): string {
    return this.pool.address;
  }

  async push(key: string, data: Uint8Array, options: PushOptions = {}): Promise<void> {
    this.checkOpen();
    validateKey(key);
    checkBlobSpec(this, options);
    if (!(data instanceof Uint8Array)) throw new TransportError(`push of ${key}: data must be a Uint8Array, got ${typeof data}`);
    const deadline = Date.now() + (options.timeoutMs ?? DEFAULT_TIMEOUT_MS);
    // The caller's CRC-32 when it has one (the relay checks the bytes against it); else computed
    // at the first send, not here: a burst of pushes then overlaps checksumming with sending.
    let crc: number | undefined = this.crc ? options.crc32 : 0;
    const crcOf = () => (crc ??= this.crc ? kvCrc32(data) : 0);
    if (this.logBlobs) this.logBlob("blob pushed", key, data);
    for (;;) {
      const r = await this.exchange(Op.PUSH, key, data, { flags: this.crc ? FLAG_CRC : 0, crc: crcOf, guardMs: deadline - Date.now() });
      if (r.status === Status.OK) {
        this.relayExpired = r.arg;
        this.account(key, data.byteLength);
        return;
      }
      if (r.status !== Status.NO_SPACE) throw this.errorFor(r, key);
      const left = deadline - Date.now();
      if (left <= 0) throw new TransportError(`push of ${key} gave up after its timeout: ${r.message}`, "TRANSPORT_NO_SPACE");
      const wanted = Buffer.alloc(8);
      wanted.writeUInt32LE(data.byteLength % 0x1_0000_0000, 0);
      wanted.writeUInt32LE(Math.floor(data.byteLength / 0x1_0000_0000), 4);
      const w = await this.exchange(Op.WAIT_SPACE, "", wanted, { arg: Math.min(left, MAX_WAIT_ARG), guardMs: left + ANSWER_GRACE_MS, connectMs: left });
      if (w.status === Status.NO_SPACE) throw new TransportError(`push of ${key} waited ${options.timeoutMs ?? DEFAULT_TIMEOUT_MS} ms for space: ${w.message}`, "TRANSPORT_NO_SPACE");
      if (w.status !== Status.OK) throw this.errorFor(w, key);
    }
  }

  async pull(key: string, options: PullOptions = {}): Promise<Uint8Array> {
    this.checkOpen();
    validateKey(key);
    checkBlobSpec(this, options);
    if (options.into !== undefined && !(options.into instanceof Uint8Array)) throw new TransportError(`pull of ${key}: \`into\` must be a Uint8Array`);
    const waitMs = Math.min(Math.max(0, options.timeoutMs ?? DEFAULT_TIMEOUT_MS), MAX_WAIT_ARG);
    const r = await this.exchange(Op.PULL, key, undefined, { arg: waitMs, guardMs: waitMs + ANSWER_GRACE_MS, connectMs: waitMs, into: options.into });
    if (r.status !== Status.OK) throw this.errorFor(r, key);
    const data = r.payload!;
    if (r.crcMismatch) {
      throw new KVIntegrityError(
        "crc32",
        `blob ${key} from relay ${this.address} has CRC-32 0x${r.crcMismatch.got.toString(16)} but was pushed with 0x${r.crcMismatch.sent.toString(16)}: ` +
          `the bytes were damaged on the way; do not use them, pull again or re-run the request`,
      );
    }
    if (r.crc !== undefined) noteBlobCrc32(data, r.crc);
    if (this.logBlobs) this.logBlob("blob pulled", key, data);
    return data;
  }

  async release(requestId: string): Promise<void> {
    this.checkOpen();
    validateRequestId(requestId);
    const r = await this.exchange(Op.RELEASE, requestId, undefined, { guardMs: RELEASE_TIMEOUT_MS });
    if (r.status !== Status.OK) throw this.errorFor(r, requestId);
    const mine = this.held.get(requestId);
    if (mine) {
      for (const bytes of mine.values()) {
        this.heldBlobs--;
        this.heldBytes -= bytes;
      }
      this.held.delete(requestId);
    }
  }

  async close(): Promise<void> {
    if (this.closed) return;
    this.closed = true;
    this.pool.cancel(this, new TransportError(`tcp transport to ${this.address} was closed while this call was in flight`, "TRANSPORT_CLOSED"));
    releasePool(this.pool);
  }

  /** Blobs and bytes this endpoint pushed and has not released; `expired` is the relay's count as of the last push. */
  stats(): TransportStats {
    return { blobs: this.heldBlobs, bytes: this.heldBytes, expired: this.relayExpired };
  }

  private checkOpen(): void {
    if (this.closed) throw new TransportError(`tcp transport to ${this.address} is closed; create a new one`, "TRANSPORT_CLOSED");
  }

  private account(key: string, bytes: number): void {
    const rid = requestIdOf(key);
    let m = this.held.get(rid);
    if (!m) this.held.set(rid, (m = new Map()));
    const old = m.get(key);
    if (old !== undefined) {
      this.heldBlobs--;
      this.heldBytes -= old;
    }
    m.set(key, bytes);
    this.heldBlobs++;
    this.heldBytes += bytes;
  }

  private errorFor(r: ExchangeResult, key: string): Error {
    switch (r.status) {
      case Status.TIMEOUT:
        return new TransportTimeoutError(`${r.message}; check that the producer pushes ${key} to the same AIRM_KV_TCP_ADDR (${this.address})`);
      case Status.NO_SPACE:
      case Status.TOO_LARGE:
        return new TransportError(r.message, "TRANSPORT_NO_SPACE");
      case Status.CRC_MISMATCH:
        return new KVIntegrityError("crc32", r.message);
      case Status.INVALID_KEY:
        return new InvalidKeyError(r.message);
      default:
        return new TransportError(`relay ${this.address} answered ${key} with unknown status ${r.status}: ${r.message}`);
    }
  }

  /**
   * One request/answer with the relay. A connection that dies before answering is retried once on a
   * fresh connection (every op is idempotent). `guardMs` bounds the wait for the answer's header;
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
        this.checkOpen();
        return await new Promise<ExchangeResult>((resolve, reject) => {
          const ex: Exchange = { op, key, owner: this, into, checkCrc: this.crc, resolve, reject, settled: false };
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

  private logBlob(what: string, key: string, data: Uint8Array): void {
    blobLogger ??= pino({ name: "airm-kv-tcp", base: undefined }, pino.destination(2));
    const sha256 = createHash("sha256").update(data).digest("hex");
    blobLogger.info({ key, bytes: data.byteLength, sha256, relay: this.address }, what);
  }
}

function opName(op: number): string {
  return op === Op.PUSH ? "push of" : op === Op.PULL ? "pull of" : op === Op.RELEASE ? "release of" : "space wait for";
}

function readOptions(options: Record<string, unknown>): Required<TcpTransportOptions> {
  const addr = options.addr ?? process.env.AIRM_KV_TCP_ADDR ?? DEFAULT_ADDR;
  if (typeof addr !== "string" || addr.trim() === "") throw new ConfigError(options.addr !== undefined ? "addr" : "AIRM_KV_TCP_ADDR", `expected "host:port", got ${JSON.stringify(addr)}`);
  for (const k of ["crc", "log"] as const) {
    if (options[k] !== undefined && typeof options[k] !== "boolean") throw new ConfigError(k, `expected true or false, got ${JSON.stringify(options[k])}`);
  }
  const connections = options.connections ?? 2;
  if (typeof connections !== "number" || !Number.isInteger(connections) || connections < 1 || connections > 64) {
    throw new ConfigError("connections", `expected an integer 1..64, got ${JSON.stringify(connections)}`);
  }
  return {
    addr,
    crc: (options.crc as boolean | undefined) ?? envFlag("AIRM_KV_TCP_CRC", true),
    log: (options.log as boolean | undefined) ?? envFlag("AIRM_KV_TCP_LOG", false),
    connections,
  };
}

/**
 * Opens a tcp transport endpoint (no connection is made until the first call).
 * Throws ConfigError for a bad address or option.
 */
export function createTcpTransport(options: TcpTransportOptions = {}): KVTransport & { readonly address: string } {
  const o = readOptions(options as Record<string, unknown>);
  const { host, port } = parseHostPort(o.addr, options.addr !== undefined ? "addr" : "AIRM_KV_TCP_ADDR");
  if (port === 0) throw new ConfigError("addr", `port 0 is not a relay address: give the port the relay listens on`);
  return new TcpTransport(host, port, o.crc, o.log, o.connections);
}

export const tcpTransport: KVTransportPlugin = {
  kind: "kv_transport",
  name: "tcp",
  support: TCP_SUPPORT,
  async create(options: Record<string, unknown> = {}) {
    return createTcpTransport(options as TcpTransportOptions);
  },
  /** An in-process relay on a free loopback port, closed by teardown. */
  async conformance(): Promise<ConformanceFixture> {
    const relay = await startRelay({ host: "127.0.0.1", port: 0, maxBytes: 512 * 1024 * 1024, crc: true, log: false });
    return {
      factory: async () => createTcpTransport({ addr: relay.address }),
      teardown: () => relay.close(),
    };
  },
};
