// The `nixl-ucx` KV transport: push copies a blob into this endpoint's registered UCX arena and
// publishes its descriptor in the relay under the blob's key; pull waits for the descriptor,
// READs the bytes with ucp_get_nbx into its own arena, checks the CRC-32 and acks the producer,
// whose slot is then freed; pulls take turns over its read lanes (one UCX engine each). The UCX
// calls and the progress threads live in ucx-engine.ts.

import { createHash, randomBytes } from "node:crypto";
import { pino, type Logger } from "pino";
import {
  ConfigError,
  DEFAULT_PULL_TIMEOUT_MS,
  KV_LAYOUT,
  TransportError,
  TransportTimeoutError,
  checkBlobSpec,
  isAirmError,
  kvCrc32,
  noteBlobCrc32,
  requestIdOf,
  validateKey,
  validateRequestId,
  type KVTransport,
  type PullOptions,
  type PushOptions,
  type TransportStats,
  type TransportSupport,
} from "@airm/rm-core";
import { decodeDescriptor, encodeDescriptor } from "./blob-descriptor.ts";
import { relayDirectory, type DescriptorDirectory } from "./descriptor-directory.ts";
import { ACK_WORDS_PER_ENDPOINT, acquireEngine, releaseEngine, type AckTicket, type UcxEngine } from "./ucx-engine.ts";
import type { PeerRef } from "./ucx-thread-protocol.ts";

export const NIXL_UCX_SUPPORT: TransportSupport = {
  scope: ["same-host", "cross-node"],
  tiers: ["host-dram"],
  dtypes: ["bf16", "fp16"],
  layouts: [KV_LAYOUT],
  copyOnly: false,
};

export const DEFAULT_POOL_MB = 1024;
export const DEFAULT_TTL_S = 300;
export const DEFAULT_READ_LANES = 2;
const DEFAULT_PUSH_TIMEOUT_MS = 30_000;
/** How often outstanding slots are checked for acks and expiry (ms). */
const SWEEP_MS = 20;

/** Environment variables this transport reads (UCX itself reads UCX_*). */
export const ENV_VARS: Record<string, string> = {
  AIRM_KV_TCP_ADDR: "relay host:port where descriptors are published (the kv-tcp relay; default 127.0.0.1:7400)",
  AIRM_KV_UCX_POOL_MB: `registered arena per endpoint in MiB (default ${DEFAULT_POOL_MB}); bounds the bytes pushed and not yet read, and the pulled arrays held until release`,
  AIRM_KV_TCP_TTL_S: `seconds an unread pushed slot lives before it is freed (default ${DEFAULT_TTL_S})`,
  AIRM_KV_UCX_LOG: "1 logs size and SHA-256 of every blob pushed or pulled (audits only: costs ~0.7 ms per MiB)",
  AIRM_KV_UCX_READ_LANES: `UCX workers a consumer READs through in turn, each with its own progress thread and arena (default ${DEFAULT_READ_LANES}); over shared memory each copies and checks on its own core`,
  AIRM_KV_UCX_ERR_MODE: "auto | peer | none: UCX endpoint error handling (auto = peer unless a shared-memory transport is enabled)",
  UCX_TLS: "the wire UCX uses: tcp today; rc,ud,sm,self with UCX_NET_DEVICES on RoCE/InfiniBand; sm,self or posix,self on one host",
};

export interface NixlUcxOptions {
  /** Relay "host:port" for descriptors (default AIRM_KV_TCP_ADDR). */
  addr?: string;
  /** A directory to use instead of the relay (tests that exercise only the UCX layer). */
  directory?: DescriptorDirectory;
  /** Arena size in MiB (default AIRM_KV_UCX_POOL_MB, else 1024). */
  poolMb?: number;
  /** Unread-slot lifetime in seconds (default AIRM_KV_TCP_TTL_S, else 300). */
  ttlS?: number;
  /** Log size and SHA-256 per blob (default AIRM_KV_UCX_LOG). */
  log?: boolean;
  /** UCX_TLS for this endpoint only (default: the environment's UCX_TLS). */
  tls?: string;
  /** UCX endpoint error handling (default AIRM_KV_UCX_ERR_MODE, else auto). */
  errMode?: "auto" | "peer" | "none";
  /** Polling window after the last UCX activity before the progress thread sleeps (ms, default 2). */
  spinMs?: number;
  /** UCX workers (each with its own progress thread and arena) pulls READ through, in turn (default AIRM_KV_UCX_READ_LANES, else 2). */
  readLanes?: number;
}

function envNumber(name: string, fallback: number, min: number): number {
  const raw = process.env[name];
  if (raw === undefined || raw.trim() === "") return fallback;
  const v = Number(raw);
  if (!Number.isFinite(v) || v < min) throw new ConfigError(name, `${JSON.stringify(raw)} is not a number >= ${min}`);
  return v;
}

function optNumber(name: string, value: unknown, fallback: number, min: number): number {
  if (value === undefined) return fallback;
  if (typeof value !== "number" || !Number.isFinite(value) || value < min) throw new ConfigError(name, `${JSON.stringify(value)} is not a number >= ${min}`);
  return value;
}

function errModeOf(value: unknown, what: string): "auto" | "peer" | "none" {
  if (value === undefined || value === "") return "auto";
  if (value === "auto" || value === "peer" || value === "none") return value;
  throw new ConfigError(what, `${JSON.stringify(value)} is not one of auto, peer, none`);
}

interface ProducedSlot {
  key: string;
  offset: number;
  length: number;
  ack: AckTicket;
  expiresAt: number;
}

let blobLogger: Logger | undefined;

class NixlUcxTransport implements KVTransport {
  readonly name = "nixl-ucx";
  readonly support = NIXL_UCX_SUPPORT;
  private closed = false;
  /** This endpoint's producer id (hex), published in every descriptor. */
  private readonly producerId = randomBytes(16).toString("hex");
  /** Pushed and not yet acked/released/expired, by key. */
  private readonly produced = new Map<string, ProducedSlot>();
  private producedBytes = 0;
  private expired = 0;
  /** Slots holding pulled arrays, per request id, freed by release(). */
  private readonly pulled = new Map<string, { eng: UcxEngine; offset: number }[]>();
  /** Engines pulls READ with, in turn: this endpoint's own first, then its extra read lanes. */
  private readonly readEngines: UcxEngine[];
  private nextLane = 0;
  private sweeper: NodeJS.Timeout | undefined;

  constructor(
    private readonly engine: UcxEngine,
    private readonly directory: DescriptorDirectory,
    private readonly ttlMs: number,
    private readonly logBlobs: boolean,
    readLanes: UcxEngine[],
  ) {
    this.readEngines = [engine, ...readLanes];
  }

  /** A slot for a pulled blob in the next read lane that has room; offset -1 when none has. */
  private allocateRead(length: number): { eng: UcxEngine; offset: number } {
    const n = this.readEngines.length;
    const first = this.nextLane++ % n;
    for (let i = 0; i < n; i++) {
      const eng = this.readEngines[(first + i) % n];
      const offset = eng.allocate(length);
      if (offset >= 0) return { eng, offset };
    }
    return { eng: this.readEngines[first], offset: -1 };
  }

  private checkOpen(): void {
    if (this.closed) throw new TransportError("nixl-ucx: this endpoint is closed; create a new one", "TRANSPORT_CLOSED");
  }

  async push(key: string, data: Uint8Array, options: PushOptions = {}): Promise<void> {
    this.checkOpen();
    validateKey(key);
    checkBlobSpec(this, options);
    if (!(data instanceof Uint8Array)) throw new TransportError(`nixl-ucx: push of ${key}: data must be a Uint8Array, got ${typeof data}`);
    const old = this.produced.get(key);
    if (old) this.freeProduced(old);
    const { offset, ack } = await this.reserve(key, data.byteLength, options.timeoutMs ?? DEFAULT_PUSH_TIMEOUT_MS);
    const slotView = this.engine.view(offset, data.byteLength);
    slotView.set(data);
    // The caller's CRC-32 when it has one (the consumer checks the bytes it READs against it).
    const crc = options.crc32 ?? kvCrc32(slotView);
    const slot: ProducedSlot = { key, offset, length: data.byteLength, ack, expiresAt: Date.now() + this.ttlMs };
    this.produced.set(key, slot);
    this.producedBytes += slot.length;
    this.armSweeper();
    if (this.logBlobs) this.logBlob("blob pushed", key, slotView, this.producerId);
    const descriptor = encodeDescriptor({
      producerId: this.producerId,
      workerAddress: this.engine.address,
      rkey: this.engine.rkey,
      remoteAddr: this.engine.addressOf(offset),
      length: data.byteLength,
      crc32: crc,
      ackAddr: ack.addr,
      ackValue: ack.value,
    });
    try {
      await this.directory.publish(key, descriptor, options.timeoutMs ?? DEFAULT_PUSH_TIMEOUT_MS);
    } catch (e) {
      if (this.produced.get(key) === slot) this.freeProduced(slot);
      throw e;
    }
  }

  /**
   * An arena slot and an ack word for a push, waiting up to `timeoutMs` for consumers' acks (or
   * releases, or expiry) to free room: that is the back-pressure on a prefill that outruns decode.
   */
  private async reserve(key: string, length: number, timeoutMs: number): Promise<{ offset: number; ack: AckTicket }> {
    const deadline = Date.now() + timeoutMs;
    for (;;) {
      this.checkOpen();
      this.sweep();
      const offset = this.engine.allocate(length);
      if (offset >= 0) {
        const ack = this.engine.takeAck();
        if (ack) return { offset, ack };
        this.engine.free(offset);
      }
      if (Date.now() >= deadline) {
        throw new TransportError(
          offset < 0
            ? `nixl-ucx: no room for ${length} bytes of ${key} in the ${this.engine.slotBytes}-byte UCX arena (largest free range ${this.engine.largestFree()}) ` +
                `after waiting ${timeoutMs} ms; release finished requests or raise AIRM_KV_UCX_POOL_MB`
            : `nixl-ucx: ${ACK_WORDS_PER_ENDPOINT} blobs are outstanding on this endpoint after waiting ${timeoutMs} ms; release finished requests`,
          "TRANSPORT_NO_SPACE",
        );
      }
      await new Promise((r) => setTimeout(r, Math.min(SWEEP_MS, Math.max(1, deadline - Date.now()))));
    }
  }

  async pull(key: string, options: PullOptions = {}): Promise<Uint8Array> {
    this.checkOpen();
    validateKey(key);
    checkBlobSpec(this, options);
    if (options.into !== undefined && !(options.into instanceof Uint8Array)) throw new TransportError(`nixl-ucx: pull of ${key}: \`into\` must be a Uint8Array`);
    const timeoutMs = options.timeoutMs ?? DEFAULT_PULL_TIMEOUT_MS;
    const deadline = Date.now() + timeoutMs;
    const raw = await this.directory.fetch(key, timeoutMs);
    const d = decodeDescriptor(raw, key);
    if (options.into && options.into.byteLength < d.length) {
      throw new TransportError(`nixl-ucx: pull of ${key}: \`into\` holds ${options.into.byteLength} bytes but the blob has ${d.length}`);
    }
    this.checkOpen();
    const { eng, offset } = this.allocateRead(d.length);
    if (offset < 0) {
      throw new TransportError(
        `nixl-ucx: no room for ${d.length} bytes of ${key} in this endpoint's UCX read arenas; release pulled requests or raise AIRM_KV_UCX_POOL_MB`,
        "TRANSPORT_NO_SPACE",
      );
    }
    if ((d.workerAddress[0] & 0x0f) !== (eng.address[0] & 0x0f)) {
      eng.free(offset);
      throw new TransportError(
        `nixl-ucx: the producer of ${key} packs UCX worker addresses in format ${d.workerAddress[0] & 0x0f}, this process in ${eng.address[0] & 0x0f}; ` +
          `run the same UCX version (this one is ${eng.version}) on both sides`,
      );
    }
    const peer: PeerRef = { id: d.producerId, address: d.workerAddress, rkey: d.rkey };
    const left = deadline - Date.now();
    if (left <= 0) {
      eng.free(offset);
      throw new TransportTimeoutError(`nixl-ucx: pull of ${key} ran out of its ${timeoutMs} ms before the READ could start`);
    }
    const read = eng.read(peer, d.remoteAddr, d.length, offset, left);
    let threadCrc: number | undefined;
    try {
      threadCrc = await read.done;
    } catch (e) {
      // The slot is reused only once UCX is certainly done with it.
      void read.settled.then((stuck) => {
        if (!stuck) eng.free(offset);
      });
      const why = isAirmError(e) ? e.message : String(e);
      if (isAirmError(e, "TRANSPORT_TIMEOUT")) throw new TransportTimeoutError(`pull of ${key}: ${why}`);
      throw new TransportError(`pull of ${key}: ${why}`, isAirmError(e, "TRANSPORT_CLOSED") ? "TRANSPORT_CLOSED" : "TRANSPORT_ERROR", { cause: e });
    }
    if (this.closed) {
      eng.free(offset);
      throw new TransportError(`nixl-ucx: pull of ${key}: the endpoint was closed during the READ`, "TRANSPORT_CLOSED");
    }
    const view = eng.view(offset, d.length);
    const got = threadCrc ?? kvCrc32(view);
    eng.ack(peer, d.ackAddr, d.ackValue);
    if (got !== d.crc32) {
      eng.free(offset);
      throw new TransportError(
        `nixl-ucx: blob ${key} READ from producer ${d.producerId.slice(0, 8)} has CRC-32 0x${got.toString(16)} but was published with 0x${d.crc32.toString(16)}: ` +
          `the bytes were damaged or the slot was reused; they were not returned. Re-run the request.`,
        "KV_INTEGRITY",
      );
    }
    if (this.logBlobs) this.logBlob("blob pulled", key, view, d.producerId);
    if (options.into) {
      options.into.set(view);
      eng.free(offset);
      return options.into.subarray(0, d.length);
    }
    const rid = requestIdOf(key);
    const list = this.pulled.get(rid);
    if (list) list.push({ eng, offset });
    else this.pulled.set(rid, [{ eng, offset }]);
    // `got` was measured over these very bytes (a copy into `into` above is not noted).
    noteBlobCrc32(view, got);
    return view;
  }

  async release(requestId: string): Promise<void> {
    this.checkOpen();
    validateRequestId(requestId);
    for (const slot of [...this.produced.values()]) if (requestIdOf(slot.key) === requestId) this.freeProduced(slot);
    const mine = this.pulled.get(requestId);
    if (mine) {
      this.pulled.delete(requestId);
      for (const { eng, offset } of mine) eng.free(offset);
    }
    await this.directory.release(requestId);
  }

  stats(): TransportStats {
    this.sweep();
    return { blobs: this.produced.size, bytes: this.producedBytes, expired: this.expired };
  }

  async close(): Promise<void> {
    if (this.closed) return;
    this.closed = true;
    if (this.sweeper) clearInterval(this.sweeper);
    for (const slot of [...this.produced.values()]) this.freeProduced(slot);
    for (const list of this.pulled.values()) for (const { eng, offset } of list) eng.free(offset);
    this.pulled.clear();
    for (const e of this.readEngines) releaseEngine(e);
    await this.directory.close();
  }

  private freeProduced(slot: ProducedSlot): void {
    if (this.produced.get(slot.key) !== slot) return;
    this.produced.delete(slot.key);
    this.producedBytes -= slot.length;
    this.engine.free(slot.offset);
    this.engine.returnAck(slot.ack);
  }

  /** Frees slots whose consumer acked, and unread slots past their TTL. */
  private sweep(): void {
    if (this.produced.size === 0) return;
    const now = Date.now();
    for (const slot of [...this.produced.values()]) {
      if (this.engine.acked(slot.ack)) this.freeProduced(slot);
      else if (now >= slot.expiresAt) {
        this.freeProduced(slot);
        this.expired++;
      }
    }
  }

  private armSweeper(): void {
    if (this.sweeper) return;
    this.sweeper = setInterval(() => {
      this.sweep();
      if (this.produced.size === 0) {
        clearInterval(this.sweeper);
        this.sweeper = undefined;
      }
    }, SWEEP_MS);
    this.sweeper.unref();
  }

  private logBlob(what: string, key: string, bytes: Uint8Array, producerId: string): void {
    blobLogger ??= pino({ name: "airm-kv-nixl-ucx", base: undefined }, pino.destination(2));
    const sha256 = createHash("sha256").update(bytes).digest("hex");
    blobLogger.info({ key, bytes: bytes.byteLength, sha256, producer: producerId.slice(0, 8) }, what);
  }
}

/**
 * Opens a nixl-ucx endpoint: starts (or reuses) a UCX progress thread with its registered arena
 * and connects to the descriptor relay lazily. Throws ConfigError for bad options or variables,
 * TransportError when UCX cannot start (missing libucp, bad UCX_TLS, arena too large).
 */
export async function createNixlUcxTransport(options: NixlUcxOptions = {}): Promise<KVTransport> {
  const poolMb = optNumber("poolMb", options.poolMb, envNumber("AIRM_KV_UCX_POOL_MB", DEFAULT_POOL_MB, 1), 1);
  const ttlS = optNumber("ttlS", options.ttlS, envNumber("AIRM_KV_TCP_TTL_S", DEFAULT_TTL_S, 0), 0);
  const spinMs = optNumber("spinMs", options.spinMs, 2, 0);
  const readLanes = optNumber("readLanes", options.readLanes, envNumber("AIRM_KV_UCX_READ_LANES", DEFAULT_READ_LANES, 1), 1);
  if (!Number.isInteger(readLanes) || readLanes > 8) throw new ConfigError("readLanes", `${readLanes} is not a whole number from 1 to 8 (AIRM_KV_UCX_READ_LANES)`);
  const errMode = options.errMode !== undefined ? errModeOf(options.errMode, "errMode") : errModeOf(process.env.AIRM_KV_UCX_ERR_MODE, "AIRM_KV_UCX_ERR_MODE");
  const logRaw = process.env.AIRM_KV_UCX_LOG;
  const log = options.log ?? (logRaw !== undefined && ["1", "true", "yes", "on"].includes(logRaw.trim().toLowerCase()));
  const directory = options.directory ?? relayDirectory(options.addr);
  const config = { poolBytes: Math.round(poolMb * 1024 * 1024), tls: options.tls, errMode, spinMs };
  // The lanes start side by side (each is a thread bringing up its own UCX context).
  const started = await Promise.allSettled(Array.from({ length: readLanes }, () => acquireEngine(config)));
  const engines = started.flatMap((r) => (r.status === "fulfilled" ? [r.value] : []));
  const failed = started.find((r): r is PromiseRejectedResult => r.status === "rejected");
  if (failed) {
    for (const engine of engines) releaseEngine(engine);
    await directory.close();
    throw failed.reason;
  }
  return new NixlUcxTransport(engines[0], directory, ttlS * 1000, log, engines.slice(1));
}
