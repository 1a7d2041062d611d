// A full shm root: a 1 MiB tmpfs mounted as the root stands in for a full /dev/shm.
import { spawnSync } from "node:child_process";
import { mkdirSync, readdirSync, rmSync, statfsSync } from "node:fs";
import { afterEach, describe, expect, test } from "vitest";
import { blobKey, patternBytes } from "@airm/rm-core";
import { ShmTransport } from "../src/index.ts";
import { cleanupAll, freshRoot } from "./shm-roots.ts";

function tryMount(): string | null {
  if (process.platform !== "linux") return "needs Linux tmpfs";
  const probe = freshRoot("mount-probe");
  mkdirSync(probe, { recursive: true });
  const r = spawnSync("mount", ["-t", "tmpfs", "-o", "size=1m", "tmpfs", probe], { encoding: "utf8" });
  if (r.status !== 0) {
    rmSync(probe, { recursive: true, force: true });
    return `cannot mount a tmpfs (needs root or CAP_SYS_ADMIN): ${(r.stderr || r.error?.message || "").trim()}`;
  }
  spawnSync("umount", [probe]);
  rmSync(probe, { recursive: true, force: true });
  return null;
}
const mountProblem = tryMount();
const mounted: string[] = [];
const open: ShmTransport[] = [];

function smallTmpfs(): string {
  const dir = freshRoot("tiny");
  mkdirSync(dir, { recursive: true });
  const r = spawnSync("mount", ["-t", "tmpfs", "-o", "size=1m", "tmpfs", dir], { encoding: "utf8" });
  if (r.status !== 0) throw new Error(`mount failed: ${r.stderr}`);
  mounted.push(dir);
  return dir;
}

/** Every entry under the root (recursive), to compare before and after a failed push. */
function listing(root: string): string[] {
  return readdirSync(root, { recursive: true }).map(String).sort();
}

afterEach(async () => {
  await Promise.allSettled(open.splice(0).map((t) => t.close()));
  for (const m of mounted.splice(0)) spawnSync("umount", ["-l", m]);
  cleanupAll();
});

describe.skipIf(mountProblem !== null)(`shm on a full root${mountProblem ? ` (skipped: ${mountProblem})` : ""}`, { timeout: 30_000 }, () => {
  test("a push larger than the free space fails with TRANSPORT_NO_SPACE, leaves nothing behind, and smaller pushes still work", async () => {
    const root = smallTmpfs();
    const t = ShmTransport.open({ root, ttlMs: 300_000, slabBytes: 128 * 1024 * 1024 });
    open.push(t);
    const a = patternBytes(1, 600 * 1024);
    await t.push(blobKey("req-a", 0, "k"), a);
    const before = listing(root);
    const freeBefore = statfsSync(root).bfree;
    await expect(t.push(blobKey("req-big", 0, "k"), patternBytes(2, 2 * 1024 * 1024))).rejects.toMatchObject({ code: "TRANSPORT_NO_SPACE" });
    expect(listing(root)).toEqual(before);
    expect(statfsSync(root).bfree).toBe(freeBefore);
    expect(t.stats()).toMatchObject({ blobs: 1, bytes: a.byteLength });

    const b = patternBytes(3, 100_000);
    await t.push(blobKey("req-b", 0, "k"), b);
    const reader = ShmTransport.open({ root, ttlMs: 300_000, slabBytes: 1 << 20 });
    open.push(reader);
    expect(Buffer.from((await reader.pull(blobKey("req-b", 0, "k"), { timeoutMs: 1000 })).bytes).equals(b)).toBe(true);
    expect(Buffer.from((await reader.pull(blobKey("req-a", 0, "k"), { timeoutMs: 1000 })).bytes).equals(a)).toBe(true);
  });

  test("a push that waits for space (timeoutMs) gets it once another request is released", async () => {
    const root = smallTmpfs();
    const t = ShmTransport.open({ root, ttlMs: 300_000, slabBytes: 128 * 1024 * 1024 });
    const consumer = ShmTransport.open({ root, ttlMs: 300_000, slabBytes: 1 << 20 });
    open.push(t, consumer);
    await t.push(blobKey("req-a", 0, "k"), patternBytes(1, 600 * 1024));
    const c = patternBytes(4, 700 * 1024);
    await expect(t.push(blobKey("req-c", 0, "k"), c)).rejects.toMatchObject({ code: "TRANSPORT_NO_SPACE" });
    const waiting = t.push(blobKey("req-c", 0, "k"), c, { timeoutMs: 10_000 });
    await new Promise((r) => setTimeout(r, 100));
    await consumer.release("req-a"); // the consumer side frees it; the producer notices
    await waiting;
    expect(Buffer.from((await consumer.pull(blobKey("req-c", 0, "k"), { timeoutMs: 1000 })).bytes).equals(c)).toBe(true);
    expect(t.stats()).toMatchObject({ blobs: 1, bytes: c.byteLength });
    expect(readdirSync(root).filter((f) => f.startsWith(".new-"))).toEqual([]);
  });
});
