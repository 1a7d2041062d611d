// Producer and consumer in different OS processes, as prefill and decode workers are.
import { createHash } from "node:crypto";
import { existsSync, readdirSync } from "node:fs";
import { join } from "node:path";
import { afterEach, describe, expect, test } from "vitest";
import { blobKey, patternBytes } from "@airm/rm-core";
import { ShmTransport } from "../src/index.ts";
import { cleanupAll, freshRoot, startPeer } from "./shm-roots.ts";

const sha = (b: Uint8Array): string => createHash("sha256").update(b).digest("hex");
const open: ShmTransport[] = [];
function endpoint(root: string, ttlMs = 300_000): ShmTransport {
  const t = ShmTransport.open({ root, ttlMs, slabBytes: 8 * 1024 * 1024 });
  open.push(t);
  return t;
}

afterEach(async () => {
  await Promise.allSettled(open.splice(0).map((t) => t.close()));
  cleanupAll();
});

describe("shm across processes", { timeout: 30_000 }, () => {
  test("a child pulls byte-exact what this process pushed, its pull issued before the push", async () => {
    const root = freshRoot("x1");
    const producer = endpoint(root);
    const rid = "req-a";
    const sizes = [1, 4097, 1 << 20, 3 * 1024 * 1024 + 5];
    const blobs = sizes.map((n, i) => patternBytes(40 + i, n));
    const peer = startPeer(["pull", root, rid, String(blobs.length), "20000", "1"]);
    expect(await peer.next()).toEqual({ waiting: true });
    await new Promise((r) => setTimeout(r, 100)); // the child is now polling for blob 0
    for (let i = 0; i < blobs.length; i++) await producer.push(blobKey(rid, i, "k"), blobs[i]);
    const reply = await peer.next();
    expect(reply.sha256).toEqual(blobs.map(sha));
    expect(await peer.exited).toBe(0);
    // The child released the request: the producer's regions come back.
    expect(existsSync(join(root, "keys", rid))).toBe(false);
    expect(producer.stats()).toMatchObject({ blobs: 0, bytes: 0 });
  });

  test("this process pulls byte-exact what a child pushed (views and into)", async () => {
    const root = freshRoot("x2");
    const consumer = endpoint(root);
    const rid = "req-b";
    const size = 999_999;
    const peer = startPeer(["push", root, rid, "6", String(size), "7"]);
    const pushed = await peer.next();
    expect(pushed.pushed).toBe(6);
    for (let i = 0; i < 6; i++) {
      const want = patternBytes(7 + i, size);
      const { bytes: view } = await consumer.pull(blobKey(rid, i, "k"), { timeoutMs: 5000 });
      expect(Buffer.from(view.buffer, view.byteOffset, view.byteLength).equals(want)).toBe(true);
      const dest = new Uint8Array(size + 10);
      const { bytes: copy } = await consumer.pull(blobKey(rid, i, "k"), { timeoutMs: 5000, into: dest });
      expect(copy.buffer).toBe(dest.buffer);
      expect(Buffer.from(copy).equals(want)).toBe(true);
    }
    expect(pushed.stats).toMatchObject({ blobs: 6, bytes: 6 * size });
    await consumer.release(rid);
    peer.send("stats");
    expect((await peer.next()).stats).toMatchObject({ blobs: 0, bytes: 0 });
    peer.send("close");
    expect(await peer.exited).toBe(0);
    // The child's close removed its slabs.
    expect(readdirSync(root).filter((f) => f.startsWith("slab-"))).toEqual([]);
  });

  test("a killed producer's slabs and keys are swept by the next endpoint", async () => {
    const root = freshRoot("kill");
    const peer = startPeer(["push", root, "req-k", "3", "65536", "3"]);
    expect((await peer.next()).pushed).toBe(3);
    const slabsOf = (): string[] => readdirSync(root).filter((f) => f.startsWith("slab-"));
    expect(slabsOf()).toHaveLength(1);
    // A live producer's leftovers are not touched by a new endpoint.
    const bystander = endpoint(root);
    expect(slabsOf()).toHaveLength(1);
    expect(readdirSync(join(root, "keys", "req-k")).sort()).toEqual(["0+k", "1+k", "2+k"]);
    peer.child.kill("SIGKILL");
    await peer.exited;
    expect(slabsOf()).toHaveLength(1); // nobody cleaned up after the kill
    const next = endpoint(root);
    expect(slabsOf()).toEqual([]);
    expect(existsSync(join(root, "keys", "req-k"))).toBe(false);
    await expect(next.pull(blobKey("req-k", 0, "k"), { timeoutMs: 50 })).rejects.toMatchObject({ code: "TRANSPORT_TIMEOUT" });
    // The new endpoint works on the swept root.
    await next.push(blobKey("req-n", 0, "k"), patternBytes(1, 100));
    expect(Buffer.from((await bystander.pull(blobKey("req-n", 0, "k"), { timeoutMs: 1000 })).bytes).equals(patternBytes(1, 100))).toBe(true);
  });
});
