// nixl: one 67.1 MB request (64 x 1 MiB blobs) pushed by a producer process and pulled by this
// process through the host's NIXL agent sidecar (airm-kv-nixl-agent, its own process, as `airm
// up` runs it), against NIXL's own READ of the same 64 MiB between two agents (a few lines of
// Python on the same wheels, bench/kv-transport/nixl_read.py), measured in the same run. The pull
// time (lookup, bind / plan / submit over gRPC, the READ, the fence, the CRC-32 check) is what is
// compared. The control overhead alone is measured too: the same request of 64 one-byte blobs.
//
// Run: pnpm bench kv-transport --transport nixl [--reps 7]
// This file is also the producer when run as `tsx nixl.ts --producer ADDR`.

import { spawnSync } from "node:child_process";
import { existsSync } from "node:fs";
import { createInterface } from "node:readline";
import { dirname, join } from "node:path";
import { fileURLToPath, pathToFileURL } from "node:url";
import { blobKey, flagOf, int, kvCrc32, patternBytes, text, type KVTransport } from "../../packages/rm-core/src/index.ts";
import { NIXL_CONFIG, createNixlTransport, defaultNixlPython } from "../../packages/kv-nixl/src/index.ts";
import { LineChild, benchArgs, finalLine, fmt, progress, progressDone, summarize } from "../lib.ts";

const BLOBS = 64;
const BLOB_BYTES = 1 << 20;
const REQUEST_BYTES = BLOBS * BLOB_BYTES;
const POOL_MB = 160;
const here = dirname(fileURLToPath(import.meta.url));
const packageDir = join(here, "..", "..", "packages", "kv-nixl");

const open = (addr: string) => createNixlTransport(NIXL_CONFIG.resolve({ env: {}, options: { addr, poolMb: POOL_MB } }));

async function producerMain(addr: string): Promise<void> {
  const t = await open(addr);
  const blobs = Array.from({ length: BLOBS }, (_, i) => patternBytes(i + 1, BLOB_BYTES));
  const tiny = new Uint8Array([7]);
  const rl = createInterface({ input: process.stdin });
  console.log("ready");
  for await (const line of rl) {
    const [cmd, rid] = line.trim().split(" ");
    if (cmd === "push" || cmd === "push1") {
      const t0 = performance.now();
      await Promise.all(Array.from({ length: BLOBS }, (_, i) => t.push(blobKey(rid, i >> 1, i & 1 ? "v" : "k"), cmd === "push" ? blobs[i] : tiny)));
      console.log(`pushed ${(performance.now() - t0).toFixed(3)}`);
    } else if (cmd === "stats") console.log(`stats ${JSON.stringify(t.stats?.())}`);
    else if (cmd === "exit") break;
  }
  await t.close();
  process.exit(0);
}

const SPOT = [0, 31, 63].map((i) => ({ i, want: patternBytes(i + 1, BLOB_BYTES) }));

/** Milliseconds of the CRC-32 of every pulled byte once more (the check's own cost, measured alone). */
const crcMs: number[] = [];

async function pullRequest(consumer: KVTransport, rid: string, check: boolean): Promise<number> {
  const t0 = performance.now();
  const got = await Promise.all(Array.from({ length: BLOBS }, (_, i) => consumer.pull(blobKey(rid, i >> 1, i & 1 ? "v" : "k"), { timeoutMs: 30_000 })));
  const ms = performance.now() - t0;
  if (check) {
    const c0 = performance.now();
    for (const g of got) kvCrc32(g.bytes);
    crcMs.push(performance.now() - c0);
    for (const { i, want } of SPOT) {
      const b = got[i].bytes;
      if (!Buffer.from(b.buffer, b.byteOffset, b.byteLength).equals(want)) throw new Error(`blob ${i} differs`);
    }
  }
  return ms;
}

/**
 * NIXL alone: `reps` READs of the request between two agents; milliseconds of each. Without
 * progress threads (as the sidecar runs its agent), or with the wheel's default ones.
 */
function nixlAlone(python: string, reps: number, progressThreads = false): number[] {
  const args = [join(here, "nixl_read.py"), String(BLOBS), String(BLOB_BYTES), String(reps), ...(progressThreads ? ["progress-thread"] : [])];
  const r = spawnSync(python, args, { encoding: "utf8", timeout: 300_000 });
  const line = r.stdout?.trim().split("\n").pop() ?? "";
  if (r.status !== 0 || !line.startsWith("{")) throw new Error(`nixl_read.py failed: ${r.stderr?.slice(-800)}`);
  const out = JSON.parse(line) as { ms: number[]; equal: boolean };
  if (!out.equal) throw new Error("nixl_read.py: the bytes READ differ from the source");
  return out.ms;
}

export async function run(argv: string[]): Promise<void> {
  const { reps } = benchArgs(
    "kv-transport --transport nixl",
    "one 67.1 MB request through the NIXL agent sidecar against NIXL's own READ between two agents",
    {
      transport: flagOf(text({ label: "name" }), { default: "nixl", doc: "the transport" }),
      reps: flagOf(int({ min: 1 }), { default: 7, doc: "measured repetitions" }),
    },
    argv,
  );
  const python = defaultNixlPython();
  if (!existsSync(python)) {
    finalLine({ bench: "kv-transport", transport: "nixl", skipped: `the NIXL wheels are not installed (no ${python}); run scripts/tools/nixl.sh` });
    return;
  }
  const { child: sidecar, match } = await LineChild.start([join(packageDir, "bin", "airm-kv-nixl-agent.mjs"), "--listen", "127.0.0.1:0"], /listening on (\S+)/, packageDir);
  const addr = match[1];
  const { child: producer } = await LineChild.start(["--import", "tsx", fileURLToPath(import.meta.url), "--producer", addr], /^ready$/, packageDir);
  const consumer = await open(addr);
  const pullMs: number[] = [];
  const pushMs: number[] = [];
  const ctlMs: number[] = [];
  const alone: number[] = [];
  const aloneDefault: number[] = [];
  try {
    for (let r = -1; r < reps; r++) {
      if (r % 3 === 0) {
        progress("nixl: NIXL alone (two agents, nixl_read.py)");
        alone.push(...nixlAlone(python, 5));
        aloneDefault.push(...nixlAlone(python, 5, true));
      }
      progress(`nixl: request ${r + 1}/${reps}`);
      const rid = `bench-${r + 1}-${Date.now().toString(36)}`;
      const push = Number(await producer.ask(`push ${rid}`, "pushed"));
      const pull = await pullRequest(consumer, rid, true);
      await consumer.release(rid);
      const rid1 = `${rid}-ctl`;
      await producer.ask(`push1 ${rid1}`, "pushed");
      const ctl = await pullRequest(consumer, rid1, false);
      await consumer.release(rid1);
      if (r >= 0) {
        pushMs.push(push);
        pullMs.push(pull);
        ctlMs.push(ctl);
      }
    }
    alone.push(...nixlAlone(python, 5));
    aloneDefault.push(...nixlAlone(python, 5, true));
  } finally {
    await consumer.close();
    await producer.stop();
    await sidecar.stop("SIGTERM");
  }
  progressDone();
  const pull = summarize(pullMs);
  const push = summarize(pushMs);
  const ctl = summarize(ctlMs);
  const ref = summarize(alone);
  const refDefault = summarize(aloneDefault);
  const gbps = REQUEST_BYTES / 1e9 / (pull.median / 1000);
  const refGbps = REQUEST_BYTES / 1e9 / (ref.median / 1000);
  console.log(`nixl (sidecar): pull ${fmt(pull)} = ${gbps.toFixed(2)} GB/s; push ${fmt(push)}`);
  const crc = summarize(crcMs);
  console.log(`control alone (64 one-byte blobs, same calls): pull ${fmt(ctl)}; CRC-32 of the 64 MiB alone (this process, one core): ${fmt(crc)}`);
  console.log(`NIXL alone (two agents, one READ of 64 descriptors, no progress threads): ${fmt(ref)} = ${refGbps.toFixed(2)} GB/s; ratio ${(gbps / refGbps).toFixed(2)}`);
  console.log(`NIXL alone with the wheel's default progress threads (each spins a core): ${fmt(refDefault)}; ratio ${(refDefault.median / pull.median).toFixed(2)}`);
  finalLine({
    bench: "kv-transport",
    transport: "nixl",
    bytes: REQUEST_BYTES,
    gbps,
    median_ms: pull.median,
    push_ms: push.median,
    control_ms: ctl.median,
    crc_ms: crc.median,
    nixl_alone_ms: ref.median,
    nixl_alone_gbps: refGbps,
    ratio: gbps / refGbps,
    nixl_default_threads_ms: refDefault.median,
    ratio_to_default_threads: refDefault.median / pull.median,
  });
}

if (process.argv[1] && import.meta.url === pathToFileURL(process.argv[1]).href && process.argv[2] === "--producer") {
  await producerMain(process.argv[3]);
}
