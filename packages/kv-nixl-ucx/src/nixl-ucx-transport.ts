// The `nixl-ucx` KV transport: push copies a blob into this endpoint's registered UCX arena and
// publishes its descriptor in the relay under the blob's key; pull waits for the descriptor,
// READs the bytes with ucp_get_nbx into its own arena, checks the CRC-32 and acks the producer,
// whose slot is then freed; pulls take turns over its read lanes (one UCX engine each). The UCX
// calls and the progress threads live in ucx-engine.ts.

import { createHash, randomBytes } from "node:crypto";
import { pino, type Logger } from "pino";
import { RELAY_CLIENT_CONFIG } from "@airm/kv-relay";
import {
  DEFAULT_PULL_TIMEOUT_MS,
  TransportError,
  TransportTimeoutError,
  checkBlobSpec,
  hostStagingSupport,
  defineConfig,
  flag,
  int,
  isAirmError,
  kvCrc32,
  tlsMaterialOf,
  num,
  oneOf,
  opt,
  requestIdOf,
  text,
  validateKey,
  validateRequestId,
  type ConfigValues,
  type KVTransport,
  type PulledBlob,
  type PullOptions,
  type PushOptions,
  type TransportStats,
  type TransportSupport,
} from "@airm/rm-core";
import { decodeDescriptor, encodeDescriptor } from "./blob-descriptor.ts";
import { relayDirectory, type DescriptorDirectory } from "./descriptor-directory.ts";
import { ACK_WORDS_PER_ENDPOINT, acquireEngine, releaseEngine, type AckTicket, type UcxEngine } from "./ucx-engine.ts";
import type { PeerRef } from "./ucx-thread-protocol.ts";

export const NIXL_UCX_SUPPORT: TransportSupport = hostStagingSupport(["same-host", "cross-node"]);

export const DEFAULT_POOL_MB = 1024;
export const DEFAULT_TTL_S = 300;
export const DEFAULT_READ_LANES = 2;
const DEFAULT_PUSH_TIMEOUT_MS = 30_000;
/** How often outstanding slots are checked for acks and expiry (ms). */
const SWEEP_MS = 20;

/** create()'s options and their variables (UCX itself reads UCX_*: UCX_TLS picks the wire). */
export const NIXL_UCX_CONFIG = defineConfig("@airm/kv-nixl-ucx", {
  poolMb: opt(num({ min: 1 }), {
    env: "AIRM_KV_UCX_POOL_MB",
    default: DEFAULT_POOL_MB,
    doc: "Registered arena per endpoint in MiB; bounds the bytes pushed and not yet read, and the pulled arrays held until release.",
  }),
  ttlS: opt(num({ min: 0 }), {
    env: "AIRM_KV_TCP_TTL_S",
    default: DEFAULT_TTL_S,
    doc: "Seconds an unread pushed slot lives before it is freed and counted (the relay's blob lifetime for tcp).",
  }),
  log: opt(flag(), { env: "AIRM_KV_UCX_LOG", default: false, doc: "1 logs size and SHA-256 of every blob pushed or pulled (audits only: costs ~0.7 ms per MiB)." }),
  readLanes: opt(int({ min: 1, max: 8 }), {
    env: "AIRM_KV_UCX_READ_LANES",
    default: DEFAULT_READ_LANES,
    doc: "UCX workers a consumer READs through in turn, each with its own progress thread and arena; over shared memory each copies and checks on its own core.",
  }),
  errMode: opt(oneOf(["auto", "peer", "none"] as const), {
    env: "AIRM_KV_UCX_ERR_MODE",
    default: "auto",
    doc: "UCX endpoint error handling: auto = peer unless a shared-memory transport is enabled (UCX 1.13 shm has no peer-failure support).",
  }),
  tls: opt(text({ label: "UCX_TLS list" }), { defaultText: "the environment's UCX_TLS", doc: "UCX_TLS for this endpoint only (tests that compare wires in one process)." }),
  spinMs: opt(num({ min: 0 }), { default: 2, doc: "Polling window after the last UCX activity before a progress thread sleeps (ms)." }),
}).with(RELAY_CLIENT_CONFIG);

export type NixlUcxOptions = ConfigValues<typeof NIXL_UCX_CONFIG.options>;

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

  async pull(key: string, options: PullOptions = {}): Promise<PulledBlob> {
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
    const readStart = performance.now();
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
    const transfer = { startMs: readStart, endMs: performance.now() };
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
      // `got` was measured over the arena's bytes, not over this copy.
      return { bytes: options.into.subarray(0, d.length), crc32: null, transfer };
    }
    const rid = requestIdOf(key);
    const list = this.pulled.get(rid);
    if (list) list.push({ eng, offset });
    else this.pulled.set(rid, [{ eng, offset }]);
    // `got` was measured over these very bytes.
    return { bytes: view, crc32: got, transfer };
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
 * Opens a nixl-ucx endpoint: starts (or reuses) UCX progress threads with their registered arenas
 * and connects to the descriptor relay lazily. `options` are NIXL_UCX_CONFIG's (unset ones take
 * their defaults); `directory` replaces the relay (tests of the UCX layer alone). Throws
 * ConfigError for a bad option, TransportError when UCX cannot start (missing libucp, bad
 * UCX_TLS, arena too large).
 */
export async function createNixlUcxTransport(options: Partial<NixlUcxOptions> = {}, directory?: DescriptorDirectory): Promise<KVTransport> {
  const o = NIXL_UCX_CONFIG.resolve({ options });
  const dir = directory ?? relayDirectory(o.addr, { token: o.internalToken, tls: tlsMaterialOf(o.tlsDir, { reloadS: o.tlsReloadS }) });
  const config = { poolBytes: Math.round(o.poolMb * 1024 * 1024), tls: o.tls, errMode: o.errMode, spinMs: o.spinMs };
  // The lanes start side by side (each is a thread bringing up its own UCX context).
  const started = await Promise.allSettled(Array.from({ length: o.readLanes }, () => acquireEngine(config)));
  const engines = started.flatMap((r) => (r.status === "fulfilled" ? [r.value] : []));
  const failed = started.find((r): r is PromiseRejectedResult => r.status === "rejected");
  if (failed) {
    for (const engine of engines) releaseEngine(engine);
    await dir.close();
    throw failed.reason;
  }
  return new NixlUcxTransport(engines[0], dir, o.ttlS * 1000, o.log, engines.slice(1));
}
