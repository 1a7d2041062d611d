// A run of the Kubernetes rig stopped by SIGTERM leaves nothing (scripts/rig-cleanup.ts): no
// process (the control plane, the pod runner's pod, Envoy), by pid, by the run's marker or rig
// folder on a command line, or in the run's network namespace; no folder (the rig's, the pod's
// emptyDir under /dev/shm, the run's TMPDIR). Twice: a process running the rig
// (fixtures/rig-run.ts) gets the signal alone, so only its own teardown can stop what it started;
// and scripts/k8s-rig/test.sh running a vitest file (fixtures/interrupted.test.ts) gets it, as
// from pnpm when a CI runner or `timeout` stops `pnpm test:k8s`: it passes the signal to the
// tests, whose teardowns finish, and its sweep kills what nothing registered (a stray process the
// fixture starts), then it exits 143. And once more through `pnpm test:k8s` with the signal to
// pnpm alone, which passes it on to nobody but the shell it started: test.sh sees pnpm go.
import { existsSync, mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, describe, expect, test } from "vitest";
import { waitGone } from "../../scripts/rig-cleanup.ts";
import { ended, leftovers, removeRun, type Run, type RunQuery, show, startRun, stateOf, untilNothingLeft } from "../interrupt-helpers.ts";
import type { RigRunState } from "./fixtures/rig-run.ts";

const repo = join(import.meta.dirname, "..", "..");
const fixtures = join(import.meta.dirname, "fixtures");
const work = mkdtempSync(join(tmpdir(), "airm-k8s-interrupt-"));
afterAll(() => rmSync(work, { recursive: true, force: true }));

/** A run's processes: by pid, by its marker or rig folder on the command line, by its own network namespace (`nets`, if it has one). */
const query = (s: RigRunState | undefined, marker: string, nets: string[] = []): RunQuery => ({
  pids: s ? [...s.pids, s.stray] : [],
  markers: [marker, ...(s ? [s.dirs[0]!] : [])],
  nets,
});
const foldersLeft = (dirs: string[]) => dirs.filter((d) => existsSync(d)).map((d) => `folder ${d}`);

describe("a Kubernetes rig run stopped by SIGTERM", () => {
  test("a process running the rig, the pod runner and Envoy: its teardown kills them and removes their folders", async () => {
    const marker = `airm-interrupt-${process.pid}-direct`;
    const statePath = join(work, "direct.json");
    let run: Run | undefined;
    let s: RigRunState | undefined;
    try {
      run = startRun(process.execPath, ["--import", "tsx", join(fixtures, "rig-run.ts"), marker, statePath], { cwd: repo });
      s = await stateOf<RigRunState>(run, statePath, 180_000);
      expect(leftovers({ pids: s.pids })).toHaveLength(s.pids.length);
      run.proc.kill("SIGTERM");
      const how = await ended(run, 60_000);
      // the stray is nobody's: without test.sh around the run, it is this test's to stop
      process.kill(s.stray, "SIGKILL");
      waitGone([s.stray]);
      expect([...show(leftovers(query(s, marker))), ...foldersLeft(s.dirs)]).toEqual([]);
      expect(how).toEqual({ code: null, signal: "SIGTERM" });
    } finally {
      removeRun(run, query(s, marker), s?.dirs ?? []);
    }
  }, 300_000);

  test("test.sh running the suite: it stops the tests, their rigs and whatever else runs in its namespace, and exits 143", async () => {
    const marker = `airm-interrupt-${process.pid}-test-sh`;
    const statePath = join(work, "test-sh.json");
    const env = { ...process.env, RIG_INTERRUPT_MARKER: marker, RIG_INTERRUPT_STATE: statePath };
    let run: Run | undefined;
    let s: RigRunState | undefined;
    try {
      run = startRun("bash", [join(repo, "scripts", "k8s-rig", "test.sh"), "--dir", fixtures], { cwd: repo, env });
      s = await stateOf<RigRunState>(run, statePath, 240_000);
      expect(leftovers({ pids: [...s.pids, s.stray] })).toHaveLength(s.pids.length + 1);
      run.proc.kill("SIGTERM");
      const how = await ended(run, 120_000);
      expect([...show(leftovers(query(s, marker, [s.netns]))), ...foldersLeft([...s.dirs, s.tmpdir])]).toEqual([]);
      expect(how).toEqual({ code: 143, signal: null });
      // the tests' teardowns stopped all they started: the sweep found only the stray
      expect(run.err().match(/killed leftover \d+/g)).toEqual([`killed leftover ${s.stray}`]);
    } finally {
      removeRun(run, query(s, marker, s ? [s.netns] : []), s ? [...s.dirs, s.tmpdir] : []);
    }
  }, 400_000);

  test("`pnpm test:k8s` whose pnpm alone gets the signal: test.sh notices pnpm is gone and stops the run the same way", async () => {
    const marker = `airm-interrupt-${process.pid}-pnpm`;
    const statePath = join(work, "pnpm.json");
    const env = { ...process.env, RIG_INTERRUPT_MARKER: marker, RIG_INTERRUPT_STATE: statePath };
    let run: Run | undefined;
    let s: RigRunState | undefined;
    try {
      run = startRun("pnpm", ["test:k8s", "--dir", fixtures], { cwd: repo, env });
      s = await stateOf<RigRunState>(run, statePath, 240_000);
      run.proc.kill("SIGTERM");
      await ended(run, 30_000);
      // pnpm is gone at once; the run stops within a few seconds (test.sh checks for pnpm every second)
      const left = await untilNothingLeft(() => [...show(leftovers(query(s, marker, [s!.netns]))), ...foldersLeft([...s!.dirs, s!.tmpdir])], 60_000);
      expect(left).toEqual([]);
      // Two watchers see pnpm go, each within a second: test.sh's (which then says "SIGTERM:
      // stopping the tests") and vitest's own (which stops vitest, and test.sh sweeps after it).
      // Which one is first depends on the machine's load; either way the tests' teardowns stopped
      // everything they started, so the sweep found only the stray.
      expect(run.err().match(/killed leftover \d+/g)).toEqual([`killed leftover ${s.stray}`]);
    } finally {
      removeRun(run, query(s, marker, s ? [s.netns] : []), s ? [...s.dirs, s.tmpdir] : []);
    }
  }, 400_000);
});
