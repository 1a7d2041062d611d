// The sidecar's handle on agent/nixl_agent.py: one Python child that owns this host's NIXL
// agent, spoken to in JSON lines over its stdin/stdout (requests with ids, completion events).
// Only control crosses the pipe; the bytes stay in the registered arenas.

import { spawn, type ChildProcess } from "node:child_process";
import { existsSync } from "node:fs";
import { homedir } from "node:os";
import { join } from "node:path";
import { createInterface } from "node:readline";
import { fileURLToPath } from "node:url";
import { TransportError } from "@airm/rm-core";

/** The wheels this package is built and tested against (nixl and nixl-cu12 must match). */
export const NIXL_VERSION = "1.5.1";

/** Where scripts/tools/nixl.sh installs the wheels: a venv per version in the project's cache. */
export function defaultNixlPython(home = homedir()): string {
  return join(home, ".cache", "airm", `nixl-${NIXL_VERSION}`, "venv", "bin", "python");
}

export const AGENT_SCRIPT = fileURLToPath(new URL("../agent/nixl_agent.py", import.meta.url));

export interface AgentHello {
  agent: string;
  plugins: string[];
  backends: string[];
  pid: number;
  /** The unix socket taking file descriptors (SCM_RIGHTS), when one was asked for. */
  fdSocket: string | null;
}

export interface XferEvent {
  xfer: number;
  state: "DONE" | "ERR";
  error?: string;
}

type Reply = Record<string, unknown> & { id: number; ok: boolean; error?: string };

/** One protocol line, or null for anything that is not a JSON object. */
function parseLine(line: string): Record<string, unknown> | null {
  try {
    const v = JSON.parse(line) as unknown;
    return typeof v === "object" && v !== null ? (v as Record<string, unknown>) : null;
  } catch {
    return null;
  }
}

/** A running Python NIXL agent. `exited` settles when it ends (any reason). */
export class PythonAgent {
  readonly hello: AgentHello;
  readonly exited: Promise<string>;
  private readonly child: ChildProcess;
  private readonly pending = new Map<number, { resolve: (r: Reply) => void; reject: (e: Error) => void }>();
  private nextId = 1;
  private dead: string | null = null;
  private onXfer: (e: XferEvent) => void = () => undefined;

  private constructor(child: ChildProcess, hello: AgentHello, exited: Promise<string>, lines: AsyncIterable<string>) {
    this.child = child;
    this.hello = hello;
    this.exited = exited.then((why) => {
      this.dead = why;
      for (const p of this.pending.values()) p.reject(new TransportError(`nixl: the NIXL agent process ended (${why})`));
      this.pending.clear();
      return why;
    });
    void this.readLoop(lines);
  }

  /**
   * Starts `python agent/nixl_agent.py <name>` and waits for its ready line. Throws TransportError
   * with the agent's own words when the wheels are missing or NIXL does not start.
   */
  static async start(opts: {
    python: string;
    name: string;
    backends?: string[];
    fdSocket?: string;
    /** Runs NIXL's progress thread with this poll timeout (µs): peers READ from this agent (cross-host). */
    progressUs?: number;
    startTimeoutMs?: number;
    env?: Record<string, string | undefined>;
  }): Promise<PythonAgent> {
    if (!existsSync(opts.python)) {
      throw new TransportError(`nixl: no Python with the NIXL wheels at ${opts.python}; run scripts/tools/nixl.sh (or set AIRM_NIXL_PYTHON)`);
    }
    const child = spawn(
      opts.python,
      [
        "-u",
        AGENT_SCRIPT,
        opts.name,
        (opts.backends ?? ["UCX"]).join(","),
        ...(opts.fdSocket || opts.progressUs !== undefined ? [opts.fdSocket ?? ""] : []),
        ...(opts.progressUs !== undefined ? [String(opts.progressUs)] : []),
      ],
      {
        stdio: ["pipe", "pipe", "pipe"],
        env: opts.env ?? {},
      },
    );
    let stderr = "";
    child.stderr!.on("data", (d: Buffer) => {
      stderr = (stderr + d.toString()).slice(-4000);
    });
    const exited = new Promise<string>((resolve) => {
      child.once("exit", (code, signal) => resolve(signal ? `signal ${signal}` : `exit code ${code}`));
      child.once("error", (e) => resolve(e.message));
    });
    const rl = createInterface({ input: child.stdout! });
    const lines = rl[Symbol.asyncIterator]();
    const first = await Promise.race([
      lines.next().then((r) => (r.done ? null : r.value)),
      exited.then(() => null),
      new Promise<null>((r) => setTimeout(() => r(null), opts.startTimeoutMs ?? 60_000).unref()),
    ]);
    const msg = first ? parseLine(first) : null;
    if (msg?.event !== "ready") {
      child.kill("SIGKILL");
      const said = msg?.error ?? stderr.trim().split("\n").slice(-3).join(" | ");
      throw new TransportError(`nixl: the NIXL agent did not start: ${said || "no answer"}`);
    }
    const hello = {
      agent: String(msg.agent),
      plugins: msg.plugins as string[],
      backends: msg.backends as string[],
      pid: Number(msg.pid),
      fdSocket: (msg.fd_socket as string | null) ?? null,
    };
    return new PythonAgent(child, hello, exited, { [Symbol.asyncIterator]: () => lines });
  }

  /** Completion events of READs go here. */
  onTransfer(fn: (e: XferEvent) => void): void {
    this.onXfer = fn;
  }

  get alive(): boolean {
    return this.dead === null;
  }

  /** One request; rejects with TransportError carrying the agent's error text. */
  async call(op: string, args: Record<string, unknown> = {}): Promise<Record<string, unknown>> {
    if (this.dead) throw new TransportError(`nixl: the NIXL agent process ended (${this.dead})`);
    const id = this.nextId++;
    const reply = await new Promise<Reply>((resolve, reject) => {
      this.pending.set(id, { resolve, reject });
      this.child.stdin!.write(`${JSON.stringify({ id, op, ...args })}\n`);
    });
    if (!reply.ok) throw new TransportError(`nixl: ${op} failed in the NIXL agent: ${reply.error}`);
    return reply;
  }

  /** Ends the agent (SIGTERM, then SIGKILL after 2 s). */
  async stop(): Promise<void> {
    if (this.dead) return;
    this.child.stdin!.end();
    this.child.kill("SIGTERM");
    const t = setTimeout(() => this.child.kill("SIGKILL"), 2000);
    await this.exited;
    clearTimeout(t);
  }

  private async readLoop(lines: AsyncIterable<string>): Promise<void> {
    try {
      for await (const line of lines) {
        const msg = parseLine(line);
        if (!msg) continue;
        if (msg.event === "xfer") {
          this.onXfer(msg as unknown as XferEvent);
          continue;
        }
        const p = this.pending.get(Number(msg.id));
        if (p) {
          this.pending.delete(Number(msg.id));
          p.resolve(msg as Reply);
        }
      }
    } catch {
      // the pipe broke: `exited` reports why
    }
  }
}
