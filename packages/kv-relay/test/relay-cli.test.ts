// airm-kv-relay as a user runs it: --help, bad arguments, metrics and health over HTTP, the
// per-blob audit log, and a clean stop on SIGTERM.

import { spawnSync } from "node:child_process";
import { createHash } from "node:crypto";
import { fileURLToPath } from "node:url";
import { patternBytes } from "@airm/rm-core";
import { afterEach, expect, test } from "vitest";
import { RELAY_CONFIG, RelayClient, spawnRelay, type RelayProcess } from "../src/index.ts";

const bin = fileURLToPath(new URL("../bin/airm-kv-relay.mjs", import.meta.url));
const running: RelayProcess[] = [];
afterEach(async () => {
  while (running.length) await running.pop()!.stop();
});

test("--help lists every option and every environment variable", () => {
  const r = spawnSync(process.execPath, [bin, "--help"], { encoding: "utf8" });
  expect(r.status).toBe(0);
  for (const opt of ["--listen", "--metrics-port", "--max-mb", "--ttl-s", "--no-crc", "--log", "--help"]) expect(r.stdout).toContain(opt);
  for (const name of RELAY_CONFIG.envNames()) expect(r.stdout).toContain(name);
});

test("bad arguments exit 2 with a message naming the problem", () => {
  const bad = [["--listen", "nowhere"], ["--max-mb", "lots"], ["--bogus"]];
  for (const args of bad) {
    const r = spawnSync(process.execPath, [bin, ...args], { encoding: "utf8" });
    expect(r.status, args.join(" ")).toBe(2);
    expect(r.stderr).toMatch(/airm-kv-relay/);
  }
  const env = spawnSync(process.execPath, [bin, "--listen", "127.0.0.1:0"], { encoding: "utf8", env: { ...process.env, AIRM_KV_TCP_TTL_S: "soon" } });
  expect(env.status).toBe(2);
  expect(env.stderr).toContain("AIRM_KV_TCP_TTL_S");
});

test("metrics and health over HTTP reflect what the relay holds; SIGTERM stops it with 0", async () => {
  const relay = await spawnRelay(["--listen", "127.0.0.1:0", "--metrics-port", "0", "--max-mb", "8"]);
  running.push(relay);
  const mport = Number(/metrics on port (\d+)/.exec(relay.stdout())![1]);
  const t = RelayClient.connect(relay.address);
  try {
    await t.push("m/0/k", patternBytes(1, 300_000));
    await t.push("m/0/v", patternBytes(2, 200_000));
    const health = (await (await fetch(`http://127.0.0.1:${mport}/health`)).json()) as Record<string, unknown>;
    expect(health).toMatchObject({ status: "ok", blobs: 2, bytes_held: 500_000, max_bytes: 8 * 1024 * 1024 });
    const text = await (await fetch(`http://127.0.0.1:${mport}/metrics`)).text();
    expect(text).toMatch(/^airm_kv_relay_bytes_held 500000$/m);
    expect(text).toMatch(/^airm_kv_relay_blobs 2$/m);
    expect(text).toMatch(/^airm_kv_relay_connections [12]$/m);
    expect(text).toMatch(/^airm_kv_relay_crc_failures_total 0$/m);
  } finally {
    t.close();
  }
  expect(await relay.stop()).toBe(0);
});

test("--log writes size and SHA-256 of each stored blob", async () => {
  const relay = await spawnRelay(["--listen", "127.0.0.1:0", "--log"]);
  running.push(relay);
  const data = patternBytes(5, 123_457);
  const t = RelayClient.connect(relay.address);
  try {
    await t.push("audit/0/k", data);
  } finally {
    t.close();
  }
  await new Promise((r) => setTimeout(r, 100));
  const line = relay
    .stderr()
    .trim()
    .split("\n")
    .map((l) => JSON.parse(l) as Record<string, unknown>)
    .find((l) => l.key === "audit/0/k");
  expect(line).toMatchObject({ bytes: 123_457, sha256: createHash("sha256").update(data).digest("hex") });
});
