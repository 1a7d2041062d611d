// Fault tests against real relays (in-process and child processes) over real sockets: restarts,
// corrupted bytes, timeouts, a full relay, TTL expiry, pooling, and closing.

import net from "node:net";
import { blobKey, isAirmError, kvCrc32, patternBytes, type KVTransport, type PulledBlob } from "@airm/rm-core";
import { frame, spawnRelay, startRelay, type Relay, type RelayProcess } from "@airm/kv-relay";
import { startFlipProxy } from "@airm/kv-relay/testing";
import { afterEach, describe, expect, test } from "vitest";
import { createTcpTransport } from "../src/index.ts";

const MIB = 1 << 20;
const cleanups: (() => Promise<unknown>)[] = [];
afterEach(async () => {
  while (cleanups.length) await cleanups.pop()!().catch(() => {});
});

async function relay(opts: Parameters<typeof startRelay>[0] = {}): Promise<Relay> {
  const r = await startRelay({ host: "127.0.0.1", port: 0, ...opts });
  cleanups.push(() => r.close());
  return r;
}
function transport(addr: string, opts: { crc?: boolean } = {}): KVTransport {
  const t = createTcpTransport({ addr, ...opts });
  cleanups.push(() => t.close());
  return t;
}
async function child(args: string[], env: NodeJS.ProcessEnv = {}): Promise<RelayProcess> {
  const r = await spawnRelay(args, env);
  cleanups.push(() => r.stop());
  return r;
}
async function caught(p: Promise<unknown>): Promise<{ code: string; message: string }> {
  try {
    await p;
  } catch (e) {
    expect(isAirmError(e), `expected a typed error, got ${String(e)}`).toBe(true);
    return e as { code: string; message: string };
  }
  throw new Error("expected an error, but the call succeeded");
}
/** True when a pulled blob holds exactly `b` (and its measured CRC-32, if any, is right). */
const same = ({ bytes: a, crc32 }: PulledBlob, b: Uint8Array) => Buffer.from(a.buffer, a.byteOffset, a.byteLength).equals(b) && (crc32 === null || crc32 === kvCrc32(a));

describe("relay restart", () => {
  test("a child-process relay restarted on the same port between requests: the next request works", async () => {
    const first = await child(["--listen", "127.0.0.1:0"]);
    const t = transport(first.address);
    const a = patternBytes(1, MIB);
    await t.push(blobKey("r1", 0, "k"), a);
    expect(same(await t.pull(blobKey("r1", 0, "k"), { timeoutMs: 2000 }), a)).toBe(true);
    expect(await first.stop()).toBe(0);

    const second = await child(["--listen", first.address]);
    expect(second.address).toBe(first.address);
    const b = patternBytes(2, MIB + 7);
    await t.push(blobKey("r2", 0, "k"), b); // the pooled connection died with the old relay
    expect(same(await t.pull(blobKey("r2", 0, "k"), { timeoutMs: 2000 }), b)).toBe(true);
    // The restarted relay starts empty: the first request's blob is gone.
    expect((await caught(t.pull(blobKey("r1", 0, "k"), { timeoutMs: 100 }))).code).toBe("TRANSPORT_TIMEOUT");
  });

  test("a request issued while the relay is down waits for it to come back (within its timeout)", async () => {
    const first = await relay();
    const port = first.port;
    const t = transport(first.address);
    await t.push("warm/0/k", patternBytes(3, 1000));
    await first.close();
    const pending = t.push("late/0/k", patternBytes(4, 5000), { timeoutMs: 10_000 });
    await new Promise((r) => setTimeout(r, 300));
    await relay({ port });
    await pending;
    expect(same(await t.pull("late/0/k", { timeoutMs: 1000 }), patternBytes(4, 5000))).toBe(true);
  });

  test("no relay at the address: a typed error that names the address and what to start", async () => {
    const r = await relay();
    const addr = r.address;
    await r.close();
    const e = await caught(transport(addr).push("x/0/k", new Uint8Array(10), { timeoutMs: 200 }));
    expect(e.code).toBe("TRANSPORT_ERROR");
    expect(e.message).toContain(addr);
    expect(e.message).toContain("airm-kv-relay --listen");
  });
});

describe("corrupted bytes on the wire (a real proxy flips one payload byte)", () => {
  test("relay to receiver: pull fails with KV_INTEGRITY, never returns wrong bytes", async () => {
    const r = await relay();
    const proxy = await startFlipProxy(r, "down", 32 + 1000);
    cleanups.push(() => proxy.close());
    const data = patternBytes(7, MIB);
    await transport(r.address).push("c1/0/k", data);
    const into = new Uint8Array(MIB);
    const e = await caught(transport(proxy.address).pull("c1/0/k", { timeoutMs: 2000, into }));
    expect(e.code).toBe("KV_INTEGRITY");
    expect(e.message).toMatch(/CRC-32/);
    // The flip really happened: the destination holds the damaged byte that the check caught.
    expect(into[1000]).toBe(data[1000] ^ 0xff);
  });

  test("the same flip with CRC off on the receiver goes unnoticed (so the check above is what catches it)", async () => {
    const r = await relay();
    const proxy = await startFlipProxy(r, "down", 32 + 1000);
    cleanups.push(() => proxy.close());
    const data = patternBytes(7, MIB);
    await transport(r.address).push("c2/0/k", data);
    const got = await transport(proxy.address, { crc: false }).pull("c2/0/k", { timeoutMs: 2000 });
    expect(same(got, data)).toBe(false);
    expect(got.crc32).toBeNull();
    expect(got.bytes[1000]).toBe(data[1000] ^ 0xff);
  });

  test("pusher to relay: the relay refuses the blob (KV_INTEGRITY), counts it, and stores nothing", async () => {
    const r = await relay();
    const key = "c3/0/k";
    const proxy = await startFlipProxy(r, "up", 32 + key.length + 4096);
    cleanups.push(() => proxy.close());
    const e = await caught(transport(proxy.address).push(key, patternBytes(9, MIB)));
    expect(e.code).toBe("KV_INTEGRITY");
    expect(r.stats().crcFailures).toBe(1);
    expect(r.stats().blobs).toBe(0);
    expect(await r.metricsText()).toMatch(/^airm_kv_relay_crc_failures_total 1$/m);
    expect((await caught(transport(r.address).pull(key, { timeoutMs: 100 }))).code).toBe("TRANSPORT_TIMEOUT");
  });
});

describe("a CRC-32 given by the pusher (push option crc32)", () => {
  test("a wrong one is refused by the relay (KV_INTEGRITY) and nothing is stored; the right one crosses", async () => {
    const r = await relay();
    const t = transport(r.address);
    const data = patternBytes(21, MIB);
    const right = kvCrc32(data);
    const e = await caught(t.push("g1/0/k", data, { crc32: (right ^ 1) >>> 0 }));
    expect(e.code).toBe("KV_INTEGRITY");
    expect(r.stats().blobs).toBe(0);
    expect(r.stats().crcFailures).toBe(1);
    await t.push("g1/0/v", data, { crc32: right });
    expect(same(await transport(r.address).pull("g1/0/v", { timeoutMs: 2000 }), data)).toBe(true);
  });
});

describe("timeouts, space and lifetime", () => {
  test("pull timeout: TRANSPORT_TIMEOUT naming the key, and the relay forgets the wait", async () => {
    const r = await relay();
    const t = transport(r.address);
    const e = await caught(t.pull("never/0/k", { timeoutMs: 150 }));
    expect(e.code).toBe("TRANSPORT_TIMEOUT");
    expect(e.message).toContain("never/0/k");
    // The same connection still serves: a later push/pull goes through.
    await t.push("after/0/k", patternBytes(1, 100));
    expect(same(await t.pull("after/0/k"), patternBytes(1, 100))).toBe(true);
  });

  test("relay full: a push past the cap waits, then fails with TRANSPORT_NO_SPACE; memory stays under the cap", async () => {
    const r = await relay({ maxBytes: 2 * MIB });
    const t = transport(r.address);
    await t.push("f1/0/k", patternBytes(1, MIB));
    await t.push("f2/0/k", patternBytes(2, MIB));
    const t0 = Date.now();
    const e = await caught(t.push("f3/0/k", patternBytes(3, MIB), { timeoutMs: 300 }));
    expect(e.code).toBe("TRANSPORT_NO_SPACE");
    expect(e.message).toContain("AIRM_KV_TCP_MAX_MB");
    expect(Date.now() - t0).toBeGreaterThanOrEqual(250);
    const s = r.stats();
    expect(s.blobs).toBe(2);
    expect(s.poolHeldBytes + s.poolIdleBytes).toBeLessThanOrEqual(2 * MIB);
  });

  test("relay full: a waiting push goes through once a request is released", async () => {
    const r = await relay({ maxBytes: 2 * MIB });
    const t = transport(r.address);
    await t.push("g1/0/k", patternBytes(1, MIB));
    await t.push("g2/0/k", patternBytes(2, MIB));
    const waiting = t.push("g3/0/k", patternBytes(3, MIB), { timeoutMs: 10_000 });
    await new Promise((res) => setTimeout(res, 200));
    expect(r.stats().blobs).toBe(2);
    await t.release("g1");
    await waiting;
    expect(same(await t.pull("g3/0/k"), patternBytes(3, MIB))).toBe(true);
    expect(r.stats().blobs).toBe(2);
  });

  test("a blob larger than the whole cap fails at once with TRANSPORT_NO_SPACE", async () => {
    const r = await relay({ maxBytes: MIB });
    const t = transport(r.address);
    const e = await caught(t.push("big/0/k", new Uint8Array(2 * MIB), { timeoutMs: 60_000 }));
    expect(e.code).toBe("TRANSPORT_NO_SPACE");
    expect(e.message).toMatch(/whole cap/);
    await t.push("small/0/k", patternBytes(5, 1000)); // the connection is still in step
    expect(same(await t.pull("small/0/k"), patternBytes(5, 1000))).toBe(true);
  });

  test("unread blobs expire after the TTL and are counted", async () => {
    const r = await relay({ ttlMs: 150 });
    const t = transport(r.address);
    await t.push("ttl/0/k", patternBytes(1, 5000));
    await new Promise((res) => setTimeout(res, 600));
    expect(r.stats().blobs).toBe(0);
    expect(r.stats().expired).toBe(1);
    expect(r.stats().poolHeldBytes).toBe(0);
    expect((await caught(t.pull("ttl/0/k", { timeoutMs: 100 }))).code).toBe("TRANSPORT_TIMEOUT");
    expect(await r.metricsText()).toMatch(/^airm_kv_relay_expired_total\{read="false"\} 1$/m);
  });

  test("release frees relay memory for every blob of the request, only that request", async () => {
    const r = await relay();
    const t = transport(r.address);
    for (let l = 0; l < 4; l++) for (const kv of ["k", "v"] as const) await t.push(blobKey("keep", l, kv), patternBytes(l, 70_000));
    for (let l = 0; l < 4; l++) await t.push(blobKey("drop", l, "k"), patternBytes(l, 70_000));
    expect(r.stats().blobs).toBe(12);
    await t.release("drop");
    expect(r.stats().blobs).toBe(8);
    expect(r.stats().bytesHeld).toBe(8 * 70_000);
    expect(same(await t.pull(blobKey("keep", 3, "v")), patternBytes(3, 70_000))).toBe(true);
  });
});

describe("client behaviour", () => {
  test("transports in one process share at most 2 pooled connections per relay", async () => {
    const r = await relay();
    const a = transport(r.address);
    const b = transport(r.address);
    await Promise.all(Array.from({ length: 16 }, (_, i) => (i % 2 ? a : b).push(blobKey("pool", i, "k"), patternBytes(i, 300_000))));
    expect(r.stats().connections).toBeGreaterThanOrEqual(1);
    expect(r.stats().connections).toBeLessThanOrEqual(2);
    const got = await Promise.all(Array.from({ length: 16 }, (_, i) => (i % 2 ? b : a).pull(blobKey("pool", i, "k"))));
    got.forEach((g, i) => expect(same(g, patternBytes(i, 300_000)), `blob ${i}`).toBe(true));
  });

  test("a destination smaller than the blob is a TransportError, and the connection stays usable", async () => {
    const r = await relay();
    const t = transport(r.address);
    await t.push("small-into/0/k", patternBytes(1, 10_000));
    const e = await caught(t.pull("small-into/0/k", { into: new Uint8Array(100) }));
    expect(e.code).toBe("TRANSPORT_ERROR");
    expect(e.message).toMatch(/larger `into`/);
    expect(same(await t.pull("small-into/0/k"), patternBytes(1, 10_000))).toBe(true);
  });

  test("close() fails calls in flight with TRANSPORT_CLOSED and later calls too", async () => {
    const r = await relay();
    const t = createTcpTransport({ addr: r.address });
    const waiting = caught(t.pull("closing/0/k", { timeoutMs: 10_000 }));
    await new Promise((res) => setTimeout(res, 100));
    await t.close();
    expect((await waiting).code).toBe("TRANSPORT_CLOSED");
    expect((await caught(t.push("closing/0/k", new Uint8Array(1)))).code).toBe("TRANSPORT_CLOSED");
    await t.close(); // idempotent
  });

  test("a bad address is a ConfigError", async () => {
    for (const addr of ["no-port", "host:99999", "127.0.0.1:0", ""]) {
      let err: unknown;
      try {
        createTcpTransport({ addr });
      } catch (e) {
        err = e;
      }
      expect(isAirmError(err, "CONFIG"), `addr ${JSON.stringify(addr)}: ${String(err)}`).toBe(true);
    }
  });
});

test("an empty blob crosses as an empty array (with and without `into`)", async () => {
  const r = await relay();
  const t = transport(r.address);
  await t.push("empty/0/k", new Uint8Array(0));
  expect((await t.pull("empty/0/k")).bytes.byteLength).toBe(0);
  const into = new Uint8Array(8);
  const got = await t.pull("empty/0/k", { into });
  expect(got.bytes.byteLength).toBe(0);
  expect(got.bytes.buffer).toBe(into.buffer);
});

test("a puller that vanishes mid-transfer leaks no relay memory; a half-sent push is freed too", async () => {
  const r = await relay();
  const t = transport(r.address);
  await t.push("vanish/0/k", patternBytes(1, 8 * MIB));
  // A raw client asks for the 8 MiB blob, reads a little, and disappears.
  const s = net.connect(r.port, "127.0.0.1");
  await new Promise((res) => s.once("connect", res));
  s.write(frame.encodeHead({ op: frame.Op.PULL, flags: 0, status: 0, tag: 1, payloadLength: 0, crc: 0, arg: 1000 }, "vanish/0/k"));
  await new Promise((res) => s.once("data", res));
  s.destroy();
  // Another starts pushing 4 MiB and disappears after 1 KiB of payload.
  const p = net.connect(r.port, "127.0.0.1");
  await new Promise((res) => p.once("connect", res));
  p.write(frame.encodeHead({ op: frame.Op.PUSH, flags: 0, status: 0, tag: 1, payloadLength: 4 * MIB, crc: 0, arg: 0 }, "vanish/1/k"));
  p.write(Buffer.alloc(1024));
  await new Promise((res) => setTimeout(res, 100));
  p.destroy();
  await t.release("vanish");
  for (let i = 0; i < 50 && (r.stats().poolHeldBytes > 0 || r.stats().connections > 1); i++) await new Promise((res) => setTimeout(res, 20));
  expect(r.stats()).toMatchObject({ blobs: 0, bytesHeld: 0, poolHeldBytes: 0 });
});
