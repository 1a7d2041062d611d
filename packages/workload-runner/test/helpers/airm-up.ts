// `airm up` as a user runs it, for tests: the real CLI in a child process of its own process group
// (so a failing test can stop it and every part it started at once), its output kept.

import { type ChildProcess, spawn } from "node:child_process";
import { fileURLToPath } from "node:url";

const airm = fileURLToPath(new URL("../../bin/airm.mjs", import.meta.url));

export interface AirmUp {
  child: ChildProcess;
  out(): string;
  err(): string;
  exit: Promise<number | null>;
  /** SIGKILLs airm up's whole process group (it and its parts). */
  kill(): void;
}

/** Starts `airm up ARGS` with `env` on top of this process's environment. */
export function startAirmUp(args: string[], env: Record<string, string> = {}): AirmUp {
  const child = spawn(process.execPath, [airm, "up", ...args], { env: { ...process.env, ...env }, stdio: ["ignore", "pipe", "pipe"], detached: true });
  let out = "";
  let err = "";
  child.stdout!.on("data", (d) => (out += d));
  child.stderr!.on("data", (d) => (err += d));
  const exit = new Promise<number | null>((r) => child.once("exit", (code) => r(code)));
  return {
    child,
    out: () => out,
    err: () => err,
    exit,
    kill() {
      try {
        process.kill(-child.pid!, "SIGKILL");
      } catch {
        // already gone
      }
    },
  };
}

/** Polls `cond` every 200 ms; throws naming `what` after `ms`. */
export async function waitFor(cond: () => boolean, ms: number, what: string): Promise<void> {
  const end = Date.now() + ms;
  while (!cond()) {
    if (Date.now() > end) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 200));
  }
}
