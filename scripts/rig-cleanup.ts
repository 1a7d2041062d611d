// Teardown on any exit for the test rigs (scripts/k8s-rig, scripts/netns-rig, the container
// tests). What a rig starts (processes, mounts, links, folders) must not outlive the process that
// started it, also when a signal stops that process: then vitest's afterAll hooks and `finally`
// blocks never run. A rig registers a teardown here when it starts and drops it once it stopped.
// On SIGTERM, SIGINT or SIGHUP every registered teardown runs, newest first, and the process then
// dies by that signal (its parent sees 128+signo); on any other exit (process.exit, as a vitest
// worker does when its main process is gone) they run too. Teardowns are synchronous because
// nothing asynchronous runs once the process is exiting: they SIGKILL, wait with a blocking sleep
// and remove with the *Sync calls. With no teardown registered the process keeps Node's defaults.
import type { ChildProcess } from "node:child_process";
import { readdirSync, readFileSync } from "node:fs";

export type Teardown = () => void;

const SIGNALS = ["SIGTERM", "SIGINT", "SIGHUP"] as const;
/** In registration order (a Set keeps it); run newest first, as the rigs were built on each other. */
const teardowns = new Set<Teardown>();

/** Registers `teardown` to run if the process is stopped by a signal or exits; returns what unregisters it. */
export function onInterrupt(teardown: Teardown): () => void {
  if (teardowns.size === 0) listen(true);
  teardowns.add(teardown);
  return () => {
    if (teardowns.delete(teardown) && teardowns.size === 0) listen(false);
  };
}

/** Runs every registered teardown, newest first; one that throws is reported and the others still run. */
export function runTeardowns(): void {
  for (const t of [...teardowns].reverse()) {
    teardowns.delete(t);
    try {
      t();
    } catch (e) {
      process.stderr.write(`rig cleanup: ${(e as Error).message}\n`);
    }
  }
  listen(false);
}

function onSignal(signal: NodeJS.Signals): void {
  runTeardowns();
  // No listener of ours is left, so the signal's default action applies again: raised once more it
  // ends the process as it would have ended without the rigs. A listener of the script's own
  // (a bench's graceful stop) decides instead. process.exit is no way out here: a vitest worker
  // replaces it with a function that throws.
  if (process.listenerCount(signal) === 0) process.kill(process.pid, signal);
}

function listen(on: boolean): void {
  for (const s of SIGNALS) process.off(s, onSignal);
  process.off("exit", runTeardowns);
  if (!on) return;
  for (const s of SIGNALS) process.on(s, onSignal);
  process.on("exit", runTeardowns);
}

/** Registers the SIGKILL of `child` and its descendants until it exits; returns `child`. */
export function killOnInterrupt<T extends ChildProcess>(child: T): T {
  const pid = child.pid;
  if (pid === undefined) return child;
  const forget = onInterrupt(() => killTrees([pid]));
  child.once("exit", forget);
  return child;
}

/**
 * `argv` as spawn's command and arguments, run so that the kernel SIGKILLs it when the thread that
 * spawned it dies, however it dies (a SIGKILLed vitest worker runs no teardown): setpriv sets
 * PR_SET_PDEATHSIG and execs the command, which keeps its pid.
 */
export function diesWithParent(argv: string[]): [string, string[]] {
  return ["setpriv", ["--pdeathsig", "KILL", "--", ...argv]];
}

/** Blocks the thread for `ms` (a teardown cannot await). */
export function sleepSync(ms: number): void {
  Atomics.wait(new Int32Array(new SharedArrayBuffer(4)), 0, 0, ms);
}

export interface ProcInfo {
  pid: number;
  ppid: number;
  /** The state letter of /proc/<pid>/stat: Z for a zombie (dead, not yet reaped). */
  state: string;
  /** The command line, arguments joined by spaces. */
  cmdline: string;
}

/** One process as /proc shows it, or undefined once it is gone. */
export function procInfo(pid: number): ProcInfo | undefined {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, "utf8");
    // the command name in parentheses may hold spaces and parentheses itself: fields follow the last ")"
    const [state, ppid] = stat.slice(stat.lastIndexOf(")") + 2).split(" ");
    const cmdline = readFileSync(`/proc/${pid}/cmdline`, "utf8").replace(/\0/g, " ").trim();
    return { pid, ppid: Number(ppid), state: state!, cmdline };
  } catch {
    return undefined;
  }
}

/** Every process this one can see. */
export function processes(): ProcInfo[] {
  const pids = readdirSync("/proc").filter((x) => /^\d+$/.test(x));
  return pids.map((p) => procInfo(Number(p))).filter((p): p is ProcInfo => p !== undefined);
}

/** Whether `pid` runs (a zombie does not: it is dead, only not reaped by its parent yet). */
export function isAlive(pid: number): boolean {
  const p = procInfo(pid);
  return p !== undefined && p.state !== "Z";
}

/** `pids` and every process descended from them (by parent pid, as /proc shows it now). */
function withDescendants(pids: number[]): number[] {
  const children = new Map<number, number[]>();
  for (const p of processes()) children.set(p.ppid, [...(children.get(p.ppid) ?? []), p.pid]);
  const out = new Set<number>();
  const visit = (pid: number) => {
    if (out.has(pid)) return;
    out.add(pid);
    for (const c of children.get(pid) ?? []) visit(c);
  };
  for (const pid of pids) visit(pid);
  return [...out];
}

/** Sends `signal` to each pid, ignoring those already gone. */
export function signalAll(pids: number[], signal: NodeJS.Signals): void {
  for (const pid of pids) {
    try {
      process.kill(pid, signal);
    } catch {
      // already gone
    }
  }
}

/** Waits (blocking) up to `ms` until none of `pids` runs; true if none does. */
export function waitGone(pids: number[], ms = 5000): boolean {
  const until = Date.now() + ms;
  while (pids.some(isAlive)) {
    if (Date.now() > until) return false;
    sleepSync(20);
  }
  return true;
}

/**
 * SIGKILLs `pids` and all their descendants at once and waits (blocking, up to `ms`) until none
 * runs. Pass only pids that are still this process's children or that it otherwise knows to be
 * its own: a pid that exited and was reaped may already name another process.
 */
export function killTrees(pids: number[], ms = 5000): boolean {
  const all = withDescendants(pids);
  signalAll(all, "SIGKILL");
  return waitGone(all, ms);
}

/**
 * For vitest's main process (test/hold-workers.ts, a globalSetup): on SIGTERM, SIGINT or SIGHUP,
 * passes the signal on to the test workers (forked processes) and blocks until they have exited,
 * up to a minute. vitest's main exits 1 ms after such a signal, and its watchdog process then
 * SIGKILLs every worker still running: a worker midway through its rigs' teardowns would leave
 * the rest behind. Returns what removes the handlers.
 */
export function holdWorkersOnSignal(): () => void {
  const hold = (signal: NodeJS.Signals) => {
    const workers = processes().filter((p) => p.ppid === process.pid && p.state !== "Z" && /vitest\/dist\/workers\/\w*forks\.js/i.test(p.cmdline));
    signalAll(
      workers.map((p) => p.pid),
      signal,
    );
    waitGone(
      workers.map((p) => p.pid),
      60_000,
    );
  };
  for (const s of SIGNALS) process.on(s, hold);
  return () => {
    for (const s of SIGNALS) process.off(s, hold);
  };
}

/** The processes above this one, its parent first. */
function ancestors(): ProcInfo[] {
  const out: ProcInfo[] = [];
  for (let p = procInfo(process.ppid); p && p.pid > 1; p = procInfo(p.ppid)) out.push(p);
  return out;
}

/**
 * When a pnpm runs this process (one of its ancestors, as in `pnpm test`, which runs
 * `sh -c "vitest run && ..."`), SIGTERMs this process once that pnpm is gone: pnpm passes a signal
 * it gets only to the shell it started for the script, so a CI runner or `timeout` that signals
 * pnpm alone would leave the tests running. Checks every second; returns what stops checking.
 * scripts/k8s-rig/run-tests.sh does the same for test.sh and test-node.sh.
 */
export function stopWithPnpm(): () => void {
  const pnpms = ancestors().filter((p) => /(^|\/)pnpm(\.c?js)?( |$)/.test(p.cmdline));
  if (pnpms.length === 0) return () => {};
  const timer = setInterval(() => {
    if (pnpms.every((p) => isAlive(p.pid))) return;
    clearInterval(timer);
    process.kill(process.pid, "SIGTERM");
  }, 1000);
  timer.unref();
  return () => clearInterval(timer);
}
