// What the tests that stop a rig's run with a signal share (test/rig-cleanup.test.ts,
// test/netns-rig.test.ts, test/k8s/interrupt.test.ts, test/k8s-node/interrupt.test.ts): starting
// the run and waiting until it wrote what it started, waiting for its end, listing what it left
// behind, and removing that after the test.
import { type ChildProcess, spawn, type SpawnOptions } from "node:child_process";
import { existsSync, readFileSync, readlinkSync, rmSync } from "node:fs";
import { killTrees, type ProcInfo, processes } from "../scripts/rig-cleanup.ts";

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

/** A run: its process and what it wrote on stdout and stderr so far. */
export interface Run {
  proc: ChildProcess;
  out: () => string;
  err: () => string;
}

export function startRun(cmd: string, args: string[], opts: SpawnOptions = {}): Run {
  const proc = spawn(cmd, args, { ...opts, stdio: ["ignore", "pipe", "pipe"] });
  let out = "";
  let err = "";
  proc.stdout!.on("data", (d: Buffer) => (out += d));
  proc.stderr!.on("data", (d: Buffer) => (err += d));
  return { proc, out: () => out, err: () => err };
}

/** The JSON the run writes to `path` once it is up; throws if the run ends first or `ms` pass. */
export async function stateOf<T>(run: Run, path: string, ms: number): Promise<T> {
  const until = Date.now() + ms;
  while (!existsSync(path)) {
    if (run.proc.exitCode !== null || run.proc.signalCode !== null) throw new Error(`the run ended (${run.proc.exitCode ?? run.proc.signalCode}) before it was up:\n${run.err()}`);
    if (Date.now() > until) throw new Error(`the run was not up within ${ms} ms:\n${run.err().slice(-3000)}`);
    await sleep(200);
  }
  await sleep(100); // written in one call, but give the write a moment to complete
  return JSON.parse(readFileSync(path, "utf8")) as T;
}

/** How the run ended (its exit code, or the signal that ended it); throws after `ms`. */
export function ended(run: Run, ms: number): Promise<{ code: number | null; signal: NodeJS.Signals | null }> {
  return new Promise((resolve, reject) => {
    const done = () => resolve({ code: run.proc.exitCode, signal: run.proc.signalCode });
    if (run.proc.exitCode !== null || run.proc.signalCode !== null) return done();
    const t = setTimeout(() => reject(new Error(`the run did not end within ${ms} ms:\n${run.err().slice(-3000)}`)), ms);
    run.proc.once("exit", () => {
      clearTimeout(t);
      done();
    });
  });
}

function netnsOf(pid: number): string {
  try {
    return readlinkSync(`/proc/${pid}/ns/net`);
  } catch {
    return "";
  }
}

/** What identifies a run's processes: pids, markers on their command lines, their network namespaces. */
export interface RunQuery {
  pids?: number[];
  markers?: string[];
  nets?: string[];
}

/** The live processes of a run: those of `pids` alive, and those with a marker on the command line or in one of `nets`. */
export function leftovers(q: RunQuery): ProcInfo[] {
  const markers = q.markers ?? [];
  const nets = new Set((q.nets ?? []).filter(Boolean));
  return processes().filter(
    (p) =>
      p.pid !== process.pid && p.state !== "Z" && ((q.pids ?? []).includes(p.pid) || markers.some((m) => p.cmdline.includes(m)) || (nets.size > 0 && nets.has(netnsOf(p.pid)))),
  );
}

/** One line per process, for a failure message. */
export const show = (procs: ProcInfo[]) => procs.map((p) => `${p.pid}: ${p.cmdline.slice(0, 200)}`);

/** Whatever is left of a run (after its test, passed or failed) killed and its folders removed: a failing test leaves nothing either. */
export function removeRun(run: Run | undefined, q: RunQuery, dirs: string[]): void {
  if (run && run.proc.exitCode === null && run.proc.signalCode === null) killTrees([run.proc.pid!]);
  killTrees(leftovers(q).map((p) => p.pid));
  for (const d of dirs) rmSync(d, { recursive: true, force: true });
}

/** Polls `traces` (what is left of a run) until it is empty or `ms` pass; returns its last answer. */
export async function untilNothingLeft(traces: () => string[], ms: number): Promise<string[]> {
  const until = Date.now() + ms;
  for (;;) {
    const left = traces();
    if (left.length === 0 || Date.now() > until) return left;
    await sleep(250);
  }
}
