// scripts/rig-cleanup.ts, the teardown every test rig registers: a process stopped by SIGTERM,
// SIGINT or SIGHUP kills what it started (children and their children) and removes its folder,
// then dies by that signal (a shell sees 128+signo); one that calls process.exit does the same
// (test/fixtures/rig-cleanup-run.ts, a small rig, run as a process here). And a vitest run that
// gets SIGTERM (its main process alone) passes it on to the worker running a rig and waits for
// the worker's teardown, a slow one, before it exits: without that, vitest's watchdog SIGKILLs
// the worker as soon as the main process is gone (test/hold-workers.ts, the root configuration's
// globalSetup); and a vitest under pnpm stops when that pnpm is gone, which is all a SIGTERM to
// pnpm alone does to the shell and vitest below it.
import { existsSync, mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, describe, expect, it } from "vitest";
import { isAlive } from "../scripts/rig-cleanup.ts";
import type { SmallRig } from "./fixtures/rig-cleanup-run.ts";
import { ended, leftovers, removeRun, type Run, show, startRun, stateOf, untilNothingLeft } from "./interrupt-helpers.ts";

const repo = join(import.meta.dirname, "..");
const fixtures = join(import.meta.dirname, "fixtures");
const work = mkdtempSync(join(tmpdir(), "airm-rig-cleanup-test-"));
afterAll(() => rmSync(work, { recursive: true, force: true }));

/** Starts the small rig as a process of its own and resolves once it printed what it made. */
async function startSmall(marker: string, mode = "wait"): Promise<{ run: Run; made: SmallRig }> {
  const run = startRun(process.execPath, ["--import", "tsx", join(fixtures, "rig-cleanup-run.ts"), marker, mode]);
  for (let i = 0; i < 300 && !run.out().includes("\n") && run.proc.exitCode === null; i++) await new Promise((r) => setTimeout(r, 50));
  if (!run.out().includes("\n")) throw new Error(`the small rig did not come up: ${run.err()}`);
  return { run, made: JSON.parse(run.out()) };
}

/** The small rig runs: its child and grandchild, its folder. */
const up = (made: SmallRig) => [isAlive(made.child), isAlive(made.grandchild), existsSync(made.dir)];

/** What is left of the small rig: processes by pid or marker, its folder. */
const traces = (made: SmallRig, marker: string) => [
  ...show(leftovers({ pids: [made.child, made.grandchild], markers: [marker] })),
  ...(existsSync(made.dir) ? [`folder ${made.dir}`] : []),
];

describe("rig cleanup", () => {
  it.each(["SIGTERM", "SIGINT", "SIGHUP"] as const)("on %s kills the children and their children, removes the folder, and dies by the signal", async (signal) => {
    const marker = `airm-cleanup-${process.pid}-${signal}`;
    const { run, made } = await startSmall(marker);
    try {
      expect(up(made)).toEqual([true, true, true]);
      run.proc.kill(signal);
      expect(await ended(run, 10_000)).toEqual({ code: null, signal });
      expect(traces(made, marker)).toEqual([]);
    } finally {
      removeRun(run, { pids: [made.child, made.grandchild], markers: [marker] }, [made.dir]);
    }
  });

  it("on process.exit does the same, with the exit code given", async () => {
    const marker = `airm-cleanup-${process.pid}-exit`;
    const { run, made } = await startSmall(marker, "exit");
    try {
      expect(await ended(run, 10_000)).toEqual({ code: 3, signal: null });
      expect(traces(made, marker)).toEqual([]);
    } finally {
      removeRun(run, { pids: [made.child, made.grandchild], markers: [marker] }, [made.dir]);
    }
  });

  it("a vitest run stopped by SIGTERM to its main process lets its worker's slow teardown finish", async () => {
    const marker = `airm-cleanup-${process.pid}-vitest`;
    const statePath = join(work, "vitest.json");
    const env = { ...process.env, RIG_INTERRUPT_MARKER: marker, RIG_INTERRUPT_STATE: statePath };
    const run = startRun(join(repo, "node_modules", ".bin", "vitest"), ["run", "--config", join(fixtures, "vitest.config.ts")], { cwd: repo, env });
    let made: SmallRig | undefined;
    try {
      made = await stateOf<SmallRig>(run, statePath, 60_000);
      expect(up(made)).toEqual([true, true, true]);
      run.proc.kill("SIGTERM");
      expect(await ended(run, 30_000)).toEqual({ code: 143, signal: null });
      expect(traces(made, marker)).toEqual([]);
    } finally {
      removeRun(run, { pids: made ? [made.child, made.grandchild] : [], markers: [marker] }, made ? [made.dir] : []);
    }
  }, 90_000);

  it('a vitest run under pnpm, as `pnpm test` runs it (sh -c "vitest run && ..."), stops when its pnpm alone gets SIGTERM', async () => {
    const marker = `airm-cleanup-${process.pid}-pnpm`;
    const statePath = join(work, "pnpm.json");
    const env = { ...process.env, RIG_INTERRUPT_MARKER: marker, RIG_INTERRUPT_STATE: statePath };
    const vitest = `"${join(repo, "node_modules", ".bin", "vitest")}" run --config "${join(fixtures, "vitest.config.ts")}"`;
    const run = startRun("pnpm", ["exec", "sh", "-c", `${vitest} && true`], { cwd: repo, env });
    let made: SmallRig | undefined;
    try {
      made = await stateOf<SmallRig>(run, statePath, 60_000);
      run.proc.kill("SIGTERM");
      await ended(run, 30_000);
      // pnpm and its shell are gone at once; vitest notices pnpm's end within a second
      expect(await untilNothingLeft(() => traces(made!, marker), 20_000)).toEqual([]);
    } finally {
      // the vitest left by a failure is no child of pnpm's any more: found by its configuration
      const markers = [marker, join(fixtures, "vitest.config.ts")];
      removeRun(run, { pids: made ? [made.child, made.grandchild] : [], markers }, made ? [made.dir] : []);
    }
  }, 90_000);
});
