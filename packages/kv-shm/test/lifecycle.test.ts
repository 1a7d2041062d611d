// Release, TTL expiry, close and re-push on one root, with endpoints in this process.
import { existsSync, lstatSync, mkdirSync, readdirSync, symlinkSync } from "node:fs";
import { join } from "node:path";
import { afterEach, describe, expect, test } from "vitest";
import { blobKey, patternBytes } from "@airm/rm-core";
import { SHM_CONFIG, ShmTransport, shmSettings, shmTransport } from "../src/index.ts";
import { cleanupAll, freshRoot } from "./shm-roots.ts";

const open: ShmTransport[] = [];
function endpoint(root: string, ttlMs = 300_000, slabBytes = 4 * 1024 * 1024): ShmTransport {
  const t = ShmTransport.open({ root, ttlMs, slabBytes });
  open.push(t);
  return t;
}
const slabsIn = (root: string): string[] => readdirSync(root).filter((f) => f.startsWith("slab-"));
const same = ({ bytes: a }: { bytes: Uint8Array }, b: Uint8Array): boolean => Buffer.from(a.buffer, a.byteOffset, a.byteLength).equals(b);

afterEach(async () => {
  await Promise.allSettled(open.splice(0).map((t) => t.close()));
  cleanupAll();
});

describe("shm lifecycle", { timeout: 30_000 }, () => {
  test("a release on the consumer side frees the producer's bytes and the region is reused", async () => {
    const root = freshRoot("rel");
    const producer = endpoint(root);
    const consumer = endpoint(root);
    await producer.push(blobKey("r1", 0, "k"), patternBytes(1, 3 * 1024 * 1024));
    await producer.push(blobKey("r1", 0, "v"), patternBytes(2, 1000));
    expect(producer.stats()).toMatchObject({ blobs: 2, bytes: 3 * 1024 * 1024 + 1000 });
    await consumer.release("r1");
    expect(producer.stats()).toMatchObject({ blobs: 0, bytes: 0 });
    // 3 MiB more fits the same 4 MiB slab only because the released region came back.
    await producer.push(blobKey("r2", 0, "k"), patternBytes(3, 3 * 1024 * 1024));
    expect(slabsIn(root)).toHaveLength(1);
    expect(same(await consumer.pull(blobKey("r2", 0, "k"), { timeoutMs: 1000 }), patternBytes(3, 3 * 1024 * 1024))).toBe(true);
  });

  test("blobs past their TTL are removed and counted as expired", async () => {
    const root = freshRoot("ttl");
    const producer = endpoint(root, 150);
    const consumer = endpoint(root);
    await producer.push(blobKey("old", 0, "k"), patternBytes(1, 5000));
    await producer.push(blobKey("old", 1, "k"), patternBytes(2, 5000));
    expect(producer.stats().blobs).toBe(2);
    const until = Date.now() + 10_000;
    while (producer.stats().expired < 2 && Date.now() < until) await new Promise((r) => setTimeout(r, 25));
    expect(producer.stats()).toEqual({ blobs: 0, bytes: 0, expired: 2 });
    expect(existsSync(join(root, "keys", "old"))).toBe(false);
    await expect(consumer.pull(blobKey("old", 0, "k"), { timeoutMs: 50 })).rejects.toMatchObject({ code: "TRANSPORT_TIMEOUT" });
  });

  test("PD_SHM_TTL_S, PD_SHM_ROOT and PD_SHM_SLAB_MB set the defaults; bad values are ConfigErrors", () => {
    const resolve = (options: Record<string, unknown>, env: Record<string, string>) => shmSettings(SHM_CONFIG.resolve({ options, env }));
    const s = resolve({}, { PD_SHM_TTL_S: "0.5", PD_SHM_ROOT: "/dev/shm/x", PD_SHM_SLAB_MB: "2" });
    expect(s).toEqual({ root: "/dev/shm/x", ttlMs: 500, slabBytes: 2 * 1024 * 1024 });
    expect(resolve({}, {})).toEqual({ root: "/dev/shm/rngd_kv_cluster", ttlMs: 300_000, slabBytes: 128 * 1024 * 1024 });
    expect(resolve({ ttlS: 0.01, root: "/tmp/y" }, { PD_SHM_TTL_S: "9" })).toMatchObject({ root: "/tmp/y", ttlMs: 10 });
    expect(() => resolve({}, { PD_SHM_TTL_S: "soon" })).toThrow(expect.objectContaining({ code: "CONFIG", key: "PD_SHM_TTL_S" }));
    expect(() => resolve({ ttlS: -1 }, {})).toThrow(expect.objectContaining({ code: "CONFIG", key: "ttlS" }));
    expect(() => resolve({ rooot: "/x" }, {})).toThrow(expect.objectContaining({ code: "CONFIG", key: "rooot" }));
  });

  test("close removes the endpoint's slabs and links; other endpoints keep theirs", async () => {
    const root = freshRoot("close");
    const a = endpoint(root);
    const b = endpoint(root);
    await a.push(blobKey("ra", 0, "k"), patternBytes(1, 10_000));
    await b.push(blobKey("rb", 0, "k"), patternBytes(2, 10_000));
    expect(slabsIn(root)).toHaveLength(2);
    await a.close();
    expect(slabsIn(root)).toHaveLength(1);
    expect(existsSync(join(root, "keys", "ra"))).toBe(false);
    await expect(a.push(blobKey("ra", 1, "k"), new Uint8Array(1))).rejects.toMatchObject({ code: "TRANSPORT_CLOSED" });
    await expect(a.pull(blobKey("rb", 0, "k"))).rejects.toMatchObject({ code: "TRANSPORT_CLOSED" });
    const c = endpoint(root);
    expect(same(await c.pull(blobKey("rb", 0, "k"), { timeoutMs: 1000 }), patternBytes(2, 10_000))).toBe(true);
  });

  test("a pending pull fails with TRANSPORT_CLOSED when its endpoint closes", async () => {
    const t = endpoint(freshRoot("pend"));
    const pending = t.pull(blobKey("never", 0, "k"), { timeoutMs: 10_000 });
    await new Promise((r) => setTimeout(r, 20));
    await t.close();
    await expect(pending).rejects.toMatchObject({ code: "TRANSPORT_CLOSED" });
  });

  test("a re-push replaces the blob atomically and frees the old region", async () => {
    const root = freshRoot("repush");
    const t = endpoint(root);
    const key = blobKey("rp", 0, "k");
    await t.push(key, patternBytes(1, 70_000));
    await t.push(key, patternBytes(2, 50_000));
    expect(t.stats()).toMatchObject({ blobs: 1, bytes: 50_000 });
    const reader = endpoint(root);
    expect(same(await reader.pull(key, { timeoutMs: 1000 }), patternBytes(2, 50_000))).toBe(true);
    expect(readdirSync(join(root, "keys", "rp"))).toEqual(["0+k"]);
  });

  test("keys that are only a request id, or have many segments, map to distinct links", async () => {
    const root = freshRoot("names");
    const t = endpoint(root);
    const keys = ["rq", "rq/manifest", "rq/0/k", "rq/0.k", "rq/a/b/c"];
    for (const [i, k] of keys.entries()) await t.push(k, patternBytes(i + 1, 100 + i));
    for (const [i, k] of keys.entries()) expect(same(await t.pull(k, { timeoutMs: 100 }), patternBytes(i + 1, 100 + i))).toBe(true);
    expect(readdirSync(join(root, "keys", "rq")).sort()).toEqual(["+", "0+k", "0.k", "a+b+c", "manifest"]);
  });

  test("a destination smaller than the blob, and a link to a vanished producer, are TransportErrors", async () => {
    const root = freshRoot("bad");
    const t = endpoint(root);
    await t.push(blobKey("rs", 0, "k"), patternBytes(1, 1000));
    await expect(t.pull(blobKey("rs", 0, "k"), { into: new Uint8Array(999) })).rejects.toMatchObject({ code: "TRANSPORT_ERROR" });
    mkdirSync(join(root, "keys", "gone"), { recursive: true });
    symlinkSync("slab-1-dead-0:0:10", join(root, "keys", "gone", "0+k"));
    await expect(t.pull(blobKey("gone", 0, "k"), { timeoutMs: 100 })).rejects.toMatchObject({ code: "TRANSPORT_ERROR", message: expect.stringContaining("producer is gone") });
  });

  test("the conformance fixture uses its own folder next to the serving root and removes it", async () => {
    const fixture = await shmTransport.conformance!({});
    const root = `${SHM_CONFIG.resolve({}).root}-conformance-${process.pid}`;
    try {
      const t = await fixture.factory();
      await t.push(blobKey("cf", 0, "k"), new Uint8Array(10));
      expect((t as ShmTransport).root).toBe(root);
      expect(lstatSync(join(root, "keys", "cf", "0+k")).isSymbolicLink()).toBe(true);
    } finally {
      await fixture.teardown();
    }
    expect(existsSync(root)).toBe(false);
  });
});
