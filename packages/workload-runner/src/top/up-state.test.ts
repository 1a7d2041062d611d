import { chmodSync, existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync, statSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterEach, beforeEach, describe, expect, test } from "vitest";
import { stateTargets } from "./targets.ts";
import { ensurePrivateDir, LOG_LIMIT, readUpStates, roleOfPartName, sweepStaleStates, tailLog, upStateDir, UpStateWriter } from "./up-state.ts";

let run: string;
beforeEach(() => {
  run = mkdtempSync(join(tmpdir(), "airm-top-state-"));
});
afterEach(() => rmSync(run, { recursive: true, force: true }));

const cluster = {
  gateway: "http://127.0.0.1:8000",
  gatewayMetrics: null,
  internalToken: "t".repeat(43),
  tlsDir: null,
  parts: ["kv-relay", "prefill", "decode", "decode-2", "gateway"].map((name, i) => ({ name, url: `http://127.0.0.1:${8100 + i}` })),
  sidecarMetrics: "http://127.0.0.1:9401/metrics",
};

/** A pid that is surely not running: the highest pid Linux hands out is below this. */
const DEAD_PID = 4_194_305;

describe("airm up's state file", () => {
  test("lives in $XDG_RUNTIME_DIR/airm, else a folder of this user in the temp folder", () => {
    expect(upStateDir({ XDG_RUNTIME_DIR: "/run/user/1000" })).toBe("/run/user/1000/airm");
    expect(upStateDir({})).toBe(join(tmpdir(), `airm-${process.getuid!()}`));
  });

  test("is written once the cluster is up, readable by this user only, and read back with its parts' roles", () => {
    const w = UpStateWriter.open({ XDG_RUNTIME_DIR: run });
    for (const p of cluster.parts) w.partStarted(p.name);
    w.logLine("decode", "a line");
    expect(readUpStates(join(run, "airm"))).toEqual([]); // nothing before publish
    w.publish(cluster);
    expect(statSync(w.file).mode & 0o777).toBe(0o600);
    expect(statSync(join(run, "airm")).mode & 0o777).toBe(0o700);
    const [found] = readUpStates(join(run, "airm"));
    expect(found.state).toMatchObject({ pid: process.pid, gateway: cluster.gateway, internalToken: cluster.internalToken });
    expect(found.state.parts.map((p) => [p.name, p.role, p.starts])).toEqual([
      ["kv-relay", "sidecar", 1],
      ["prefill", "prefill", 1],
      ["decode", "decode", 1],
      ["decode-2", "decode", 1],
      ["gateway", "gateway", 1],
    ]);
    expect(tailLog(found.state.parts[2].log, 10)).toEqual(["a line"]);
    w.remove();
  });

  test("a restart is counted in the file, and airm top reads it as the part's restarts", () => {
    const w = UpStateWriter.open({ XDG_RUNTIME_DIR: run });
    for (const p of cluster.parts) w.partStarted(p.name);
    w.publish(cluster);
    w.partStarted("decode-2");
    w.partStarted("decode-2");
    const targets = stateTargets(readUpStates(join(run, "airm"))[0].state);
    expect(targets.find((t) => t.name === "decode-2")).toMatchObject({ kind: "worker", role: "decode", restarts: 2, drainUrl: "http://127.0.0.1:8103" });
    expect(targets.find((t) => t.name === "kv-relay")).toMatchObject({ kind: "relay", url: "http://127.0.0.1:9401", drainUrl: null });
    w.remove();
  });

  test("is removed with the logs when airm up stops; a killed launcher's are swept by the next", () => {
    const w = UpStateWriter.open({ XDG_RUNTIME_DIR: run });
    w.publish(cluster);
    w.remove();
    expect([existsSync(w.file), existsSync(w.logDir)]).toEqual([false, false]);
    const dir = join(run, "airm");
    writeFileSync(join(dir, `up-${DEAD_PID}.json`), JSON.stringify({ ...cluster, version: 1, pid: DEAD_PID, startedAt: "", parts: [] }));
    mkdirSync(join(dir, `up-${DEAD_PID}.logs`));
    expect(readUpStates(dir)).toEqual([]); // its launcher is gone
    expect(sweepStaleStates(dir).sort()).toEqual([join(dir, `up-${DEAD_PID}.json`), join(dir, `up-${DEAD_PID}.logs`)]);
  });

  test("a folder others may read is refused (the file holds the internal token)", () => {
    const open = join(run, "open");
    mkdirSync(open, { mode: 0o755 });
    chmodSync(open, 0o755);
    expect(() => ensurePrivateDir(open)).toThrow(/may be read by other users/);
  });
});

describe("a part's log file", () => {
  test("moves to .1 past its size limit, and the tail reads across both", () => {
    const w = UpStateWriter.open({ XDG_RUNTIME_DIR: run });
    const line = (i: number) => `${String(i).padStart(6, "0")} ${"x".repeat(1000)}`;
    const count = Math.ceil((1.5 * LOG_LIMIT) / 1008);
    for (let i = 0; i < count; i++) w.logLine("prefill", line(i));
    const file = join(w.logDir, "prefill.log");
    expect(statSync(file).size).toBeLessThan(LOG_LIMIT);
    expect(statSync(`${file}.1`).size).toBeLessThanOrEqual(LOG_LIMIT);
    // more lines than the current file holds: the tail starts in the older one
    const want = readFileSync(file, "utf8").split("\n").filter(Boolean).length + 50;
    const numbers = (xs: string[]) => xs.map((l) => Number(l.slice(0, 6)));
    const got = tailLog(file, want);
    expect(got.every((l) => l.length === line(0).length)).toBe(true);
    expect(numbers(got)).toEqual(Array.from({ length: want }, (_, k) => count - want + k));
    expect(readFileSync(file, "utf8").split("\n")[0]).toMatch(/^\d{6} x+$/); // whole lines only
    w.remove();
  });

  test("a part that wrote nothing has no lines", () => {
    expect(tailLog(join(run, "none.log"), 5)).toEqual([]);
  });
});

test("the launcher's names give the parts' roles", () => {
  expect(["gateway", "prefill", "prefill-2", "decode-3", "solo", "kv-relay", "kv-nixl-agent"].map(roleOfPartName)).toEqual([
    "gateway",
    "prefill",
    "prefill",
    "decode",
    "solo",
    "sidecar",
    "sidecar",
  ]);
});
