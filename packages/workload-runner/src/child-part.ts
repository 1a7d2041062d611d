// One process of a local cluster (a sidecar, a worker, the gateway): spawned with its argv and
// environment, its output split into lines (kept as a tail for error reports, echoed through a
// callback), stopped with SIGTERM then SIGKILL. Knows nothing about what the process is.

import { spawn, type ChildProcess } from "node:child_process";
import { setPriority } from "node:os";

export interface PartSpec {
  /** Unique in the cluster: "kv-relay", "prefill", "prefill-2", "decode", "gateway"... */
  name: string;
  argv: string[];
  env: Record<string, string>;
  /** http://host:port of a worker or the gateway; host:port of a sidecar. */
  url: string;
  /** The rig host it runs on (airm up --topology); none: this machine's own namespace. */
  host?: string;
  /** How to tell it is up: GET <url><path> answers 200, or a TCP connect to host:port. */
  ready: { http: string } | "connect";
  /** Scheduling niceness to run at (higher: yields the CPU to the others; default unchanged). */
  nice?: number;
  /**
   * SIGTERM drains it (AIRM_DRAIN_S), so the cluster stops it before the others and waits that
   * long: the gateway ("front") first, then the workers ("worker").
   */
  drains?: "front" | "worker";
}

export class ChildPart {
  readonly child: ChildProcess;
  /** Resolves with the exit code (null when killed by a signal) once the process has exited. */
  readonly exited: Promise<number | null>;
  private readonly tail: string[] = [];
  private exitInfo: { code: number | null; signal: NodeJS.Signals | null } | null = null;

  constructor(
    readonly spec: PartSpec,
    baseEnv: Record<string, string | undefined>,
    onLine: (part: string, line: string) => void,
  ) {
    this.child = spawn(spec.argv[0], spec.argv.slice(1), { env: { ...baseEnv, ...spec.env }, stdio: ["ignore", "pipe", "pipe"] });
    if (spec.nice !== undefined && this.child.pid !== undefined) {
      try {
        setPriority(this.child.pid, spec.nice);
      } catch (e) {
        onLine(spec.name, `could not set niceness ${spec.nice}: ${(e as Error).message}`);
      }
    }
    this.exited = new Promise((resolve) => {
      this.child.once("exit", (code, signal) => {
        this.exitInfo = { code, signal };
        resolve(code);
      });
      this.child.once("error", (e) => {
        this.tail.push(String(e));
        this.exitInfo = { code: null, signal: null };
        resolve(null);
      });
    });
    for (const stream of [this.child.stdout!, this.child.stderr!]) {
      let buf = "";
      stream.setEncoding("utf8");
      stream.on("data", (chunk: string) => {
        buf += chunk;
        let i = buf.indexOf("\n");
        while (i >= 0) {
          const line = buf.slice(0, i);
          buf = buf.slice(i + 1);
          this.tail.push(line);
          if (this.tail.length > 200) this.tail.shift();
          onLine(spec.name, line);
          i = buf.indexOf("\n");
        }
      });
    }
  }

  get name(): string {
    return this.spec.name;
  }

  get url(): string {
    return this.spec.url;
  }

  get alive(): boolean {
    return this.exitInfo === null;
  }

  /** How it ended: "exited with code 1", "was killed by SIGKILL". */
  get howItEnded(): string {
    if (!this.exitInfo) return "is running";
    return this.exitInfo.signal ? `was killed by ${this.exitInfo.signal}` : `exited with code ${this.exitInfo.code}`;
  }

  /**
   * It ended the way a stop request ends a part: killed by SIGINT or SIGTERM before it had
   * handlers, or exited 0 after them (what a signal to the whole process group does).
   */
  get stoppedBySignal(): boolean {
    if (!this.exitInfo) return false;
    return this.exitInfo.signal === "SIGINT" || this.exitInfo.signal === "SIGTERM" || (this.exitInfo.signal === null && this.exitInfo.code === 0);
  }

  /** Its last output lines. */
  logs(lines = 200): string {
    return this.tail.slice(-lines).join("\n");
  }

  /** Sends `signal` (default SIGTERM), then SIGKILL after `graceMs`; resolves once it exited. */
  async stop(signal: NodeJS.Signals = "SIGTERM", graceMs = 5000): Promise<void> {
    if (!this.alive) return;
    this.child.kill(signal);
    const kill = setTimeout(() => this.child.kill("SIGKILL"), graceMs);
    await this.exited;
    clearTimeout(kill);
  }
}
