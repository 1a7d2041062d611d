// @airm/kv-nixl-ucx: the `nixl-ucx` KV transport (one-sided UCX READs from a registered arena,
// descriptors in the KV relay of @airm/kv-relay) and what this host's UCX would use.
import { startRelay } from "@airm/kv-relay";
import type { ConformanceFixture, KVTransportPlugin } from "@airm/rm-core";
import { NIXL_UCX_CONFIG, NIXL_UCX_SUPPORT, createNixlUcxTransport, type NixlUcxOptions } from "./nixl-ucx-transport.ts";

export { NIXL_UCX_SUPPORT, NIXL_UCX_CONFIG, createNixlUcxTransport, DEFAULT_POOL_MB, DEFAULT_TTL_S, type NixlUcxOptions } from "./nixl-ucx-transport.ts";
export { relayDirectory, type DescriptorDirectory } from "./descriptor-directory.ts";
export { encodeDescriptor, decodeDescriptor, type BlobDescriptor } from "./blob-descriptor.ts";
export { shutdownEngines } from "./ucx-engine.ts";
export { ucxHostInfo, type UcxHostInfo } from "./ucx-host-info.ts";

/** Arena per endpoint in the conformance fixture: the 64 x 1 MiB case plus headroom. */
const CONFORMANCE_POOL_MB = 80;

/**
 * The conformance set-up: an in-process relay on a free loopback port plus endpoints with small
 * arenas, configured from `env` and then `extra` (e.g. `tls` to pick the wire for these endpoints).
 */
export async function nixlUcxConformance(extra: Partial<NixlUcxOptions> = {}, env: Record<string, string | undefined> = {}): Promise<ConformanceFixture> {
  const o = NIXL_UCX_CONFIG.resolve({ env, options: { poolMb: CONFORMANCE_POOL_MB, ...extra } });
  const relay = await startRelay({ host: "127.0.0.1", port: 0, maxBytes: 64 * 1024 * 1024 });
  return {
    factory: () => createNixlUcxTransport({ ...o, addr: relay.address }),
    teardown: () => relay.close(),
  };
}

export const nixlUcxTransport: KVTransportPlugin<typeof NIXL_UCX_CONFIG.options> = {
  kind: "kv_transport",
  name: "nixl-ucx",
  support: NIXL_UCX_SUPPORT,
  config: NIXL_UCX_CONFIG,
  create: (options) => createNixlUcxTransport(options),
  conformance: (env = {}) => nixlUcxConformance({}, env),
};
