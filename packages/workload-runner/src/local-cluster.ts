// `airm up`: a whole PD cluster on 127.0.0.1 (KV relay when the transport needs one, prefill
// worker, decode worker, gateway), each a child process started through the rngd-pd workload
// runner's command builder. Waits until every part is healthy, supervises them, and on a signal
// or a child's death stops the rest and removes the cluster's /dev/shm folder.

import { spawn, type ChildProcess } from "node:child_process";
import { existsSync, readdirSync, rmSync } from "node:fs";
import { connect } from "node:net";
import { ConfigError } from "@airm/rm-core";
import { buildCommand, type ProcessCommand } from "./rngd-pd-workload.ts";
import { binPath } from "./package-bins.ts";

export interface UpOptions {
  /** Model folder or .gguf file. */
  model: string;
  kvTransport: "shm" | "tcp" | "nixl-ucx";
  decodeBackend: "atom" | "rngd";
  port: number;
  prefillPort: number;
  decodePort: number;
  relayPort: number;
  metricsPort?: number;
  seqLen: number;
  /** How long to wait for every part to become healthy (ms). */
  readyTimeoutMs: number;
  /** Where lines of the cluster's own narration go. */
  log(line: string): void;
  /** Child output lines, prefixed with the part's name. */
  childLog(part: string, line: string): void;
}

interface Part {
  name: string;
  cmd: ProcessCommand;
  /** URL whose 200 means healthy; absent for the relay (a TCP connect suffices). */
  health?: string;
  tcpPort?: number;
  child?: ChildProcess;
  tail: string[];
}

export interface RunningCluster {
  url: string;
  shmRoot?: string;
  /** Resolves with the exit code once the cluster has stopped (signal: 0, a part died: 1). */
  done: Promise<number>;
  stop(reason?: string): Promise<void>;
}

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

async function healthy(part: Part): Promise<boolean> {
  if (part.tcpPort !== undefined) {
    return new Promise((resolve) => {
      const s = connect(part.tcpPort!, "127.0.0.1");
      s.once("connect", () => {
        s.destroy();
        resolve(true);
      });
      s.once("error", () => resolve(false));
    });
  }
  try {
    const r = await fetch(part.health!, { signal: AbortSignal.timeout(2000) });
    return r.status === 200;
  } catch {
    return false;
  }
}

async function portFree(port: number): Promise<boolean> {
  return new Promise((resolve) => {
    const s = connect(port, "127.0.0.1");
    s.once("connect", () => {
      s.destroy();
      resolve(false);
    });
    s.once("error", () => resolve(true));
  });
}

const SHM_PREFIX = "/dev/shm/airm-up-";

/** Removes the shm folders of earlier `airm up` runs whose process is gone (killed without cleaning up). */
export function sweepStaleShmFolders(): string[] {
  const removed: string[] = [];
  let names: string[] = [];
  try {
    names = readdirSync("/dev/shm");
  } catch {
    return removed;
  }
  for (const name of names) {
    const m = /^airm-up-(\d+)$/.exec(name);
    if (!m) continue;
    const pid = Number(m[1]);
    try {
      process.kill(pid, 0);
      continue; // still running
    } catch (e) {
      if ((e as NodeJS.ErrnoException).code !== "ESRCH") continue; // alive but not ours
    }
    rmSync(`/dev/shm/${name}`, { recursive: true, force: true });
    removed.push(`/dev/shm/${name}`);
  }
  return removed;
}

/** Starts the cluster; resolves once every part is healthy (or rejects with the reason). */
export async function startLocalCluster(o: UpOptions): Promise<RunningCluster> {
  // every part stops by itself if this process dies without stopping it (e.g. SIGKILL)
  const env: Record<string, string> = { AIRM_PARENT_PID: String(process.pid) };
  let shmRoot: string | undefined;
  if (o.kvTransport === "shm") {
    for (const dir of sweepStaleShmFolders()) o.log(`airm up: removed ${dir}, left by an earlier airm up that was killed`);
    shmRoot = `${SHM_PREFIX}${process.pid}`;
    env.PD_SHM_ROOT = shmRoot;
  } else {
    env.AIRM_KV_TCP_ADDR = `127.0.0.1:${o.relayPort}`;
  }
  const common = { kv_transport: o.kvTransport, host: "127.0.0.1", seq_len: o.seqLen, env };
  const parts: Part[] = [];
  if (o.kvTransport !== "shm") {
    parts.push({
      name: "kv-relay",
      cmd: { argv: [process.execPath, binPath("@airm/kv-tcp", "airm-kv-relay"), "--listen", `127.0.0.1:${o.relayPort}`], env },
      tcpPort: o.relayPort,
      tail: [],
    });
  }
  const prefillUrl = `http://127.0.0.1:${o.prefillPort}`;
  const decodeUrl = `http://127.0.0.1:${o.decodePort}`;
  parts.push(
    { name: "prefill", cmd: buildCommand({ kind: "prefill", model: o.model }, { ...common, port: o.prefillPort }), health: `${prefillUrl}/health`, tail: [] },
    {
      name: "decode",
      cmd: buildCommand({ kind: "decode", model: o.model }, { ...common, port: o.decodePort, backend: o.decodeBackend }),
      health: `${decodeUrl}/health`,
      tail: [],
    },
    {
      name: "gateway",
      cmd: buildCommand(
        { kind: "serve", model: o.model },
        { kv_transport: o.kvTransport, host: "127.0.0.1", port: o.port, prefill_url: prefillUrl, decode_url: decodeUrl, metrics_port: o.metricsPort, env },
      ),
      health: `http://127.0.0.1:${o.port}/health`,
      tail: [],
    },
  );
  const ports: [string, number][] = [
    ["--port", o.port],
    ["prefill port", o.prefillPort],
    ["decode port", o.decodePort],
  ];
  if (o.kvTransport !== "shm") ports.push(["relay port", o.relayPort]);
  if (o.metricsPort !== undefined) ports.push(["--metrics-port", o.metricsPort]);
  for (const [what, port] of ports) {
    if (!(await portFree(port))) throw new ConfigError(what, `127.0.0.1:${port} is already in use; stop what listens there or pick another port`);
  }

  let stopping = false;
  let resolveDone!: (code: number) => void;
  const done = new Promise<number>((r) => (resolveDone = r));

  const stop = async (reason?: string): Promise<void> => {
    if (stopping) return;
    stopping = true;
    if (reason) o.log(reason);
    const alive = parts.filter((p) => p.child && p.child.exitCode === null && p.child.signalCode === null);
    await Promise.all(
      alive.reverse().map(
        (p) =>
          new Promise<void>((resolve) => {
            const c = p.child!;
            const kill = setTimeout(() => c.kill("SIGKILL"), 5000);
            c.once("exit", () => {
              clearTimeout(kill);
              resolve();
            });
            c.kill("SIGTERM");
          }),
      ),
    );
    if (shmRoot && existsSync(shmRoot)) rmSync(shmRoot, { recursive: true, force: true });
  };

  const failed = (p: Part, code: number | null, signal: NodeJS.Signals | null) => {
    if (stopping) return;
    const how = signal ? `was killed by ${signal}` : `exited with code ${code}`;
    const tail = p.tail.slice(-12).map((l) => `  ${p.name}| ${l}`).join("\n");
    void stop(`airm up: the ${p.name} ${how}; stopping the cluster.${tail ? `\nits last output:\n${tail}` : ""}`).then(() => resolveDone(1));
  };

  for (const p of parts) {
    const child = spawn(p.cmd.argv[0], p.cmd.argv.slice(1), { env: { ...process.env, ...p.cmd.env }, stdio: ["ignore", "pipe", "pipe"] });
    p.child = child;
    for (const stream of [child.stdout!, child.stderr!]) {
      let buf = "";
      stream.setEncoding("utf8");
      stream.on("data", (chunk: string) => {
        buf += chunk;
        let i: number;
        while ((i = buf.indexOf("\n")) >= 0) {
          const line = buf.slice(0, i);
          buf = buf.slice(i + 1);
          p.tail.push(line);
          if (p.tail.length > 50) p.tail.shift();
          o.childLog(p.name, line);
        }
      });
    }
    child.once("exit", (code, signal) => failed(p, code, signal));
    child.once("error", (e) => {
      p.tail.push(String(e));
      failed(p, null, null);
    });
  }

  const deadline = Date.now() + o.readyTimeoutMs;
  const pending = new Set(parts);
  while (pending.size > 0) {
    if (stopping) {
      const code = await done;
      throw new Error(`the cluster did not come up (exit ${code}); see the output above`);
    }
    if (Date.now() > deadline) {
      const names = [...pending].map((p) => p.name).join(", ");
      await stop();
      throw new Error(`not healthy within ${o.readyTimeoutMs} ms: ${names}`);
    }
    for (const p of [...pending]) {
      if (await healthy(p)) {
        pending.delete(p);
        o.log(`airm up: ${p.name} is healthy`);
      }
    }
    if (pending.size) await sleep(250);
  }
  return {
    url: `http://127.0.0.1:${o.port}`,
    shmRoot,
    done,
    stop: async (reason) => {
      await stop(reason);
      resolveDone(0);
    },
  };
}
