// How the launcher reaches parts that run in the rig's network namespaces (airm up --topology)
// without adding anything to its own namespace but loopback listeners. In each host a small
// agent listens on a unix socket (the file system is shared, the network is not); a connection to
// it names a TCP address in its first line ("10.77.0.1:8000\n") and is then piped to that address
// (or, for "?10.77.0.1:7400\n", answered "1" once the address accepts a connection: a probe).
// In the launcher's namespace a forwarder listens on 127.0.0.1:PORT and pipes each connection
// through the agent of the host that owns the target address. Connections are bounded, and
// close() ends every listener, connection and agent.

import type { ChildProcess } from "node:child_process";
import { mkdirSync, rmSync } from "node:fs";
import { connect, createServer, type Server, type Socket } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { sweepStaleClusterDirs } from "./local-cluster.ts";

/** Connections a forwarder or an agent holds at once; more are refused (closed at once). */
export const MAX_BRIDGE_CONNECTIONS = 512;

/** The in-namespace agent: `node -e AGENT <socket path>`. It exits once its parent (the launcher) is gone. */
const AGENT = `
const net = require("node:net"), fs = require("node:fs");
const sock = process.argv[1], ppid = process.ppid, conns = new Set();
try { fs.unlinkSync(sock); } catch {}
const srv = net.createServer((c) => {
  if (conns.size >= ${MAX_BRIDGE_CONNECTIONS}) return c.destroy();
  conns.add(c);
  let head = Buffer.alloc(0), up = null;
  const done = () => { conns.delete(c); c.destroy(); if (up) up.destroy(); };
  c.on("error", done).on("close", done);
  const onData = (d) => {
    head = Buffer.concat([head, d]);
    const i = head.indexOf(10);
    if (i < 0) { if (head.length > 256) done(); return; }
    c.off("data", onData);
    c.pause();
    const line = head.subarray(0, i).toString(), rest = head.subarray(i + 1);
    const probe = line.startsWith("?"), addr = probe ? line.slice(1) : line, j = addr.lastIndexOf(":");
    up = net.connect(Number(addr.slice(j + 1)), addr.slice(0, j));
    up.on("error", done).on("close", done);
    up.once("connect", () => {
      if (probe) return c.end("1", done);
      if (rest.length) up.write(rest);
      c.pipe(up);
      up.pipe(c);
      c.resume();
    });
  };
  c.on("data", onData);
});
const stop = () => { srv.close(); for (const c of conns) c.destroy(); try { fs.unlinkSync(sock); } catch {} process.exit(0); };
process.on("SIGTERM", stop).on("SIGINT", stop);
setInterval(() => { if (process.ppid !== ppid) stop(); }, 500);
srv.listen(sock, () => process.stdout.write("ready\\n"));
`;

/** Starts a process in a host's namespace (NetnsRig.spawn). */
export type SpawnIn = (host: string, cmd: string, args: string[], opts: { stdio: ("ignore" | "pipe" | "inherit")[] }) => ChildProcess;

function splitAddr(hostPort: string): { host: string; port: number } {
  const i = hostPort.lastIndexOf(":");
  return { host: hostPort.slice(0, i), port: Number(hostPort.slice(i + 1)) };
}

export class NsBridge {
  /** The agents' sockets: `<tmp>/airm-up-bridge-<launcher pid>` (one left by a killed launcher is swept by the next). */
  private readonly dir = join(tmpdir(), `airm-up-bridge-${process.pid}`);

  private constructor() {
    sweepStaleClusterDirs(tmpdir(), "airm-up-bridge-");
    rmSync(this.dir, { recursive: true, force: true });
    mkdirSync(this.dir, { recursive: true });
  }
  /** The agent's socket of each host, by the host's address. */
  private readonly sockets = new Map<string, string>();
  private readonly agents: ChildProcess[] = [];
  private readonly servers: Server[] = [];
  private readonly conns = new Set<Socket>();
  /** Loopback forwarders made for probes, by target host:port. */
  private readonly forwarders = new Map<string, Promise<number>>();
  private closed = false;

  /** Starts an agent in each host (`hosts`: name -> address) and waits until all listen. */
  static async open(hosts: Map<string, string>, spawnIn: SpawnIn, timeoutMs = 10_000): Promise<NsBridge> {
    const b = new NsBridge();
    try {
      await Promise.all([...hosts].map(([name, address], i) => b.startAgent(name, address, join(b.dir, `h${i}.sock`), spawnIn, timeoutMs)));
    } catch (e) {
      await b.close();
      throw e;
    }
    return b;
  }

  private startAgent(name: string, address: string, sock: string, spawnIn: SpawnIn, timeoutMs: number): Promise<void> {
    const p = spawnIn(name, process.execPath, ["-e", AGENT, sock], { stdio: ["ignore", "pipe", "pipe"] });
    this.agents.push(p);
    this.sockets.set(address, sock);
    let err = "";
    p.stderr!.on("data", (d: Buffer) => (err = (err + d.toString()).slice(-1000)));
    return new Promise((resolve, reject) => {
      const t = setTimeout(() => reject(new Error(`the bridge agent in ${name} did not start within ${timeoutMs} ms`)), timeoutMs);
      p.stdout!.once("data", () => {
        clearTimeout(t);
        resolve();
      });
      p.once("exit", (code) => {
        clearTimeout(t);
        reject(new Error(`the bridge agent in ${name} exited ${code}: ${err.trim()}`));
      });
    });
  }

  private socketFor(hostPort: string): string {
    const s = this.sockets.get(splitAddr(hostPort).host);
    if (!s) throw new Error(`no rig host has the address of ${hostPort}`);
    return s;
  }

  /** Listens on 127.0.0.1:`port` (0: a free one) and pipes each connection to `target` (host:port in the rig); resolves with the port. */
  forward(port: number, target: string): Promise<number> {
    const p = this.listen(port, target);
    if (!this.forwarders.has(target)) this.forwarders.set(target, p);
    return p;
  }

  private listen(port: number, target: string): Promise<number> {
    const sock = this.socketFor(target);
    const srv = createServer((c) => {
      if (this.closed || this.conns.size >= MAX_BRIDGE_CONNECTIONS) return c.destroy();
      const u = connect(sock);
      this.conns.add(c);
      this.conns.add(u);
      const done = () => {
        this.conns.delete(c);
        this.conns.delete(u);
        c.destroy();
        u.destroy();
      };
      for (const s of [c, u]) s.on("error", done).on("close", done);
      u.write(`${target}\n`);
      c.pipe(u);
      u.pipe(c);
    });
    this.servers.push(srv);
    return new Promise((resolve, reject) => {
      srv.once("error", reject);
      srv.listen(port, "127.0.0.1", () => resolve((srv.address() as { port: number }).port));
    });
  }

  /** A URL on this process's loopback that reaches `url` (http://host:port/... in the rig). */
  async http(url: string): Promise<string> {
    const u = new URL(url);
    const target = `${u.hostname}:${u.port}`;
    const port = await (this.forwarders.get(target) ?? this.forward(0, target));
    return url.replace(/^(https?:\/\/)[^/]+/, (_, scheme: string) => `${scheme}127.0.0.1:${port}`);
  }

  /** Whether `hostPort` in the rig accepts a TCP connection (asked of the agent of the host that owns it). */
  connect(hostPort: string, timeoutMs = 2000): Promise<boolean> {
    return new Promise((resolve) => {
      const s = connect(this.socketFor(hostPort));
      let ok = false;
      const t = setTimeout(() => s.destroy(), timeoutMs);
      s.on("data", (d) => (ok ||= d.toString().startsWith("1")));
      s.on("error", () => {});
      s.on("close", () => {
        clearTimeout(t);
        resolve(ok);
      });
      s.write(`?${hostPort}\n`);
    });
  }

  /** Closes every forwarder and connection, stops the agents and removes their sockets. */
  async close(): Promise<void> {
    this.closed = true;
    for (const c of this.conns) c.destroy();
    await Promise.all(this.servers.map((s) => new Promise((r) => s.close(r))));
    const gone = this.agents.filter((p) => p.exitCode === null && p.signalCode === null).map((p) => new Promise((r) => p.once("exit", r)));
    for (const p of this.agents) p.kill("SIGTERM");
    await Promise.race([Promise.all(gone), new Promise((r) => setTimeout(r, 3000))]);
    for (const p of this.agents) if (p.exitCode === null && p.signalCode === null) p.kill("SIGKILL");
    rmSync(this.dir, { recursive: true, force: true });
  }
}
