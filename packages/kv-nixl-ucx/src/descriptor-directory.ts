// Where producers publish blob descriptors and consumers wait for them: the KV relay
// (AIRM_KV_TCP_ADDR, @airm/kv-relay's client), with each descriptor stored under its blob's key.
// Only small descriptors cross it; the blob bytes travel over UCX.

import { RelayClient } from "@airm/kv-relay";
import type { TlsMaterial } from "@airm/rm-core";

/** Publish/fetch/release of descriptors by blob key. */
export interface DescriptorDirectory {
  readonly address: string;
  publish(key: string, descriptor: Uint8Array, timeoutMs: number): Promise<void>;
  /** The descriptor under `key`, waiting up to `timeoutMs`. Throws TransportTimeoutError. */
  fetch(key: string, timeoutMs: number): Promise<Uint8Array>;
  release(requestId: string): Promise<void>;
  close(): Promise<void>;
}

/**
 * A directory in the relay at `addr` ("host:port"); `token` is the deployment's AIRM_INTERNAL_TOKEN,
 * presented to the relay, `tls` its AIRM_TLS_DIR material (the relay is then reached over mutual TLS).
 */
export function relayDirectory(addr: string, options: { token?: string; tls?: TlsMaterial } = {}): DescriptorDirectory {
  // One connection: a burst of descriptor fetches then comes back in one batch.
  const relay = RelayClient.connect(addr, { connections: 1, token: options.token, tls: options.tls });
  return {
    address: relay.address,
    publish: async (key, descriptor, timeoutMs) => {
      await relay.push(key, descriptor, { timeoutMs });
    },
    fetch: async (key, timeoutMs) => (await relay.pull(key, { timeoutMs })).bytes,
    release: (requestId) => relay.release(requestId),
    close: async () => relay.close(),
  };
}
