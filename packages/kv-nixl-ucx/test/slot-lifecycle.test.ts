// A producer slot lives until its consumer acks the READ (then it is freed at once), its request
// is released, or its TTL passes unread (then it counts as expired).
import { afterAll, beforeAll, describe, expect, test } from "vitest";
import { startRelay, type RelayServer } from "@airm/kv-relay";
import { blobKey, patternBytes, type KVTransport } from "@airm/rm-core";
import { createNixlUcxTransport, shutdownEngines } from "../src/index.ts";

let relay: RelayServer;
beforeAll(async () => {
  relay = await startRelay({ host: "127.0.0.1", port: 0, maxBytes: 16 << 20 });
});
afterAll(async () => {
  await relay?.close();
  await shutdownEngines();
});

async function until(what: string, cond: () => boolean, limitMs = 10_000): Promise<void> {
  const end = Date.now() + limitMs;
  while (!cond()) {
    if (Date.now() > end) throw new Error(`gave up waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 10));
  }
}

for (const tls of ["tcp", "posix,self"]) {
  describe(`UCX_TLS=${tls}`, () => {
    test("the consumer's ack frees exactly the slot it read", async () => {
      const producer: KVTransport = await createNixlUcxTransport({ addr: relay.address, tls, poolMb: 8 });
      const consumer: KVTransport = await createNixlUcxTransport({ addr: relay.address, tls, poolMb: 8 });
      try {
        const rid = `ack-${Date.now()}`;
        await producer.push(blobKey(rid, 0, "k"), patternBytes(1, 300_000));
        await producer.push(blobKey(rid, 0, "v"), patternBytes(2, 200_000));
        expect(producer.stats!()).toMatchObject({ blobs: 2, bytes: 500_000 });
        const { bytes: got } = await consumer.pull(blobKey(rid, 0, "v"), { timeoutMs: 5000 });
        expect(Buffer.from(got).equals(patternBytes(2, 200_000))).toBe(true);
        await until("the ack", () => producer.stats!().blobs === 1);
        expect(producer.stats!()).toMatchObject({ blobs: 1, bytes: 300_000, expired: 0 });
        await producer.release(rid);
        expect(producer.stats!()).toMatchObject({ blobs: 0, bytes: 0 });
        await consumer.release(rid);
      } finally {
        await Promise.allSettled([producer.close(), consumer.close()]);
      }
    }, 30_000);

    test("an unread slot expires after its TTL and is counted", async () => {
      const producer = await createNixlUcxTransport({ addr: relay.address, tls, poolMb: 8, ttlS: 0.3 });
      try {
        const rid = `ttl-${Date.now()}`;
        await producer.push(blobKey(rid, 0, "k"), patternBytes(3, 100_000));
        expect(producer.stats!()).toMatchObject({ blobs: 1, expired: 0 });
        await until("the expiry", () => producer.stats!().expired === 1);
        expect(producer.stats!()).toMatchObject({ blobs: 0, bytes: 0, expired: 1 });
        await producer.release(rid);
      } finally {
        await producer.close();
      }
    }, 30_000);

    test("a push into a full arena waits for room, then fails with TRANSPORT_NO_SPACE after its timeout", async () => {
      const producer = await createNixlUcxTransport({ addr: relay.address, tls, poolMb: 2 });
      try {
        const rid = `full-${Date.now()}`;
        await producer.push(blobKey(rid, 0, "k"), patternBytes(4, 1 << 20));
        const e = await producer.push(blobKey(rid, 1, "k"), patternBytes(5, 1 << 20), { timeoutMs: 200 }).then(
          () => undefined,
          (err: unknown) => err,
        );
        expect((e as { code?: string })?.code).toBe("TRANSPORT_NO_SPACE");
        // A push that waits gets the room a release frees meanwhile.
        const waiting = producer.push(blobKey(`${rid}b`, 1, "k"), patternBytes(5, 1 << 20), { timeoutMs: 10_000 });
        await new Promise((r) => setTimeout(r, 100));
        expect(producer.stats!()).toMatchObject({ blobs: 1 });
        await producer.release(rid);
        await waiting;
        expect(producer.stats!()).toMatchObject({ blobs: 1, bytes: 1 << 20 });
        await producer.release(`${rid}b`);
      } finally {
        await producer.close();
      }
    }, 30_000);
  });
}
