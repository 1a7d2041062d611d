// Endpoint options and variables: bad values are ConfigErrors naming the key; a UCX_TLS that
// matches nothing on this host is a TransportError from UCX start-up; what the host would use.
import { afterAll, describe, expect, test } from "vitest";
import { isAirmError } from "@airm/rm-core";
import { Registry, selectTransport } from "@airm/rm-core";
import { createNixlUcxTransport, nixlUcxTransport, shutdownEngines, ucxHostInfo } from "../src/index.ts";

afterAll(() => shutdownEngines());

async function failure(p: Promise<unknown>): Promise<unknown> {
  return p.then(
    () => undefined,
    (e: unknown) => e,
  );
}

describe("endpoint configuration", () => {
  test("bad option values are ConfigErrors naming the option", async () => {
    for (const [opts, key] of [
      [{ poolMb: 0 }, "poolMb"],
      [{ poolMb: "big" }, "poolMb"],
      [{ ttlS: -1 }, "ttlS"],
      [{ errMode: "sometimes" }, "errMode"],
      [{ readLanes: 0 }, "readLanes"],
      [{ readLanes: 1.5 }, "readLanes"],
      [{ readLanes: 9 }, "readLanes"],
    ] as const) {
      const e = await failure(createNixlUcxTransport({ addr: "127.0.0.1:1", ...(opts as object) }));
      expect(isAirmError(e, "CONFIG"), String(e)).toBe(true);
      expect((e as { key: string }).key).toBe(key);
    }
  });

  test("a bad AIRM_KV_UCX_POOL_MB is a ConfigError naming the variable, through the plugin as a worker opens it", async () => {
    const r = new Registry({ discover: false });
    r.register("airm.kv_transports", nixlUcxTransport);
    const e = await failure(selectTransport({ registry: r, name: "nixl-ucx", env: { AIRM_KV_UCX_POOL_MB: "lots", AIRM_KV_TCP_ADDR: "127.0.0.1:1" } }));
    expect(isAirmError(e, "CONFIG")).toBe(true);
    expect((e as { key: string }).key).toBe("AIRM_KV_UCX_POOL_MB");
  });

  test("a UCX_TLS naming no transport of this host fails start-up with a TransportError", async () => {
    const e = await failure(createNixlUcxTransport({ addr: "127.0.0.1:1", tls: "no_such_transport", poolMb: 4 }));
    expect(isAirmError(e, "TRANSPORT_ERROR"), String(e)).toBe(true);
    expect((e as Error).message).toMatch(/UCX did not start/);
  });

  test("host info reports the version and the resources for a given UCX_TLS", () => {
    const tcp = ucxHostInfo({ tls: "tcp" });
    expect(tcp.version).toMatch(/^\d+\.\d+\.\d+/);
    expect(tcp.transports).toEqual(["tcp"]);
    expect(tcp.devices).toContain("lo");
    expect(tcp.errMode).toBe("peer");
    const shm = ucxHostInfo({ tls: "posix,self" });
    expect(shm.transports.sort()).toEqual(["posix", "self"]);
    expect(shm.errMode).toBe("none");
    expect(shm.workerAddressBytes).toBeGreaterThan(0);
  });
});
