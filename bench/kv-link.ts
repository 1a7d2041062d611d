// pnpm bench kv-link [--rate 1gbit,10gbit,unshaped] [--transports tcp,nixl-ucx,nixl] [--reps N] [--iperf-seconds S]
// The KV transports across a real link: three hosts of scripts/netns-rig (prefill-node,
// decode-node, relay-node; one network namespace each, joined by a switch, every host's egress
// shaped with tc tbf at --rate, or not shaped at all for "unshaped"). A producer on prefill-node
// pushes 67.1 MB requests (64 x 1 MiB blobs: Llama-3.1-8B at S=512, as the seed measured), a
// consumer on decode-node pulls them, and airm-kv-relay runs on relay-node. One request at a time
// and 8 in flight. The reference is iperf3 (one stream, prefill-node to decode-node, over links of
// the same shape) run between the reps of the same run.
//
// What crosses which link: `tcp` pushes the bytes to the relay (prefill-node's link) and pulls them
// from it (relay-node's link), so a request crosses a link twice; `nixl-ucx` copies them into the
// producer's registered arena (push: no bytes on the wire but the descriptor) and the consumer
// READs them from the producer's host over UCX's TCP transport (prefill-node's link, once);
// `nixl` the same through the hosts' NIXL agent sidecars (cross-host mode, descriptors in the relay).
// Every blob's CRC-32 is checked on arrival in both.
//
// Needs root (network namespaces), iproute2, iperf3 and libucx. Final JSON line:
// {"bench":"kv-link", "rates": {...}, "ratio_to_iperf3": {"tcp": x, "nixl-ucx": y} (at the first rate)}.

import { type ChildProcess, spawnSync } from "node:child_process";
import { once } from "node:events";
import { createInterface } from "node:readline";
import { fileURLToPath, pathToFileURL } from "node:url";
import { spawnRelay } from "../packages/kv-relay/src/index.ts";
import { flagOf, int, list, num, oneOf, text } from "../packages/rm-core/src/index.ts";
import { NetnsRig, TBF_RATE } from "../scripts/netns-rig/rig.ts";
import { benchArgs, finalLine, fmt, progress, progressDone, summarize } from "./lib.ts";

const BLOBS = 64;
const BLOB_BYTES = 1 << 20;
const REQUEST_BYTES = BLOBS * BLOB_BYTES;
const IN_FLIGHT = [1, 8] as const;
const self = fileURLToPath(import.meta.url);
const TRANSPORTS = ["tcp", "nixl-ucx", "nixl"] as const;
type Transport = (typeof TRANSPORTS)[number];

// ---------------------------------------------------------------------------------------------
// The endpoint process (run in a host's namespace): JSON lines on stdin, {ms} answers on stdout.

async function endpoint(transport: Transport, addr: string): Promise<void> {
  const { blobKey, patternBytes, kvCrc32 } = await import("../packages/rm-core/src/index.ts");
  let t: import("../packages/rm-core/src/index.ts").KVTransport;
  let shutdown = async () => {};
  if (transport === "tcp") {
    const { createTcpTransport } = await import("../packages/kv-tcp/src/index.ts");
    t = createTcpTransport({ addr, crc: true, connections: 2 });
  } else if (transport === "nixl") {
    // its host's sidecar (AIRM_KV_NIXL_ADDR, set by the driver), which finds other hosts' blobs through the relay
    const nixl = await import("../packages/kv-nixl/src/index.ts");
    const { FencedTransport } = await import("../packages/rm-core/src/index.ts");
    t = new FencedTransport(await nixl.NixlCopyTransport.open(nixl.NIXL_CONFIG.resolve({ env: process.env, options: { poolMb: 640 } })));
  } else {
    const ucx = await import("../packages/kv-nixl-ucx/src/index.ts");
    // 8 requests in flight must fit in the arenas: 8 x 64 MiB plus room
    t = await ucx.createNixlUcxTransport({ addr, tls: "tcp", poolMb: 640 });
    shutdown = ucx.shutdownEngines;
  }
  const blobs = Array.from({ length: BLOBS }, (_, i) => patternBytes(i + 1, BLOB_BYTES));
  // what a prefill worker has in hand: each blob's CRC-32, taken once when the layer was made
  const crcs = blobs.map((b) => kvCrc32(b));
  const dests: Uint8Array[][] = []; // per request in flight: a decode worker's pre-touched KV buffers
  const key = (rid: string, i: number) => blobKey(rid, i >> 1, i & 1 ? "v" : "k");
  const reply = (o: unknown) => process.stdout.write(`${JSON.stringify(o)}\n`);
  reply({ ready: true });
  for await (const line of createInterface({ input: process.stdin })) {
    const cmd = JSON.parse(line) as { op: "push" | "pull" | "release" | "exit"; rids: string[] };
    if (cmd.op === "exit") break;
    const t0 = performance.now();
    if (cmd.op === "push") {
      await Promise.all(cmd.rids.flatMap((rid) => blobs.map((b, i) => t.push(key(rid, i), b, { crc32: crcs[i] }))));
    } else if (cmd.op === "pull") {
      while (dests.length < cmd.rids.length) dests.push(Array.from({ length: BLOBS }, () => new Uint8Array(BLOB_BYTES).fill(1)));
      const got = await Promise.all(cmd.rids.flatMap((rid, r) => dests[r].map((into, i) => t.pull(key(rid, i), { into, timeoutMs: 120_000 }))));
      if (got.some((g) => g.bytes.byteLength !== BLOB_BYTES)) throw new Error("short blob");
    } else if (cmd.op === "release") {
      await Promise.all(cmd.rids.map((rid) => t.release(rid)));
    }
    const ms = performance.now() - t0;
    if (cmd.op === "pull") {
      // outside the timed part: three blobs of the last request compared byte for byte (every CRC-32 was checked on arrival)
      const last = dests[cmd.rids.length - 1];
      for (const i of [0, 31, 63]) if (!Buffer.from(last[i]).equals(blobs[i])) throw new Error(`blob ${i} differs after the pull`);
    }
    reply({ ms });
  }
  await t.close();
  await shutdown();
  process.stdin.destroy();
}

// ---------------------------------------------------------------------------------------------
// The driver (in the caller's namespace; every process it starts runs in one of the rig's hosts).

class Endpoint {
  private readonly lines: AsyncIterator<string>;
  constructor(readonly proc: ChildProcess) {
    this.lines = createInterface({ input: proc.stdout! })[Symbol.asyncIterator]();
  }
  async next<T>(): Promise<T> {
    const r = await this.lines.next();
    if (r.done) throw new Error(`a kv-link endpoint exited (code ${this.proc.exitCode}, signal ${this.proc.signalCode})`);
    return JSON.parse(r.value) as T;
  }
  async send(op: string, rids: string[] = []): Promise<number> {
    this.proc.stdin!.write(`${JSON.stringify({ op, rids })}\n`);
    return (await this.next<{ ms: number }>()).ms;
  }
  async stop(): Promise<void> {
    if (this.proc.exitCode !== null || this.proc.signalCode !== null) return;
    const exited = once(this.proc, "exit");
    this.proc.stdin!.end(`${JSON.stringify({ op: "exit", rids: [] })}\n`);
    const timer = setTimeout(() => this.proc.kill("SIGKILL"), 5000);
    await exited;
    clearTimeout(timer);
  }
}

async function startEndpoint(rig: NetnsRig, host: string, transport: Transport, addr: string): Promise<Endpoint> {
  const p = rig.spawn(host, process.execPath, ["--import", "tsx", self, "--role", "endpoint", "--transports", transport, "--addr", addr], {
    stdio: ["pipe", "pipe", "inherit"],
    env: { ...process.env, AIRM_LOG_LEVEL: "warn", AIRM_KV_NIXL_ADDR: `${rig.host(host).address}:7500` },
  });
  const e = new Endpoint(p);
  await e.next<{ ready: boolean }>();
  return e;
}

/** One iperf3 run (one stream) from prefill-node to decode-node; GB/s received. */
function iperf3(rig: NetnsRig, seconds: number): number {
  const server = rig.spawn("decode-node", "iperf3", ["-s", "-1", "-B", rig.host("decode-node").address, "-p", "5201"], { stdio: "ignore" });
  try {
    for (let attempt = 0; ; attempt++) {
      const r = spawnSync(
        "nsenter",
        ["-t", String(rig.host("prefill-node").pid), "-n", "--", "iperf3", "-c", rig.host("decode-node").address, "-p", "5201", "-t", String(seconds), "-J"],
        { encoding: "utf8", timeout: (seconds + 30) * 1000 },
      );
      let j: { error?: string; end?: { sum_received?: { bits_per_second: number } } } = {};
      try {
        j = JSON.parse(r.stdout);
      } catch {
        // no JSON: iperf3 failed before it started
      }
      const bps = j.end?.sum_received?.bits_per_second;
      if (r.status === 0 && !j.error && bps) return bps / 8 / 1e9;
      // the server may not listen yet
      if (attempt >= 20) throw new Error(`iperf3 across the rig failed: ${j.error ?? (r.stderr || r.stdout)}`);
      spawnSync("sleep", ["0.1"]);
    }
  } finally {
    server.kill("SIGKILL");
  }
}

/**
 * nixl: a NIXL agent sidecar on the prefill and decode hosts, cross-host (each announces its
 * publications in the relay and READs other hosts' blobs). UCX is held to TCP over eth0: the
 * namespaces share this machine, where UCX would otherwise move the bytes through shared memory.
 */
async function startSidecars(rig: NetnsRig, relay: string): Promise<void> {
  const env = { ...process.env, AIRM_LOG_LEVEL: "warn", AIRM_KV_TCP_ADDR: relay, AIRM_KV_NIXL_CROSS_HOST: "1", UCX_TLS: "tcp", UCX_NET_DEVICES: "eth0" };
  const bin = fileURLToPath(new URL("../packages/kv-nixl/bin/airm-kv-nixl-agent.mjs", import.meta.url));
  await Promise.all(
    ["prefill-node", "decode-node"].map(
      (h) =>
        new Promise<void>((resolve, reject) => {
          const p = rig.spawn(h, process.execPath, [bin, "--listen", `${rig.host(h).address}:7500`], { stdio: ["ignore", "pipe", "inherit"], env });
          let out = "";
          p.stdout!.on("data", (d: Buffer) => {
            out += d.toString();
            if (out.includes("listening on")) resolve();
          });
          p.once("exit", (code) => reject(new Error(`the NIXL sidecar on ${h} exited ${code} before listening`)));
        }),
    ),
  );
}

interface LinkResult {
  transport: Transport;
  ms: Record<string, number[]>;
}

/** Both transports over one rig (one link shape). */
async function measureRate(rate: string, transports: Transport[], reps: number, iperfSeconds: number) {
  const shaped = rate !== "unshaped";
  const rig = await NetnsRig.up({
    hosts: ["prefill-node", "decode-node", "relay-node"],
    link: shaped ? { rate, latency: "50ms", mtu: 1500 } : { mtu: 1500 }, // the rig scales tbf's burst with the rate
  });
  const iperf: number[] = [];
  const results: LinkResult[] = [];
  try {
    const relayIp = rig.host("relay-node").address;
    const relay = await spawnRelay(["--listen", `${relayIp}:7400`, "--max-mb", "1200"], { AIRM_LOG_LEVEL: "warn" }, [
      "nsenter",
      "-t",
      String(rig.host("relay-node").pid),
      "-n",
      "--",
    ]);
    try {
      if (transports.includes("nixl")) await startSidecars(rig, relay.address);
      for (const transport of transports) {
        const producer = await startEndpoint(rig, "prefill-node", transport, relay.address);
        const consumer = await startEndpoint(rig, "decode-node", transport, relay.address);
        const ms: Record<string, number[]> = { push1: [], pull1: [], push8: [], pull8: [] };
        let n = 0;
        try {
          for (let rep = -1; rep < reps; rep++) {
            if (rep >= 0) iperf.push(iperf3(rig, iperfSeconds));
            for (const k of IN_FLIGHT) {
              progress(`kv-link ${rate} ${transport}: rep ${rep + 1}/${reps}, ${k} in flight`);
              const rids = Array.from({ length: k }, () => `link-${transport}-${n++}`);
              const push = await producer.send("push", rids);
              const pull = await consumer.send("pull", rids);
              await consumer.send("release", rids);
              if (rep < 0) continue; // warm-up: the relay's pool, the arenas, the JIT
              ms[`push${k}`].push(push);
              ms[`pull${k}`].push(pull);
            }
          }
        } finally {
          await Promise.allSettled([producer.stop(), consumer.stop()]);
        }
        results.push({ transport, ms });
      }
      iperf.push(iperf3(rig, iperfSeconds));
    } finally {
      await relay.stop();
    }
  } finally {
    await rig.down();
  }
  progressDone();
  return { iperf, results };
}

/** The figures of one transport at one rate, against iperf3's median of the same run. */
function figures(r: LinkResult, iperfGbps: number) {
  const med = (k: string) => summarize(r.ms[k]).median;
  const gbps = (k: string, n: number) => (n * REQUEST_BYTES) / 1e9 / (med(k) / 1000);
  // the directions a request's bytes cross the link in: tcp both (to and from the relay), nixl-ucx the READ only
  const crossings = r.transport === "tcp" ? 2 : 1;
  const gbps8 = r.transport === "tcp" ? Math.min(gbps("push8", 8), gbps("pull8", 8)) : gbps("pull8", 8);
  const lineRateMs = ((crossings * REQUEST_BYTES) / 1e9 / iperfGbps) * 1000;
  const oneMs = med("push1") + med("pull1");
  return {
    push_ms: med("push1"),
    pull_ms: med("pull1"),
    push_pull_ms: oneMs,
    line_rate_ms: lineRateMs,
    push_pull_over_line_rate: oneMs / lineRateMs,
    push_gbps_8: gbps("push8", 8),
    pull_gbps_8: gbps("pull8", 8),
    gbps_8: gbps8,
    ratio_to_iperf3: gbps8 / iperfGbps,
  };
}

const FLAGS = {
  rate: flagOf(list(text({ label: "rate" })), { default: ["1gbit"], doc: "link rates (tc tbf: 100mbit, 1gbit, 10gbit, ...; unshaped = no qdisc), one rig each" }),
  transports: flagOf(list(oneOf(TRANSPORTS)), { default: [...TRANSPORTS], doc: "transports to measure" }),
  reps: flagOf(int({ min: 1 }), { default: 3, doc: "measured repetitions (each: 1 request, then 8 in flight)" }),
  iperfSeconds: flagOf(num({ positive: true }), { default: 2, doc: "length of each iperf3 reference run" }),
  role: flagOf(oneOf(["endpoint"] as const), { doc: "internal: run as a producer or consumer endpoint" }),
  addr: flagOf(text({ label: "host:port" }), { doc: "internal: the relay of an endpoint" }),
};

async function main(argv: string[]): Promise<void> {
  const a = benchArgs("kv-link", "the KV transports across a shaped link between network namespaces, against iperf3 over the same link", FLAGS, argv);
  if (a.role === "endpoint") return endpoint(a.transports[0]!, a.addr!);
  if (process.getuid?.() !== 0) {
    console.error("kv-link needs root: it makes network namespaces (CAP_NET_ADMIN)");
    process.exit(2);
  }
  for (const r of a.rate) if (r !== "unshaped" && !TBF_RATE.test(r)) throw new Error(`--rate: like 1gbit, 100mbit or unshaped, got ${r}`);
  const out: Record<string, Record<string, unknown>> = {};
  for (const rate of a.rate) {
    const { iperf, results } = await measureRate(rate, a.transports, a.reps, a.iperfSeconds);
    const ref = summarize(iperf).median;
    console.log(`${rate}: iperf3 prefill-node -> decode-node, 1 stream: ${fmt(summarize(iperf), "GB/s", 3)}`);
    const row: Record<string, unknown> = { iperf3_gbps: ref };
    for (const r of results) {
      const f = figures(r, ref);
      console.log(
        `${rate} ${r.transport.padEnd(8)} one request: push ${fmt(summarize(r.ms.push1))}, pull ${fmt(summarize(r.ms.pull1))}; ` +
          `push + pull ${f.push_pull_ms.toFixed(0)} ms = ${f.push_pull_over_line_rate.toFixed(2)} x line rate (${f.line_rate_ms.toFixed(0)} ms); ` +
          `8 in flight: push ${f.push_gbps_8.toFixed(3)} GB/s, pull ${f.pull_gbps_8.toFixed(3)} GB/s; ratio to iperf3 ${f.ratio_to_iperf3.toFixed(2)}`,
      );
      row[r.transport] = f;
    }
    out[rate] = row;
  }
  const first = out[a.rate[0]!]!;
  finalLine({
    bench: "kv-link",
    request_mb: REQUEST_BYTES / 1e6,
    reps: a.reps,
    rates: out,
    ratio_to_iperf3: Object.fromEntries(a.transports.map((t) => [t, Number((first[t] as { ratio_to_iperf3: number }).ratio_to_iperf3.toFixed(3))])),
  });
}

if (process.argv[1] && pathToFileURL(process.argv[1]).href === import.meta.url) await main(process.argv.slice(2));
