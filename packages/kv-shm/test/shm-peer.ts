// The other process of the cross-process tests: opens an shm endpoint on a given root and pushes
// or pulls one request, talking to the parent through stdout lines (JSON) and stdin commands.
//   push <root> <rid> <blobs> <size> <seed>  -> pushes, prints {"pushed":n}, waits for "close"/"release"
//   pull <root> <rid> <blobs> <timeoutMs> <release:0|1> -> prints {"waiting":true}, then {"sha256":[...]}

import { createHash } from "node:crypto";
import { createInterface } from "node:readline";
import { blobKey, patternBytes } from "@airm/rm-core";
import { ShmTransport } from "../src/index.ts";

const [mode, root, rid, blobsArg, a4, a5] = process.argv.slice(2);
const blobs = Number(blobsArg);
const t = ShmTransport.open({ root, ttlMs: 300_000, slabBytes: 8 * 1024 * 1024 });
const say = (o: unknown): void => void process.stdout.write(`${JSON.stringify(o)}\n`);

if (mode === "push") {
  const size = Number(a4);
  const seed = Number(a5);
  for (let i = 0; i < blobs; i++) await t.push(blobKey(rid, i, "k"), patternBytes(seed + i, size));
  say({ pushed: blobs, stats: t.stats() });
  for await (const line of createInterface({ input: process.stdin })) {
    if (line === "stats") say({ stats: t.stats() });
    if (line === "release") {
      await t.release(rid);
      say({ released: true });
    }
    if (line === "close") break;
  }
  process.stdin.destroy();
} else if (mode === "pull") {
  const timeoutMs = Number(a4);
  say({ waiting: true });
  const sums: string[] = [];
  for (let i = 0; i < blobs; i++) {
    const { bytes: got } = await t.pull(blobKey(rid, i, "k"), { timeoutMs });
    sums.push(createHash("sha256").update(got).digest("hex"));
  }
  if (a5 === "1") await t.release(rid);
  say({ sha256: sums });
} else {
  throw new Error(`unknown mode ${mode}`);
}
await t.close();
