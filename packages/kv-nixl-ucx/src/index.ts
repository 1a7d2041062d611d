// @airm/kv-nixl-ucx: the `nixl-ucx` KV transport (one-sided UCX READs from a registered arena,
// descriptors in the kv-tcp relay) and what this host's UCX would use.
import { startRelay } from "@airm/kv-tcp";
import type { ConformanceFixture, KVTransportPlugin } from "@airm/rm-core";
import { NIXL_UCX_SUPPORT, createNixlUcxTransport, type NixlUcxOptions } from "./nixl-ucx-transport.ts";

export { NIXL_UCX_SUPPORT, createNixlUcxTransport, ENV_VARS, DEFAULT_POOL_MB, DEFAULT_TTL_S, type NixlUcxOptions } from "./nixl-ucx-transport.ts";
export { relayDirectory, type DescriptorDirectory } from "./descriptor-directory.ts";
export { encodeDescriptor, decodeDescriptor, type BlobDescriptor } from "./blob-descriptor.ts";
export { shutdownEngines } from "./ucx-engine.ts";
export { ucxHostInfo, type UcxHostInfo } from "./ucx-host-info.ts";

/** Arena per endpoint in the conformance fixture: the 64 x 1 MiB case plus headroom. */
const CONFORMANCE_POOL_MB = 80;

/**
 * The conformance set-up: an in-process kv-tcp relay on a free loopback port plus endpoints with
 * small arenas. `tls` overrides UCX_TLS for these endpoints (default: the environment's).
 */
export async function nixlUcxConformance(extra: Omit<NixlUcxOptions, "addr" | "directory"> = {}): Promise<ConformanceFixture> {
  const relay = await startRelay({ host: "127.0.0.1", port: 0, maxBytes: 64 * 1024 * 1024 });
  return {
    factory: () => createNixlUcxTransport({ poolMb: CONFORMANCE_POOL_MB, ...extra, addr: relay.address }),
    teardown: () => relay.close(),
  };
}

export const nixlUcxTransport: KVTransportPlugin = {
  kind: "kv_transport",
  name: "nixl-ucx",
  support: NIXL_UCX_SUPPORT,
  create: (options: Record<string, unknown> = {}) => createNixlUcxTransport(options as NixlUcxOptions),
  conformance: () => nixlUcxConformance(),
};
