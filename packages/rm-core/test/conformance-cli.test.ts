// The airm-conformance CLI as a user runs it: a real process in a host package folder.
import { mkdirSync, mkdtempSync, rmSync, symlinkSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { spawnSync } from "node:child_process";
import { fileURLToPath } from "node:url";
import { afterAll, beforeAll, expect, test } from "vitest";

const bin = fileURLToPath(new URL("../bin/airm-conformance.mjs", import.meta.url));
const fixture = fileURLToPath(new URL("./fixtures/cli-plugins.ts", import.meta.url));
let host: string;

beforeAll(() => {
  host = mkdtempSync(join(tmpdir(), "airm-cli-"));
  const plugin = join(host, "store", "mem-plugin");
  mkdirSync(plugin, { recursive: true });
  writeFileSync(
    join(plugin, "package.json"),
    JSON.stringify({ name: "mem-plugin", type: "module", exports: { ".": "./index.ts" }, airm: { kv_transports: { mem: { export: "mem" }, corrupt: { export: "corrupt" } } } }),
  );
  writeFileSync(join(plugin, "index.ts"), `export { mem, corrupt } from ${JSON.stringify(fixture)};\n`);
  mkdirSync(join(host, "node_modules"));
  symlinkSync(plugin, join(host, "node_modules", "mem-plugin"), "dir");
  writeFileSync(join(host, "package.json"), JSON.stringify({ name: "cli-host", type: "module", dependencies: { "mem-plugin": "1" } }));
});
afterAll(() => rmSync(host, { recursive: true, force: true }));

function run(...args: string[]) {
  const r = spawnSync(process.execPath, [bin, ...args], { cwd: host, encoding: "utf8", timeout: 120_000 });
  const lines = r.stdout.trim().split("\n");
  return { status: r.status, last: lines[lines.length - 1], stdout: r.stdout, stderr: r.stderr };
}

test("a conforming transport: N passed, 0 failed and exit 0", () => {
  const r = run("airm.kv_transports", "mem");
  expect(r.status, r.stdout + r.stderr).toBe(0);
  const m = /^(\d+) passed, 0 failed$/.exec(r.last);
  expect(m, r.last).not.toBeNull();
  expect(Number(m![1])).toBeGreaterThanOrEqual(10);
});

test("a corrupting transport fails byte-exact cases and exits non-zero", () => {
  const r = run("airm.kv_transports", "corrupt");
  expect(r.status).toBe(1);
  expect(r.last).toMatch(/^\d+ passed, [1-9]\d* failed$/);
  expect(r.stdout).toMatch(/FAIL\s+roundtrip-1mib/);
});

test("an unknown name exits 2 and lists the installed names", () => {
  const r = run("airm.kv_transports", "nope");
  expect(r.status).toBe(2);
  expect(r.stderr).toContain("installed: corrupt, mem");
});
