// @airm/kv-nixl: the `nixl` KV transport over a real NIXL agent (PyPI wheels) in a per-host
// sidecar driven over gRPC, shared-memory arenas registered once, the seed's route table.
import { existsSync } from "node:fs";
import { FencedTransport, type ConformanceFixture, type KVTransportPlugin } from "@airm/rm-core";
import { NIXL_CONFIG, NIXL_SUPPORT, NixlCopyTransport, type NixlOptions } from "./nixl-transport.ts";
import { defaultNixlPython } from "./python-agent.ts";
import { SIDECAR_CONFIG } from "./sidecar-cli.ts";
import { startSidecar } from "./sidecar.ts";

export { NIXL_CONFIG, NIXL_SUPPORT, NixlCopyTransport, DEFAULT_NIXL_ADDR, type NixlOptions } from "./nixl-transport.ts";
export { ROUTES, TIERS, routeFor, type Route, type Tier } from "./routes.ts";
export { startSidecar, type Sidecar, type SidecarOptions } from "./sidecar.ts";
export { PythonAgent, NIXL_VERSION, defaultNixlPython, AGENT_SCRIPT } from "./python-agent.ts";
export { SIDECAR_CONFIG } from "./sidecar-cli.ts";
export { Arena, sweepArenas } from "./arena.ts";
export { sendFds, memfdWith, closeFd } from "./fd-passing.ts";
export { NixlAgentClient, type Allocation, type AgentHealth } from "./agent-client.ts";

/** The endpoint a worker uses: the copy-only transport behind rm-core's FencedTransport. */
export async function createNixlTransport(o: NixlOptions): Promise<FencedTransport> {
  return new FencedTransport(await NixlCopyTransport.open(o));
}

/** Arena per endpoint in the conformance fixture: the 64 x 1 MiB case plus headroom. */
const CONFORMANCE_POOL_MB = 160;

/**
 * The conformance set-up: a sidecar (with its Python NIXL agent) in this process on a free
 * loopback port, and endpoints with their own arenas. Skipped, with the reason, when the NIXL
 * wheels are not installed.
 */
export async function nixlConformance(env: Record<string, string | undefined> = {}): Promise<ConformanceFixture> {
  const python = SIDECAR_CONFIG.resolve({ env }).python ?? defaultNixlPython();
  if (!existsSync(python)) {
    return {
      skip: `the NIXL wheels are not installed (no ${python}); run scripts/tools/nixl.sh`,
      factory: () => Promise.reject(new Error("skipped")),
      teardown: async () => undefined,
    };
  }
  const sidecar = await startSidecar({ listen: "127.0.0.1:0", python, env });
  const o = NIXL_CONFIG.resolve({ env, options: { addr: sidecar.address, poolMb: CONFORMANCE_POOL_MB } });
  return {
    factory: () => createNixlTransport(o),
    teardown: () => sidecar.close(),
  };
}

export const nixlTransport: KVTransportPlugin<typeof NIXL_CONFIG.options> = {
  kind: "kv_transport",
  name: "nixl",
  support: NIXL_SUPPORT,
  config: NIXL_CONFIG,
  create: (options) => createNixlTransport(options),
  conformance: (env = {}) => nixlConformance(env),
};
