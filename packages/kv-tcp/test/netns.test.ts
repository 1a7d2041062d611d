// The relay in its own network namespace, reached over a veth pair: the bytes cross a real
// (virtual) link between two network stacks, not loopback. Needs root and iproute2; skipped
// with the reason otherwise. Still one machine: a multi-node network has not run. The namespace
// is a named one and the link's end is in this process's namespace: neither goes by itself, so
// a signal that stops the test removes them too (scripts/rig-cleanup.ts).

import { execFileSync } from "node:child_process";
import { blobKey, isAirmError, patternBytes } from "@airm/rm-core";
import { afterAll, beforeAll, expect, test } from "vitest";
import { createTcpTransport } from "../src/index.ts";
import { spawnRelay, type RelayProcess } from "@airm/kv-relay";
import { killTrees, onInterrupt } from "../../../scripts/rig-cleanup.ts";

const id = process.pid % 10000;
const ns = `airm-kvtcp-${id}`;
const hostIf = `kvt${id}h`;
const nsIf = `kvt${id}n`;
const subnet = `10.231.${id % 250}`;
const relayIp = `${subnet}.2`;

function ip(...args: string[]): void {
  execFileSync("ip", args, { stdio: ["ignore", "ignore", "pipe"] });
}

/** Removes the link and the namespace, once every process in it (the relay) is killed. */
function tearDown(): void {
  try {
    killTrees(
      execFileSync("ip", ["netns", "pids", ns], { encoding: "utf8", stdio: ["ignore", "pipe", "ignore"] })
        .split("\n")
        .filter(Boolean)
        .map(Number),
    );
  } catch {
    // no namespace (any more)
  }
  for (const args of [
    ["link", "del", hostIf],
    ["netns", "del", ns],
  ]) {
    try {
      ip(...args);
    } catch {
      // already gone
    }
  }
}

let forget = () => {};

function setUp(): string | undefined {
  if (process.getuid?.() !== 0) return "needs root to create a network namespace";
  try {
    ip("netns", "add", ns);
  } catch (e) {
    return `cannot create a network namespace: ${(e as Error).message.split("\n")[0]}`;
  }
  forget = onInterrupt(tearDown);
  ip("link", "add", hostIf, "type", "veth", "peer", "name", nsIf);
  ip("link", "set", nsIf, "netns", ns);
  ip("addr", "add", `${subnet}.1/24`, "dev", hostIf);
  ip("link", "set", hostIf, "up");
  ip("-n", ns, "addr", "add", `${relayIp}/24`, "dev", nsIf);
  ip("-n", ns, "link", "set", nsIf, "up");
  ip("-n", ns, "link", "set", "lo", "up");
  return undefined;
}

let skip: string | undefined;
let relay: RelayProcess | undefined;
beforeAll(async () => {
  skip = setUp();
  if (!skip) relay = await spawnRelay(["--listen", `${relayIp}:7400`], {}, ["ip", "netns", "exec", ns]);
});
afterAll(async () => {
  await relay?.stop();
  if (!skip) tearDown();
  forget();
});

test("a 64-blob request crosses a veth link to a relay in another network namespace, byte-exact", async (ctx) => {
  if (skip) ctx.skip(skip);
  const producer = createTcpTransport({ addr: relay!.address });
  const consumer = createTcpTransport({ addr: relay!.address });
  try {
    const blobs = Array.from({ length: 64 }, (_, i) => patternBytes(1000 + i, 1 << 20));
    await Promise.all(blobs.map((b, i) => producer.push(blobKey("ns-req", i >> 1, i & 1 ? "v" : "k"), b)));
    const got = await Promise.all(blobs.map((_, i) => consumer.pull(blobKey("ns-req", i >> 1, i & 1 ? "v" : "k"), { timeoutMs: 10_000 })));
    got.forEach(({ bytes: g }, i) => expect(Buffer.from(g.buffer, g.byteOffset, g.byteLength).equals(blobs[i]), `blob ${i}`).toBe(true));
    await consumer.release("ns-req");
    // The relay is only reachable through the link: nothing listens on this port on our loopback.
    const local = createTcpTransport({ addr: "127.0.0.1:7400" });
    try {
      await local.pull("ns-req/0/k", { timeoutMs: 100 }).then(
        () => expect.unreachable("a relay answered on loopback"),
        (e) => expect(isAirmError(e)).toBe(true),
      );
    } finally {
      await local.close();
    }
  } finally {
    await Promise.all([producer.close(), consumer.close()]);
  }
});

test("the link goes down during a pull: a typed timeout, not a hang; back up, the next request works", async (ctx) => {
  if (skip) ctx.skip(skip);
  const t = createTcpTransport({ addr: relay!.address });
  try {
    await t.push("ns-cut/0/k", patternBytes(7, 1000));
    ip("link", "set", hostIf, "down");
    let err: unknown;
    try {
      await t.pull("ns-never/0/k", { timeoutMs: 300 });
    } catch (e) {
      err = e;
    }
    expect(isAirmError(err, "TRANSPORT_TIMEOUT"), String(err)).toBe(true);
    ip("link", "set", hostIf, "up");
    const got = await t.pull("ns-cut/0/k", { timeoutMs: 5000 });
    expect(Buffer.from(got.bytes).equals(patternBytes(7, 1000))).toBe(true);
  } finally {
    try {
      ip("link", "set", hostIf, "up");
    } catch {
      // the namespace may already be gone
    }
    await t.close();
  }
});
