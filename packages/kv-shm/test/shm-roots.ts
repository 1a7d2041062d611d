// Per-test shm folders and child processes for the integration tests, always cleaned up.

import { spawn, type ChildProcess } from "node:child_process";
import { randomBytes } from "node:crypto";
import { rmSync } from "node:fs";
import { createInterface } from "node:readline";
import { fileURLToPath } from "node:url";

const roots: string[] = [];
const children: ChildProcess[] = [];

/** A fresh folder path under /dev/shm (not created), removed by cleanupAll. */
export function freshRoot(tag: string): string {
  const root = `/dev/shm/kv-shm-test-${tag}-${process.pid}-${randomBytes(3).toString("hex")}`;
  roots.push(root);
  return root;
}

export interface Peer {
  child: ChildProcess;
  /** The next JSON line the peer prints. */
  next(): Promise<Record<string, unknown>>;
  send(line: string): void;
  exited: Promise<number | null>;
}

/** Starts test/shm-peer.ts in a new Node process (through tsx). */
export function startPeer(args: string[]): Peer {
  const script = fileURLToPath(new URL("./shm-peer.ts", import.meta.url));
  const child = spawn(process.execPath, ["--import", "tsx", script, ...args], { stdio: ["pipe", "pipe", "pipe"] });
  children.push(child);
  let stderr = "";
  child.stderr!.on("data", (d: Buffer) => (stderr += d.toString()));
  const exited = new Promise<number | null>((r) => child.on("close", (code) => r(code)));
  const lines = createInterface({ input: child.stdout! })[Symbol.asyncIterator]();
  return {
    child,
    exited,
    async next() {
      const r = await lines.next();
      if (r.done) throw new Error(`peer ${args[0]} exited without output: ${stderr}`);
      return JSON.parse(r.value) as Record<string, unknown>;
    },
    send(line: string) {
      child.stdin!.write(`${line}\n`);
    },
  };
}

export function cleanupAll(): void {
  for (const c of children.splice(0)) if (c.exitCode === null && c.signalCode === null) c.kill("SIGKILL");
  for (const r of roots.splice(0)) rmSync(r, { recursive: true, force: true });
}
