// The `tcp` KV transport: push/pull/release of named blobs through an airm-kv-relay (the relay
// client of @airm/kv-relay), the blob spec and key checks every transport runs, per-blob audit
// logging, and local accounting for stats(). CRC-32s are computed (or taken from the caller) on
// push and measured on arrival on pull, and the measured value is returned with the bytes. With
// AIRM_TLS_DIR every connection to the relay is mutual TLS.

import { createHash } from "node:crypto";
import {
  ConfigError,
  TransportError,
  checkBlobSpec,
  hostStagingSupport,
  defineConfig,
  flag,
  int,
  opt,
  requestIdOf,
  tlsMaterialOf,
  validateKey,
  validateRequestId,
  type ConfigValues,
  type ConformanceFixture,
  type KVTransport,
  type KVTransportPlugin,
  type PulledBlob,
  type PullOptions,
  type PushOptions,
  type TransportStats,
  type TransportSupport,
} from "@airm/rm-core";
import { RELAY_CLIENT_CONFIG, RelayClient, parseHostPort, startRelay } from "@airm/kv-relay";
import { pino, type Logger } from "pino";

export const TCP_SUPPORT: TransportSupport = hostStagingSupport(["same-host", "cross-node"]);

/** create()'s options: the relay's address, CRC and audit switches, connections per process. */
export const TCP_CONFIG = defineConfig("@airm/kv-tcp", {
  crc: opt(flag(), { env: "AIRM_KV_TCP_CRC", default: true, doc: "0 skips the per-blob CRC-32 (computed by the pusher, checked by the relay and the receiver)." }),
  log: opt(flag(), { env: "AIRM_KV_TCP_LOG", default: false, doc: "1 logs size and SHA-256 of every blob pushed or pulled (costly: audits only)." }),
  connections: opt(int({ min: 1, max: 64 }), { default: 2, doc: "Connections per relay address in this process (more did not help on loopback)." }),
}).with(RELAY_CLIENT_CONFIG);

export type TcpOptions = ConfigValues<typeof TCP_CONFIG.options>;

let blobLogger: Logger | undefined;

class TcpTransport implements KVTransport {
  readonly name = "tcp";
  readonly support = TCP_SUPPORT;
  private closed = false;
  private readonly client: RelayClient;
  /** Bytes pushed by this endpoint and not yet released, per request and key. */
  private readonly held = new Map<string, Map<string, number>>();
  private heldBlobs = 0;
  private heldBytes = 0;
  private relayExpired = 0;

  constructor(
    host: string,
    port: number,
    private readonly o: TcpOptions,
  ) {
    this.client = new RelayClient(host, port, { crc: o.crc, connections: o.connections, token: o.internalToken, tls: tlsMaterialOf(o.tlsDir, { reloadS: o.tlsReloadS }) });
  }

  get address(): string {
    return this.client.address;
  }

  async push(key: string, data: Uint8Array, options: PushOptions = {}): Promise<void> {
    this.checkOpen();
    validateKey(key);
    checkBlobSpec(this, options);
    if (!(data instanceof Uint8Array)) throw new TransportError(`push of ${key}: data must be a Uint8Array, got ${typeof data}`);
    if (this.o.log) this.logBlob("blob pushed", key, data);
    const { relayExpired } = await this.client.push(key, data, { timeoutMs: options.timeoutMs, crc32: options.crc32 });
    this.relayExpired = relayExpired;
    this.account(key, data.byteLength);
  }

  async pull(key: string, options: PullOptions = {}): Promise<PulledBlob> {
    this.checkOpen();
    validateKey(key);
    checkBlobSpec(this, options);
    if (options.into !== undefined && !(options.into instanceof Uint8Array)) throw new TransportError(`pull of ${key}: \`into\` must be a Uint8Array`);
    const blob = await this.client.pull(key, { timeoutMs: options.timeoutMs, into: options.into });
    if (this.o.log) this.logBlob("blob pulled", key, blob.bytes);
    return blob;
  }

  async release(requestId: string): Promise<void> {
    this.checkOpen();
    validateRequestId(requestId);
    await this.client.release(requestId);
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
    this.client.close(new TransportError(`tcp transport to ${this.address} was closed while this call was in flight`, "TRANSPORT_CLOSED"));
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

  private logBlob(what: string, key: string, data: Uint8Array): void {
    blobLogger ??= pino({ name: "airm-kv-tcp", base: undefined }, pino.destination(2));
    const sha256 = createHash("sha256").update(data).digest("hex");
    blobLogger.info({ key, bytes: data.byteLength, sha256, relay: this.address }, what);
  }
}

/**
 * Opens a tcp transport endpoint (no connection is made until the first call). `options` are
 * TCP_CONFIG's; unset ones take their defaults (hosts resolve them from the environment through
 * the plugin). Throws ConfigError for a bad address or option, or a TLS folder (tlsDir,
 * AIRM_TLS_DIR) with a file missing or unusable.
 */
export function createTcpTransport(options: Partial<TcpOptions> = {}): KVTransport & { readonly address: string } {
  const o = TCP_CONFIG.resolve({ options });
  const { host, port } = parseHostPort(o.addr, "addr");
  if (port === 0) throw new ConfigError("addr", "port 0 is not a relay address: give the port the relay listens on (AIRM_KV_TCP_ADDR)");
  return new TcpTransport(host, port, o);
}

export const tcpTransport: KVTransportPlugin<typeof TCP_CONFIG.options> = {
  kind: "kv_transport",
  name: "tcp",
  support: TCP_SUPPORT,
  config: TCP_CONFIG,
  async create(options) {
    return createTcpTransport(options);
  },
  /** An in-process relay on a free loopback port, closed by teardown. */
  async conformance(env = {}): Promise<ConformanceFixture> {
    const o = TCP_CONFIG.resolve({ env });
    const relay = await startRelay({ host: "127.0.0.1", port: 0, maxBytes: 512 * 1024 * 1024, crc: true, log: false });
    return {
      factory: async () => createTcpTransport({ ...o, addr: relay.address }),
      teardown: () => relay.close(),
    };
  },
};
