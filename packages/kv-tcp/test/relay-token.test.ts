// The tcp transport presents AIRM_INTERNAL_TOKEN to a relay that asks for it: taken from the same
// environment as its other variables, as a worker opens it (selectTransport with its env).
import { startRelay, type Relay } from "@airm/kv-relay";
import { Registry, blobKey, isAirmError, newInternalToken, patternBytes, selectTransport } from "@airm/rm-core";
import { afterAll, beforeAll, expect, test } from "vitest";
import { tcpTransport } from "../src/index.ts";

const TOKEN = newInternalToken();
let relay: Relay;
const registry = new Registry({ discover: false });
registry.register("airm.kv_transports", tcpTransport);

beforeAll(async () => {
  relay = await startRelay({ host: "127.0.0.1", port: 0, token: TOKEN });
});
afterAll(() => relay.close());

test("with AIRM_INTERNAL_TOKEN in its env the transport is served; without it, refused with a TransportError naming the variable", async () => {
  const good = await selectTransport({ registry, name: "tcp", env: { AIRM_KV_TCP_ADDR: relay.address, AIRM_INTERNAL_TOKEN: TOKEN } });
  const anon = await selectTransport({ registry, name: "tcp", env: { AIRM_KV_TCP_ADDR: relay.address } });
  try {
    const key = blobKey("tok-tcp", 0, "k");
    await good.push(key, patternBytes(1, 100_000));
    expect(Buffer.from((await good.pull(key)).bytes).equals(patternBytes(1, 100_000))).toBe(true);
    const e = await anon.pull(key, { timeoutMs: 1000 }).then(
      () => undefined,
      (err: Error) => err,
    );
    expect(isAirmError(e, "TRANSPORT_ERROR"), String(e)).toBe(true);
    expect((e as Error).message).toMatch(/AIRM_INTERNAL_TOKEN is missing or differs from the relay's/);
  } finally {
    await good.close();
    await anon.close();
  }
});
