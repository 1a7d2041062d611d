// @airm/kv-shm: the `shm` KV transport plugin (airm.kv_transports) and its conformance fixture.
// Same-host host-DRAM staging through /dev/shm; the mechanics are in shm-transport.ts.

import { rmSync } from "node:fs";
import type { ConformanceFixture, KVTransport, KVTransportPlugin } from "@airm/rm-core";
import { SHM_CONFIG, shmSettings } from "./shm-config.ts";
import { ShmTransport, SHM_SUPPORT } from "./shm-transport.ts";

export { ShmTransport, SHM_SUPPORT, type ShmSettings } from "./shm-transport.ts";
export { SHM_CONFIG, shmSettings, DEFAULT_TTL_S, DEFAULT_SLAB_MB, type ShmOptions } from "./shm-config.ts";
export { DEFAULT_SHM_ROOT, sweepLeftovers, linkPathOf, parseTarget } from "./shm-layout.ts";

export const shmTransport: KVTransportPlugin<typeof SHM_CONFIG.options> = {
  kind: "kv_transport",
  name: "shm",
  support: SHM_SUPPORT,
  config: SHM_CONFIG,
  /** Opens an endpoint on the shm root. Throws ConfigError, TransportError. */
  async create(options): Promise<KVTransport> {
    return ShmTransport.open(shmSettings(options));
  },
  /** Endpoints on a dedicated folder next to the serving root, removed at teardown. */
  async conformance(env = {}): Promise<ConformanceFixture> {
    const base = shmSettings(SHM_CONFIG.resolve({ env }));
    const root = `${base.root}-conformance-${process.pid}`;
    const open: ShmTransport[] = [];
    return {
      async factory() {
        const t = ShmTransport.open({ ...base, root, slabBytes: 32 * 1024 * 1024 });
        open.push(t);
        return t;
      },
      async teardown() {
        await Promise.allSettled(open.map((t) => t.close()));
        rmSync(root, { recursive: true, force: true });
      },
    };
  },
};
