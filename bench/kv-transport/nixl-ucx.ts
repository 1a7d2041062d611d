// nixl-ucx: one 67.1 MB request (64 x 1 MiB blobs) pushed by a producer process and pulled by this
// process, over UCX_TLS=tcp and over shared memory (posix,self), against `ucx_perftest -t ucp_get`
// of the same 64 MiB with the same UCX_TLS, measured in the same run. The pull time (descriptor
// fetch, READ, CRC-32 check, ack) is what is compared: it is the decode side's load. The relay
// runs in its own process (airm-kv-relay), as it does when deployed.
//
// Run: pnpm bench kv-transport --transport nixl-ucx [--reps 7] [--perftest-iters 20] [--wires tcp,shm]
// This file is also the producer when run as `tsx nixl-ucx.ts --producer ADDR TLS`.

import { spawn, spawnSync } from "node:child_process";
import { once } from "node:events";
import { createServer } from "node:net";
import { createInterface } from "node:readline";
import { fileURLToPath, pathToFileURL } from "node:url";
import { dirname, join } from "node:path";
import { blobKey, flagOf, int, list, oneOf, patternBytes, text, type KVTransport } from "../../packages/rm-core/src/index.ts";
import { createNixlUcxTransport, shutdownEngines } from "../../packages/kv-nixl-ucx/src/index.ts";
import { spawnRelay } from "../../packages/kv-relay/src/index.ts";
import { LineChild, benchArgs, finalLine, fmt, progress, progressDone, summarize } from "../lib.ts";

const BLOBS = 64;
const BLOB_BYTES = 1 << 20;
const REQUEST_BYTES = BLOBS * BLOB_BYTES;
const POOL_MB = 160;
const WIRES = [
  { name: "tcp", tls: "tcp" },
  { name: "shm", tls: "posix,self" },
] as const;

const here = dirname(fileURLToPath(import.meta.url));
const packageDir = join(here, "..", "..", "packages", "kv-nixl-ucx");

// ---------------------------------------------------------------------------------------------
// Producer process: pushes a request whenever told, answers with its push time.

async function producerMain(addr: string, tls: string): Promise<void> {
  const t = await createNixlUcxTransport({ addr, tls, poolMb: POOL_MB });
  const blobs = Array.from({ length: BLOBS }, (_, i) => patternBytes(i + 1, BLOB_BYTES));
  const rl = createInterface({ input: process.stdin });
  console.log("ready");
  for await (const line of rl) {
    const [cmd, rid] = line.trim().split(" ");
    if (cmd === "push") {
      const t0 = performance.now();
      for (let i = 0; i < BLOBS; i++) await t.push(blobKey(rid, i >> 1, i & 1 ? "v" : "k"), blobs[i]);
      console.log(`pushed ${(performance.now() - t0).toFixed(3)}`);
    } else if (cmd === "stats") {
      console.log(`stats ${JSON.stringify(t.stats?.())}`);
    } else if (cmd === "exit") break;
  }
  await t.close();
  process.exit(0);
}

// ---------------------------------------------------------------------------------------------

/** The producer process: pushes a request when told and answers with its push time. */
const startProducer = async (addr: string, tls: string): Promise<LineChild> =>
  (await LineChild.start(["--import", "tsx", fileURLToPath(import.meta.url), "--producer", addr, tls], /^ready$/, packageDir)).child;

/** The blobs the spot check compares against, made once (making them per request would leave 3 MiB of garbage for the collector to clear during the next timed pull). */
const SPOT = [0, 31, 63].map((i) => ({ i, want: patternBytes(i + 1, BLOB_BYTES) }));

async function pullRequest(consumer: KVTransport, rid: string): Promise<number> {
  const t0 = performance.now();
  const got = await Promise.all(Array.from({ length: BLOBS }, (_, i) => consumer.pull(blobKey(rid, i >> 1, i & 1 ? "v" : "k"), { timeoutMs: 30_000 })));
  const ms = performance.now() - t0;
  // Spot-check content outside the timed region (the transport already checked every CRC-32).
  for (const { i, want } of SPOT) {
    const b = got[i].bytes;
    if (!Buffer.from(b.buffer, b.byteOffset, b.byteLength).equals(want)) throw new Error(`blob ${i} differs`);
  }
  return ms;
}

async function freePort(): Promise<number> {
  const srv = createServer();
  srv.listen(0, "127.0.0.1");
  await once(srv, "listening");
  const port = (srv.address() as { port: number }).port;
  srv.close();
  return port;
}

/** ucx_perftest ucp_get of the whole request; returns GB/s (1e9 bytes/s) per run. */
async function perftest(tls: string, iters: number): Promise<number> {
  const port = await freePort();
  const env = { ...process.env, UCX_TLS: tls };
  const server = spawn("ucx_perftest", ["-p", String(port)], { env, stdio: "ignore" });
  try {
    await new Promise((r) => setTimeout(r, 400));
    const client = spawnSync("ucx_perftest", ["127.0.0.1", "-p", String(port), "-t", "ucp_get", "-s", String(REQUEST_BYTES), "-n", String(iters)], {
      env,
      encoding: "utf8",
      timeout: 120_000,
    });
    const line = client.stdout?.split("\n").find((l) => l.startsWith("Final:"));
    if (!line) throw new Error(`ucx_perftest (UCX_TLS=${tls}) printed no Final line: ${client.stderr || client.stdout}`);
    // Final: iterations, latency 50%/avg/overall (usec), bandwidth avg/overall (MiB/s), msg rate avg/overall
    const cols = line.split(/\s+/).slice(1).map(Number);
    return (cols[5] * 1024 * 1024) / 1e9;
  } finally {
    if (server.exitCode === null) server.kill("SIGKILL");
  }
}

async function measureWire(addr: string, wire: (typeof WIRES)[number], reps: number, perftestIters: number) {
  const producer = await startProducer(addr, wire.tls);
  const consumer = await createNixlUcxTransport({ addr, tls: wire.tls, poolMb: POOL_MB });
  const pullMs: number[] = [];
  const pushMs: number[] = [];
  // ucx_perftest runs before, between and after the reps, so load that comes and goes on a
  // shared machine weighs on both sides of the ratio alike.
  const perf: number[] = [];
  const perfRuns = 3;
  try {
    for (let r = -1; r < reps; r++) {
      if (r === 0 || (r > 0 && r % Math.ceil(reps / (perfRuns - 1)) === 0)) {
        progress(`nixl-ucx ${wire.name}: ucx_perftest`);
        perf.push(await perftest(wire.tls, perftestIters));
      }
      progress(`nixl-ucx ${wire.name}: request ${r + 1}/${reps}`);
      const rid = `bench-${wire.name}-${r + 1}-${Date.now().toString(36)}`;
      const push = Number(await producer.ask(`push ${rid}`, "pushed"));
      const pull = await pullRequest(consumer, rid);
      await consumer.release(rid);
      if (r >= 0) {
        pushMs.push(push);
        pullMs.push(pull);
      }
    }
    perf.push(await perftest(wire.tls, perftestIters));
    // Every READ was acked: the producer frees each slot once its ack word changes.
    const until = Date.now() + 10_000;
    const stats = async (): Promise<{ blobs: number }> => JSON.parse(await producer.ask("stats", "stats"));
    let left = await stats();
    while (left.blobs !== 0 && Date.now() < until) {
      await new Promise((r) => setTimeout(r, 20));
      left = await stats();
    }
    if (left.blobs !== 0) throw new Error(`the producer still holds ${left.blobs} slots 10 s after every blob was read and acked`);
  } finally {
    await consumer.close();
    await producer.stop();
  }
  progressDone();
  const pull = summarize(pullMs);
  const push = summarize(pushMs);
  const perfGbps = summarize(perf).median;
  const gbps = REQUEST_BYTES / 1e9 / (pull.median / 1000);
  console.log(
    `nixl-ucx UCX_TLS=${wire.tls}: pull ${fmt(pull)} = ${gbps.toFixed(2)} GB/s; push ${fmt(push)}; ` +
      `ucx_perftest ucp_get ${perf.map((g) => g.toFixed(2)).join(", ")} GB/s (median ${perfGbps.toFixed(2)}); ratio ${(gbps / perfGbps).toFixed(2)}`,
  );
  return { gbps, perfGbps, ratio: gbps / perfGbps, pullMs: pull.median, pushMs: push.median };
}

/** Entry from bench/kv-transport.ts. */
export async function run(argv: string[]): Promise<void> {
  const { reps, perftestIters, wires } = benchArgs(
    "kv-transport --transport nixl-ucx",
    "one 67.1 MB request READ over UCX against ucx_perftest ucp_get, per wire",
    {
      transport: flagOf(text({ label: "name" }), { default: "nixl-ucx", doc: "the transport" }),
      reps: flagOf(int({ min: 1 }), { default: 7, doc: "measured repetitions per wire" }),
      perftestIters: flagOf(int({ min: 1 }), { default: 20, doc: "ucx_perftest iterations per run" }),
      wires: flagOf(list(oneOf(["tcp", "shm"] as const)), { default: ["tcp", "shm"], doc: "which UCX wires to measure" }),
    },
    argv,
  );
  const relay = await spawnRelay(["--listen", "127.0.0.1:0", "--max-mb", "64"]);
  try {
    const results: Record<string, Awaited<ReturnType<typeof measureWire>>> = {};
    for (const wire of WIRES) if (wires.includes(wire.name)) results[wire.name] = await measureWire(relay.address, wire, reps, perftestIters);
    const all = Object.values(results);
    const line: Record<string, unknown> = { bench: "kv-transport", transport: "nixl-ucx", bytes: REQUEST_BYTES };
    for (const [name, r] of Object.entries(results)) {
      Object.assign(line, {
        [`gbps_${name}`]: r.gbps,
        [`perftest_gbps_${name}`]: r.perfGbps,
        [`ratio_${name}`]: r.ratio,
        [`median_ms_${name}`]: r.pullMs,
        [`push_ms_${name}`]: r.pushMs,
      });
    }
    finalLine({
      ...line,
      gbps: Math.min(...all.map((r) => r.gbps)),
      perftest_gbps: Math.min(...all.map((r) => r.perfGbps)),
      ratio: Math.min(...all.map((r) => r.ratio)),
    });
  } finally {
    await relay.stop();
    await shutdownEngines();
  }
}

if (process.argv[1] && import.meta.url === pathToFileURL(process.argv[1]).href && process.argv[2] === "--producer") {
  await producerMain(process.argv[3], process.argv[4]);
}
