// nixl-ucx's descriptor directory presents AIRM_INTERNAL_TOKEN to a relay that asks for it: taken
// from the same environment as the transport's other variables (selectTransport with a worker's env).
import { startRelay, type Relay } from "@airm/kv-relay";
import { Registry, blobKey, isAirmError, newInternalToken, patternBytes, selectTransport } from "@airm/rm-core";
import { afterAll, beforeAll, expect, test } from "vitest";
import { nixlUcxTransport, shutdownEngines } from "../src/index.ts";

const TOKEN = newInternalToken();
let relay: Relay;
const registry = new Registry({ discover: false });
registry.register("airm.kv_transports", nixlUcxTransport);

beforeAll(async () => {
  relay = await startRelay({ host: "127.0.0.1", port: 0, token: TOKEN });
});
afterAll(async () => {
  await relay?.close();
  await shutdownEngines();
});

test("descriptors cross a relay with a token when AIRM_INTERNAL_TOKEN is in the env; without it the push is refused", async () => {
  const env = { AIRM_KV_TCP_ADDR: relay.address, AIRM_KV_UCX_POOL_MB: "8" };
  const open = (e: Record<string, string>) => selectTransport({ registry, name: "nixl-ucx", env: e, options: { tls: "tcp" } });
  const producer = await open({ ...env, AIRM_INTERNAL_TOKEN: TOKEN });
  const consumer = await open({ ...env, AIRM_INTERNAL_TOKEN: TOKEN });
  const anon = await open(env);
  try {
    const key = blobKey("tok-ucx", 0, "k");
    await producer.push(key, patternBytes(2, 200_000));
    expect(Buffer.from((await consumer.pull(key, { timeoutMs: 5000 })).bytes).equals(patternBytes(2, 200_000))).toBe(true);
    const e = await anon.push(blobKey("tok-ucx", 0, "v"), patternBytes(3, 1000)).then(
      () => undefined,
      (err: Error) => err,
    );
    expect(isAirmError(e, "TRANSPORT_ERROR"), String(e)).toBe(true);
    expect((e as Error).message).toMatch(/AIRM_INTERNAL_TOKEN is missing or differs from the relay's/);
    await producer.release("tok-ucx");
  } finally {
    await Promise.all([producer.close(), consumer.close(), anon.close()]);
  }
}, 30_000);
