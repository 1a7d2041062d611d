// The airm-gateway command line as a process: a gateway that cannot listen (its port taken, as
// when an old pod on the same address still drains) exits 2 with the reason, instead of staying
// alive on its probe timers without serving (a pod that never became ready).
import { spawnSync } from "node:child_process";
import { createServer, type AddressInfo } from "node:net";
import { fileURLToPath } from "node:url";
import { describe, expect, it } from "vitest";

const BIN = fileURLToPath(new URL("../bin/airm-gateway.mjs", import.meta.url));

describe("airm-gateway CLI", () => {
  it("exits 2 naming the address when its port is taken", async () => {
    const taken = createServer();
    await new Promise<void>((r) => taken.listen(0, "127.0.0.1", r));
    const port = (taken.address() as AddressInfo).port;
    try {
      const r = spawnSync(process.execPath, [BIN, "--port", String(port), "--prefill", "http://127.0.0.1:9", "--decode", "http://127.0.0.1:9"], {
        encoding: "utf8",
        env: { ...process.env, AIRM_METRICS_PORT: "" },
        timeout: 60_000,
      });
      expect([r.status, r.signal, r.stderr]).toEqual([2, null, expect.stringContaining(`EADDRINUSE: address already in use 127.0.0.1:${port}`)]);
    } finally {
      taken.close();
    }
  });
});
