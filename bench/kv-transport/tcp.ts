// pnpm bench kv-transport --transport tcp [--reps N] [--no-crc] [--connections N] [--no-pool] [--no-direct-reads] [--iperf-seconds S] [--tls]
// One 67.1 MB request (64 x 1 MiB) through airm-kv-relay: the relay, the producer and the consumer
// are three processes on loopback. Push and pull are timed separately, with 1 and 8 requests in
// flight. Pushes pass each blob's CRC-32 as the prefill worker does (it takes them once for the
// manifest); a push where the transport computes them itself is reported beside (push1_self_crc).
// iperf3 over loopback (one stream, run between the reps and once after) is the reference,
// medians on both sides. A plain Node socket moving 64 MiB into a 64 MiB destination is reported
// beside it (what the platform allows with the same memory behaviour). With --tls the same
// request also crosses a second relay serving mutual TLS (AIRM_TLS_DIR, a throwaway CA) in each
// rep, right after the plain one, and the tls_* figures and tls_ratio (TLS over plain) join the
// final line: {"bench":"kv-transport","transport":"tcp","push_gbps",...,"iperf3_gbps","ratio"}.

import { spawn, type ChildProcess } from "node:child_process";
import { once } from "node:events";
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import net from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { createInterface } from "node:readline";
import { fileURLToPath, pathToFileURL } from "node:url";
import { spawnRelay } from "../../packages/kv-relay/src/index.ts";
import { flagOf, int, makeTlsDir, num, oneOf, switchOf, text } from "../../packages/rm-core/src/index.ts";
import { benchArgs, finalLine, fmt, progress, progressDone, summarize } from "../lib.ts";

const BLOBS = 64;
const BLOB_BYTES = 1 << 20;
const REQUEST_BYTES = BLOBS * BLOB_BYTES;
const self = fileURLToPath(import.meta.url);

// ---------------------------------------------------------------------------------------------
// Child roles: a producer or a consumer driven by JSON lines on stdin, answering on stdout.

async function role(which: "producer" | "consumer", addr: string, crc: boolean, connections: number, tlsDir: string | undefined): Promise<void> {
  const { createTcpTransport } = await import("../../packages/kv-tcp/src/index.ts");
  const { blobKey, patternBytes, kvCrc32 } = await import("../../packages/rm-core/src/index.ts");
  const t = createTcpTransport({ addr, crc, connections, tlsDir });
  const blobs = which === "producer" ? Array.from({ length: BLOBS }, (_, i) => patternBytes(i + 1, BLOB_BYTES)) : [];
  // What a prefill worker has in hand: each blob's CRC-32, taken once for the manifest when the
  // layer was made (outside the timed push, as in the worker, where it is not repeated).
  const crcs = blobs.map((b) => kvCrc32(b));
  const dests: Uint8Array[][] = []; // per slot in flight: 64 pre-touched destinations (a decode worker's KV buffers)
  const reply = (o: unknown) => process.stdout.write(`${JSON.stringify(o)}\n`);
  for await (const line of createInterface({ input: process.stdin })) {
    const cmd = JSON.parse(line) as { op: "push" | "push-self-crc" | "pull" | "release" | "exit"; rids: string[] };
    if (cmd.op === "exit") break;
    const t0 = performance.now();
    const c0 = process.cpuUsage();
    if (cmd.op === "push") {
      // As the prefill worker pushes: with the CRC-32 it already has (the relay checks the bytes against it).
      await Promise.all(cmd.rids.flatMap((rid) => blobs.map((b, i) => t.push(blobKey(rid, i >> 1, i & 1 ? "v" : "k"), b, crc ? { crc32: crcs[i] } : {}))));
    } else if (cmd.op === "push-self-crc") {
      // A caller without a CRC: the transport reads each blob once more to compute it.
      await Promise.all(cmd.rids.flatMap((rid) => blobs.map((b, i) => t.push(blobKey(rid, i >> 1, i & 1 ? "v" : "k"), b))));
    } else if (cmd.op === "pull") {
      while (dests.length < cmd.rids.length) dests.push(Array.from({ length: BLOBS }, () => new Uint8Array(BLOB_BYTES).fill(1)));
      const got = await Promise.all(cmd.rids.flatMap((rid, r) => dests[r].map((into, i) => t.pull(blobKey(rid, i >> 1, i & 1 ? "v" : "k"), { into, timeoutMs: 60_000 }))));
      // Spot check outside the timed part is unnecessary: each blob's CRC-32 was checked on arrival unless --no-crc.
      if (got.some((g) => g.bytes.byteLength !== BLOB_BYTES)) throw new Error("short blob");
    } else if (cmd.op === "release") {
      await Promise.all(cmd.rids.map((rid) => t.release(rid)));
    }
    const c = process.cpuUsage(c0);
    reply({ ms: performance.now() - t0, cpuMs: (c.user + c.system) / 1000 });
  }
  await t.close();
  process.stdin.destroy();
}

// A second reference: what plain Node sockets reach on this machine with the same memory behaviour
// as the transport (64 MiB from a buffer, read straight into a pre-touched 64 MiB destination with
// onread; no framing, no CRC). iperf3 copies from and into small cache-hot buffers.

async function rawSender(): Promise<void> {
  const src = Buffer.alloc(REQUEST_BYTES, 3);
  const server = net.createServer({ noDelay: true });
  server.listen(0, "127.0.0.1");
  await once(server, "listening");
  process.stdout.write(`${JSON.stringify({ port: (server.address() as net.AddressInfo).port })}\n`);
  const [sock] = (await once(server, "connection")) as [net.Socket];
  sock.setNoDelay(true);
  for await (const line of createInterface({ input: process.stdin })) {
    if ((JSON.parse(line) as { op: string }).op !== "send") break;
    const t0 = performance.now();
    sock.write(src);
    await once(sock, "data"); // the receiver's one-byte "got it all"
    process.stdout.write(`${JSON.stringify({ ms: performance.now() - t0 })}\n`);
  }
  sock.destroy();
  server.close();
  process.stdin.destroy();
}

async function rawReceiver(port: number): Promise<void> {
  const dest = Buffer.alloc(REQUEST_BYTES, 1);
  const spare = Buffer.alloc(64);
  let fill = 0;
  const sock: net.Socket = net.connect({
    port,
    host: "127.0.0.1",
    noDelay: true,
    onread: {
      buffer: () => (fill < REQUEST_BYTES ? dest.subarray(fill) : spare),
      callback: (n: number) => {
        fill += n;
        if (fill === REQUEST_BYTES) {
          fill = 0;
          sock.write("k");
        }
        return true;
      },
    },
  });
  sock.on("error", () => {});
  await once(sock, "close");
}

// ---------------------------------------------------------------------------------------------
// The driver.

class Child {
  private readonly lines: AsyncIterator<string>;
  constructor(readonly proc: ChildProcess) {
    this.lines = createInterface({ input: proc.stdout! })[Symbol.asyncIterator]();
  }
  /** The next line from the child, parsed. */
  async line<T>(): Promise<T> {
    const r = await this.lines.next();
    if (r.done) throw new Error(`bench child exited (code ${this.proc.exitCode})`);
    return JSON.parse(r.value) as T;
  }
  /** Runs one command in the child; resolves to its wall time (ms). Its CPU time is in `lastCpuMs`. */
  async send(op: string, rids: string[] = []): Promise<number> {
    this.proc.stdin!.write(`${JSON.stringify({ op, rids })}\n`);
    const r = await this.line<{ ms: number; cpuMs?: number }>();
    this.lastCpuMs = r.cpuMs ?? NaN;
    return r.ms;
  }
  lastCpuMs = NaN;
  async stop(): Promise<void> {
    if (this.proc.exitCode !== null) return;
    this.proc.stdin!.end(`${JSON.stringify({ op: "exit", rids: [] })}\n`);
    const timer = setTimeout(() => this.proc.kill("SIGKILL"), 5000);
    await once(this.proc, "exit");
    clearTimeout(timer);
  }
}

function spawnRole(which: string, addr: string, crc: boolean, connections: number, tlsDir?: string): Child {
  const tls = tlsDir ? ["--tls-dir", tlsDir] : [];
  const args = ["--import", "tsx", self, "--role", which, "--addr", addr, "--connections", String(connections), ...(crc ? [] : ["--no-crc"]), ...tls];
  const p = spawn(process.execPath, args, { stdio: ["pipe", "pipe", "inherit"] });
  return new Child(p);
}

/** CPU time (user + system, ms, 10 ms resolution) a process has used so far; NaN where /proc is missing. */
function cpuMsOf(pid: number | undefined): number {
  try {
    const f = readFileSync(`/proc/${pid}/stat`, "utf8").split(") ")[1].split(" ");
    return ((Number(f[11]) + Number(f[12])) * 1000) / 100;
  } catch {
    return NaN;
  }
}

async function freePort(): Promise<number> {
  const s = net.createServer().listen(0, "127.0.0.1");
  await once(s, "listening");
  const port = (s.address() as net.AddressInfo).port;
  await new Promise((r) => s.close(r));
  return port;
}

/** One iperf3 run over loopback (one stream, `seconds` long); GB/s received. */
async function iperf3(seconds: number): Promise<number> {
  const port = await freePort();
  const server = spawn("iperf3", ["-s", "-1", "--forceflush", "-p", String(port)], { stdio: ["ignore", "pipe", "inherit"] });
  server.on("error", (e) => console.error(`iperf3 server: ${e.message} (install iperf3)`));
  for await (const line of createInterface({ input: server.stdout! })) if (/Server listening/.test(line)) break;
  server.stdout!.resume(); // keep draining so the server can exit
  const client = spawn("iperf3", ["-c", "127.0.0.1", "-p", String(port), "-t", String(seconds), "-J"], { stdio: ["ignore", "pipe", "inherit"] });
  let out = "";
  client.stdout!.on("data", (d: Buffer) => (out += d.toString()));
  await once(client, "close");
  if (server.exitCode === null) await once(server, "exit");
  const j = JSON.parse(out) as { end: { sum_received: { bits_per_second: number } } };
  return j.end.sum_received.bits_per_second / 8 / 1e9;
}

/** One relay with its producer and consumer: the plain one, and with --tls one serving mutual TLS. */
interface Lane {
  /** Prefix of its result rows ("" or "tls_"). */
  prefix: string;
  relay: Awaited<ReturnType<typeof spawnRelay>>;
  producer: Child;
  consumer: Child;
  /** CPU per request (ms), summed over the measured reps: where the time goes, robust to a busy machine. */
  cpu: { pusher: number; puller: number; relayPush: number; relayPull: number; requests: number };
}

async function startLane(prefix: string, relayEnv: Record<string, string>, crc: boolean, connections: number, tlsDir?: string): Promise<Lane> {
  const relay = await spawnRelay(["--listen", "127.0.0.1:0", "--max-mb", "1024"], { ...relayEnv, ...(tlsDir ? { AIRM_TLS_DIR: tlsDir } : {}) });
  const producer = spawnRole("producer", relay.address, crc, connections, tlsDir);
  const consumer = spawnRole("consumer", relay.address, crc, connections, tlsDir);
  return { prefix, relay, producer, consumer, cpu: { pusher: 0, puller: 0, relayPush: 0, relayPull: 0, requests: 0 } };
}

async function stopLane(l: Lane): Promise<void> {
  await Promise.allSettled([l.producer.stop(), l.consumer.stop()]);
  l.relay.proc.kill("SIGTERM");
}

const gbps = (k: number, ms: number) => (k * REQUEST_BYTES) / 1e9 / (ms / 1000);

/** One request set of `k` in flight through a lane: push, pull, release; recorded unless `warm`. */
async function round(l: Lane, k: number, rids: string[], res: Record<string, number[]>, warm: boolean): Promise<void> {
  const r0 = cpuMsOf(l.relay.proc.pid);
  const pushMs = await l.producer.send("push", rids);
  const r1 = cpuMsOf(l.relay.proc.pid);
  const pullMs = await l.consumer.send("pull", rids);
  const r2 = cpuMsOf(l.relay.proc.pid);
  const pullerCpu = l.consumer.lastCpuMs;
  await l.consumer.send("release", rids);
  if (warm) return; // warm-up: faults in the relay pool and the JIT
  l.cpu.pusher += l.producer.lastCpuMs;
  l.cpu.puller += pullerCpu;
  l.cpu.relayPush += r1 - r0;
  l.cpu.relayPull += r2 - r1;
  l.cpu.requests += k;
  (res[`${l.prefix}push${k}`] ??= []).push(gbps(k, pushMs));
  (res[`${l.prefix}pull${k}`] ??= []).push(gbps(k, pullMs));
}

/** The CPU line of a lane and its figures for the final line. */
function cpuOf(l: Lane): Record<string, number> {
  const per = (x: number) => x / l.cpu.requests;
  console.log(
    `${l.prefix ? "TLS: " : ""}CPU per request: pusher ${per(l.cpu.pusher).toFixed(1)} ms, relay receiving ${per(l.cpu.relayPush).toFixed(1)} ms, ` +
      `relay sending ${per(l.cpu.relayPull).toFixed(1)} ms, puller ${per(l.cpu.puller).toFixed(1)} ms`,
  );
  return {
    [`${l.prefix}cpu_ms_pusher`]: per(l.cpu.pusher),
    [`${l.prefix}cpu_ms_relay_receiving`]: per(l.cpu.relayPush),
    [`${l.prefix}cpu_ms_relay_sending`]: per(l.cpu.relayPull),
    [`${l.prefix}cpu_ms_puller`]: per(l.cpu.puller),
  };
}

/** The --tls figures of the final line: TLS push and pull, and TLS over plain (min of push and pull each). */
function tlsFigures(s: Record<string, { median: number }>): Record<string, number> {
  if (!s.tls_push1) return {};
  const plain = Math.min(s.push1.median, s.pull1.median);
  const tls = Math.min(s.tls_push1.median, s.tls_pull1.median);
  console.log(`TLS over plain (min of push and pull, 1 in flight): ${(tls / plain).toFixed(3)}`);
  return {
    tls_push_gbps: s.tls_push1.median,
    tls_pull_gbps: s.tls_pull1.median,
    tls_push_gbps_8: s.tls_push8.median,
    tls_pull_gbps_8: s.tls_pull8.median,
    tls_ratio: tls / plain,
    tls_ratio_8: Math.min(s.tls_push8.median, s.tls_pull8.median) / Math.min(s.push8.median, s.pull8.median),
  };
}

export async function run(argv: string[]): Promise<void> {
  const a = args(argv);
  const { reps, connections, iperfSeconds } = a;
  const crc = !a.noCrc;
  // Ablations of the relay's memory path: fresh (untouched) buffers per push, chunk copies instead of direct reads.
  const relayEnv = { AIRM_KV_TCP_POOL: a.noPool ? "0" : "1", AIRM_KV_TCP_DIRECT_READS: a.noDirectReads ? "0" : "1" };
  const certs = a.tls ? mkdtempSync(join(tmpdir(), "airm-bench-tls-")) : undefined;
  const lanes = [await startLane("", relayEnv, crc, connections)];
  if (certs) lanes.push(await startLane("tls_", relayEnv, crc, connections, makeTlsDir(certs)));
  const [plain] = lanes;
  const res: Record<string, number[]> = { push1: [], pull1: [], push8: [], pull8: [], push1_self_crc: [] };
  const iperf: number[] = [];
  const raw: number[] = [];
  const rawSend = new Child(spawn(process.execPath, ["--import", "tsx", self, "--role", "raw-sender"], { stdio: ["pipe", "pipe", "inherit"] }));
  const { port: rawPort } = await rawSend.line<{ port: number }>();
  const rawRecv = spawn(process.execPath, ["--import", "tsx", self, "--role", "raw-receiver", "--port", String(rawPort)], { stdio: ["ignore", "inherit", "inherit"] });
  const rawRound = async () => {
    for (let i = 0; i < 3; i++) raw.push(gbps(1, await rawSend.send("send")));
  };
  try {
    let n = 0;
    for (let rep = -1; rep < reps; rep++) {
      // The reference runs between the reps, so both see the same (shared, noisy) machine.
      if (rep >= 0) {
        iperf.push(await iperf3(iperfSeconds));
        await rawRound();
      }
      for (const k of [1, 8]) {
        for (const lane of lanes) {
          progress(`tcp: rep ${rep + 1}/${reps}, ${k} in flight${lane.prefix ? ", TLS" : ""}`);
          await round(
            lane,
            k,
            Array.from({ length: k }, () => `bench-${n++}`),
            res,
            rep < 0,
          );
        }
      }
      if (crc) {
        // The same request pushed by a caller that passes no CRC-32 (reported, not in the ratio).
        const rids = [`bench-${n++}`];
        const ms = await plain.producer.send("push-self-crc", rids);
        await plain.consumer.send("pull", rids);
        await plain.consumer.send("release", rids);
        if (rep >= 0) res.push1_self_crc.push(gbps(1, ms));
      }
    }
    progressDone();
    iperf.push(await iperf3(iperfSeconds));
    await rawRound();
  } finally {
    await Promise.allSettled([...lanes.map(stopLane), rawSend.stop()]);
    rawRecv.kill("SIGTERM");
    if (certs) rmSync(certs, { recursive: true, force: true });
  }
  if (!res.push1_self_crc.length) delete res.push1_self_crc;
  const s = Object.fromEntries(Object.entries(res).map(([k, v]) => [k, summarize(v)]));
  const ref = summarize(iperf).median;
  for (const [k, v] of Object.entries(s)) {
    console.log(
      `${k.padEnd(10)} ${fmt(v, "GB/s")}  (${(REQUEST_BYTES / 1e6).toFixed(1)} MB per request${crc ? ", CRC-32 on" : ", CRC off"}; reps: ${res[k].map((x) => x.toFixed(2)).join(" ")})`,
    );
  }
  console.log(`iperf3 loopback, 1 stream, between reps: ${fmt(summarize(iperf), "GB/s")}`);
  console.log(`plain Node socket, 64 MiB into a 64 MiB destination (no framing, no CRC): ${fmt(summarize(raw), "GB/s")}`);
  const cpu = Object.assign({}, ...lanes.map(cpuOf));
  const tls = tlsFigures(s);
  const push = s.push1.median;
  const pull = s.pull1.median;
  finalLine({
    bench: "kv-transport",
    transport: "tcp",
    push_gbps: push,
    pull_gbps: pull,
    push_gbps_8: s.push8.median,
    push_gbps_self_crc: s.push1_self_crc?.median ?? null,
    pull_gbps_8: s.pull8.median,
    push_ms: (REQUEST_BYTES / 1e9 / push) * 1000,
    pull_ms: (REQUEST_BYTES / 1e9 / pull) * 1000,
    iperf3_gbps: ref,
    ratio: Math.min(push, pull) / ref,
    node_socket_gbps: summarize(raw).median,
    ...cpu,
    ratio_to_node_socket: Math.min(push, pull) / summarize(raw).median,
    ...tls,
    reps,
    crc,
    connections,
    relay_pool: relayEnv.AIRM_KV_TCP_POOL === "1",
    relay_direct_reads: relayEnv.AIRM_KV_TCP_DIRECT_READS === "1",
    tls_compared: a.tls,
  });
}

/** The flags of this bench, and of its child roles (`--role`). */
const FLAGS = {
  transport: flagOf(text({ label: "name" }), { default: "tcp", doc: "the transport" }),
  reps: flagOf(int({ min: 1 }), { default: 8, doc: "measured repetitions" }),
  noCrc: switchOf({ doc: "no CRC-32 on the wire (pusher, relay, puller)" }),
  connections: flagOf(int({ min: 1, max: 64 }), { default: 2, doc: "connections per process to the relay" }),
  iperfSeconds: flagOf(num({ positive: true }), { default: 1, doc: "length of each iperf3 reference run" }),
  noPool: switchOf({ doc: "ablation: the relay allocates every blob buffer afresh" }),
  noDirectReads: switchOf({ doc: "ablation: the relay copies each chunk into place" }),
  tls: switchOf({ doc: "also move each request through a relay serving mutual TLS (a throwaway CA), in the same reps: tls_* rows and tls_ratio" }),
  tlsDir: flagOf(text({ label: "path" }), { doc: "internal: the TLS folder of a child role (AIRM_TLS_DIR)" }),
  role: flagOf(oneOf(["producer", "consumer", "raw-sender", "raw-receiver"] as const), { doc: "internal: run as one of the bench's child processes" }),
  addr: flagOf(text({ label: "host:port" }), { doc: "internal: the relay of a child role" }),
  port: flagOf(int({ min: 1, max: 65535 }), { doc: "internal: the raw sender's port" }),
};

/** This bench's arguments (strict: an unknown flag is an error). */
function args(argv: string[]) {
  return benchArgs("kv-transport --transport tcp", "one 67.1 MB request through airm-kv-relay against iperf3", FLAGS, argv);
}

if (process.argv[1] && pathToFileURL(process.argv[1]).href === import.meta.url) {
  const a = args(process.argv.slice(2));
  if (a.role === "producer" || a.role === "consumer") await role(a.role, a.addr!, !a.noCrc, a.connections, a.tlsDir);
  else if (a.role === "raw-sender") await rawSender();
  else if (a.role === "raw-receiver") await rawReceiver(a.port!);
  else await run(process.argv.slice(2));
}
