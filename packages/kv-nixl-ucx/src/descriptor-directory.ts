// Where producers publish blob descriptors and consumers wait for them: the kv-tcp relay
// (AIRM_KV_TCP_ADDR), with each descriptor stored under its blob's key. Only small descriptors
// cross it; the blob bytes travel over UCX.

import { createTcpTransport } from "@airm/kv-tcp";
import type { KVTransport } from "@airm/rm-core";

/** Publish/fetch/release of descriptors by blob key. */
export interface DescriptorDirectory {
  readonly address: string;
  publish(key: string, descriptor: Uint8Array, timeoutMs: number): Promise<void>;
  /** The descriptor under `key`, waiting up to `timeoutMs`. Throws TransportTimeoutError. */
  fetch(key: string, timeoutMs: number): Promise<Uint8Array>;
  release(requestId: string): Promise<void>;
  close(): Promise<void>;
}

/** A directory in the kv-tcp relay at `addr` ("host:port"; undefined = AIRM_KV_TCP_ADDR). */
export function relayDirectory(addr?: string): DescriptorDirectory {
  // One connection: a burst of descriptor fetches then comes back in one batch.
  const relay: KVTransport & { readonly address: string } = createTcpTransport({ addr, connections: 1 });
  return {
    address: relay.address,
    publish: (key, descriptor, timeoutMs) => relay.push(key, descriptor, { timeoutMs }),
    fetch: (key, timeoutMs) => relay.pull(key, { timeoutMs }),
    release: (requestId) => relay.release(requestId),
    close: () => relay.close(),
  };
}
