// Faults end to end: a producer process killed before the READ, a READ of bytes whose CRC does not
// match the descriptor, a descriptor naming an unreachable worker. Each must surface as a
// TransportError within the pull's timeout, never as wrong bytes, a hang or a crash.
import { spawn, type ChildProcess } from "node:child_process";
import { once } from "node:events";
import { fileURLToPath } from "node:url";
import { createInterface } from "node:readline";
import { afterAll, afterEach, beforeAll, describe, expect, test } from "vitest";
import { startRelay, type RelayServer } from "@airm/kv-relay";
import { TransportError, blobKey, isAirmError, kvCrc32, patternBytes, type KVTransport } from "@airm/rm-core";
import { createNixlUcxTransport, decodeDescriptor, encodeDescriptor, relayDirectory, shutdownEngines, type DescriptorDirectory } from "../src/index.ts";

const packageDir = fileURLToPath(new URL("..", import.meta.url));
const producerScript = fileURLToPath(new URL("./fixtures/producer-process.ts", import.meta.url));

let relay: RelayServer;
const children: ChildProcess[] = [];
const endpoints: KVTransport[] = [];

beforeAll(async () => {
  relay = await startRelay({ host: "127.0.0.1", port: 0, maxBytes: 16 << 20 });
});
afterEach(async () => {
  for (const c of children.splice(0)) if (c.exitCode === null && c.signalCode === null) c.kill("SIGKILL");
  await Promise.allSettled(endpoints.splice(0).map((e) => e.close()));
});
afterAll(async () => {
  await relay?.close();
  await shutdownEngines();
});

async function startProducer(tls: string, rid: string, count: number, bytes: number, blockMs = 0): Promise<ChildProcess> {
  const child = spawn(process.execPath, ["--import", "tsx", producerScript, relay.address, tls, rid, String(count), String(bytes), "8", String(blockMs)], {
    cwd: packageDir,
    stdio: ["pipe", "pipe", "inherit"],
  });
  children.push(child);
  const lines = createInterface({ input: child.stdout! });
  const exited = once(child, "exit").then(([code]) => {
    throw new Error(`producer exited early with ${code}`);
  });
  const pushed = (async () => {
    for await (const line of lines) if (line.includes('"pushed"')) return;
    throw new Error("producer closed stdout before pushing");
  })();
  await Promise.race([pushed, exited]);
  return child;
}

async function expectTransportError(p: Promise<unknown>, timeoutMs: number): Promise<TransportError> {
  const t0 = Date.now();
  const e = await p.then(
    () => undefined,
    (err: unknown) => err,
  );
  const waited = Date.now() - t0;
  expect(e, "the pull must fail").toBeInstanceOf(TransportError);
  expect(isAirmError(e)).toBe(true);
  // The error comes from the transport's own deadline, not from a hang the test runner cuts off.
  expect(waited).toBeLessThanOrEqual(timeoutMs + 1500);
  return e as TransportError;
}

for (const tls of ["tcp", "posix,self"]) {
  describe(`UCX_TLS=${tls}`, () => {
    test("a producer killed before the READ gives a TransportError, and a live producer's blob still crosses", async () => {
      const rid = `kill-${tls.replace(/\W/g, "")}-${Date.now()}`;
      // Control: the same set-up with the producer alive delivers the exact bytes.
      const live = await startProducer(tls, `${rid}-live`, 1, 100_000);
      const consumer = await createNixlUcxTransport({ addr: relay.address, tls, poolMb: 8 });
      endpoints.push(consumer);
      const { bytes: got } = await consumer.pull(blobKey(`${rid}-live`, 0, "k"), { timeoutMs: 10_000 });
      expect(Buffer.from(got).equals(patternBytes(1, 100_000))).toBe(true);
      live.stdin!.write("exit\n");
      await once(live, "exit");

      const doomed = await startProducer(tls, rid, 1, 100_000);
      doomed.kill("SIGKILL");
      await once(doomed, "exit");
      const into = new Uint8Array(100_000);
      const err = await expectTransportError(consumer.pull(blobKey(rid, 0, "k"), { timeoutMs: 4000, into }), 4000);
      // UCX reports the dead peer itself (connection refused / shared memory gone): no waiting for the deadline.
      expect(err.code, err.message).toBe("TRANSPORT_ERROR");
      expect(into.every((b) => b === 0)).toBe(true);
    }, 60_000);

    test("a producer whose main thread is blocked still serves READs (the UCX progress thread does)", async () => {
      const rid = `blocked-${tls.replace(/\W/g, "")}-${Date.now()}`;
      const blockMs = 20_000;
      const producer = await startProducer(tls, rid, 4, 1 << 20, blockMs);
      const consumer = await createNixlUcxTransport({ addr: relay.address, tls, poolMb: 8 });
      endpoints.push(consumer);
      // The pulls' deadline ends long before the producer's main thread runs again.
      for (let i = 0; i < 4; i++) {
        const { bytes: got } = await consumer.pull(blobKey(rid, i, "k"), { timeoutMs: 8000 });
        expect(Buffer.from(got.buffer, got.byteOffset, got.byteLength).equals(patternBytes(i + 1, 1 << 20)), `blob ${i}`).toBe(true);
      }
      expect(producer.exitCode).toBe(null);
    }, 60_000);

    test("bytes that do not match the descriptor's CRC-32 are refused with a KV_INTEGRITY TransportError", async () => {
      const rid = `crc-${tls.replace(/\W/g, "")}-${Date.now()}`;
      // The producer publishes a descriptor pointing one byte past its blob: the READ succeeds but
      // returns other bytes than the CRC-32 covers.
      const real = relayDirectory(relay.address);
      const skewing: DescriptorDirectory = {
        ...real,
        address: real.address,
        publish: (key, raw, timeoutMs) => {
          const d = decodeDescriptor(raw, key);
          return real.publish(key, encodeDescriptor({ ...d, remoteAddr: d.remoteAddr + 1 }), timeoutMs);
        },
      };
      const producer = await createNixlUcxTransport({ tls, poolMb: 8 }, skewing);
      const consumer = await createNixlUcxTransport({ addr: relay.address, tls, poolMb: 8 });
      endpoints.push(producer, consumer);
      await producer.push(blobKey(rid, 0, "k"), patternBytes(3, 65_536));
      const into = new Uint8Array(65_536);
      const err = await expectTransportError(consumer.pull(blobKey(rid, 0, "k"), { timeoutMs: 5000, into }), 5000);
      expect(err.code).toBe("KV_INTEGRITY");
      expect(into.every((b) => b === 0)).toBe(true);
      // An honest blob on the same endpoints still crosses.
      const honest = await createNixlUcxTransport({ addr: relay.address, tls, poolMb: 8 });
      endpoints.push(honest);
      await honest.push(blobKey(rid, 1, "k"), patternBytes(4, 65_536));
      const ok = await consumer.pull(blobKey(rid, 1, "k"), { timeoutMs: 5000 });
      expect(Buffer.from(ok.bytes).equals(patternBytes(4, 65_536))).toBe(true);
    }, 60_000);

    test("a wrong CRC-32 given on push (option crc32) makes the pull fail with KV_INTEGRITY, not return the bytes", async () => {
      const rid = `gcrc-${tls.replace(/\W/g, "")}-${Date.now()}`;
      const producer = await createNixlUcxTransport({ addr: relay.address, tls, poolMb: 8 });
      const consumer = await createNixlUcxTransport({ addr: relay.address, tls, poolMb: 8 });
      endpoints.push(producer, consumer);
      const data = patternBytes(5, 65_536);
      await producer.push(blobKey(rid, 0, "k"), data, { crc32: (kvCrc32(data) ^ 0x80) >>> 0 });
      const err = await expectTransportError(consumer.pull(blobKey(rid, 0, "k"), { timeoutMs: 5000 }), 5000);
      expect(err.code).toBe("KV_INTEGRITY");
      await producer.push(blobKey(rid, 1, "k"), data, { crc32: kvCrc32(data) });
      const ok = await consumer.pull(blobKey(rid, 1, "k"), { timeoutMs: 5000 });
      expect(Buffer.from(ok.bytes).equals(data)).toBe(true);
    }, 60_000);

    test("a damaged descriptor (garbage worker address) is refused with a TransportError before UCX sees it", async () => {
      const rid = `garbled-${tls.replace(/\W/g, "")}-${Date.now()}`;
      const real = relayDirectory(relay.address);
      const garbling: DescriptorDirectory = {
        ...real,
        address: real.address,
        publish: (key, raw, timeoutMs) => {
          const damaged = new Uint8Array(raw);
          damaged.fill(0xa5, 64, 64 + 24); // inside the worker address
          return real.publish(key, damaged, timeoutMs);
        },
      };
      const producer = await createNixlUcxTransport({ tls, poolMb: 8 }, garbling);
      const consumer = await createNixlUcxTransport({ addr: relay.address, tls, poolMb: 8 });
      endpoints.push(producer, consumer);
      await producer.push(blobKey(rid, 0, "k"), patternBytes(5, 4096));
      const err = await expectTransportError(consumer.pull(blobKey(rid, 0, "k"), { timeoutMs: 3000 }), 3000);
      expect(err.message).toMatch(/damaged/);
    }, 60_000);
  });
}
