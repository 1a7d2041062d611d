// The airm-worker command line as a process: help, usage errors, and a load failure that exits
// non-zero with its reason (what `airm up` reports when a worker cannot start).
import { afterAll, describe, expect, it } from "vitest";
import { spawnSync } from "node:child_process";
import { mkdtempSync, rmSync } from "node:fs";
import { createServer, type AddressInfo } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { makeTinyModel } from "@airm/llama";

const BIN = fileURLToPath(new URL("../bin/airm-worker.mjs", import.meta.url));
const run = (args: string[], env: NodeJS.ProcessEnv = {}) =>
  spawnSync(process.execPath, [BIN, ...args], { encoding: "utf8", env: { ...process.env, MODEL: "", ...env }, timeout: 60_000 });

describe("airm-worker CLI", () => {
  it("prints every option with --help", () => {
    const r = run(["--help"]);
    expect(r.status).toBe(0);
    for (const opt of [
      "--role",
      "--backend",
      "--chip",
      "--port",
      "--model",
      "--max-model-len",
      "--block-size",
      "--kv-cache-memory",
      "--max-num-batched-tokens",
      "--max-num-seqs",
      "--B",
      "--kv-transport",
    ])
      expect(r.stdout).toContain(opt);
  });
  it("refuses a missing role, an unknown option and a missing model with exit 2", () => {
    expect(run(["--backend", "atom", "--model", "/x"]).stderr).toContain("--role is required");
    expect(run(["--role", "solo", "--backend", "atom", "--model", "/x", "--frobnicate"]).status).toBe(2);
    const r = run(["--role", "solo", "--backend", "atom"]);
    expect(r.status).toBe(2);
    expect(r.stderr).toContain("--model is required");
  });
  it("exits 2 for a role that does not exist, 1 with the reason when the backend, transport or model is wrong", () => {
    const role = run(["--role", "gateway", "--backend", "atom", "--model", "/x", "--port", "0"]);
    expect([role.status, role.stderr]).toEqual([2, expect.stringContaining('--role: expected one of prefill, decode, solo, got "gateway"')]);
    const wrongRole = run(["--role", "prefill", "--backend", "atom", "--model", "/x", "--port", "0"]);
    expect([wrongRole.status, wrongRole.stderr]).toEqual([1, expect.stringContaining("backend atom (engine atom) runs the decode, solo role(s), not prefill")]);
    const backend = run(["--role", "solo", "--backend", "tpu", "--model", "/x", "--port", "0"]);
    expect([backend.status, backend.stderr]).toEqual([1, expect.stringContaining("unknown backend")]);
    const transport = run(["--role", "decode", "--backend", "atom", "--model", "/x", "--port", "0", "--kv-transport", "carrier-pigeon"]);
    expect(transport.status).toBe(1);
    expect(transport.stderr).toMatch(/UNKNOWN_PLUGIN.*carrier-pigeon.*installed: .*shm/);
    const model = run(["--role", "solo", "--backend", "rngd", "--port", "0"], { MODEL: "/nonexistent-model-dir" });
    expect(model.status).toBe(1);
    expect(model.stderr).toContain("/nonexistent-model-dir");
  });
  it("exits 1 with the reason when its KV events replay port is taken (the events socket it did bind does not keep it alive)", async () => {
    const taken = createServer();
    await new Promise<void>((r) => taken.listen(0, "127.0.0.1", r));
    const port = (taken.address() as AddressInfo).port;
    const model = mkdtempSync(join(tmpdir(), "airm-cli-model-"));
    models.push(model);
    makeTinyModel({ arch: "llama", out: model });
    try {
      const events = JSON.stringify({ enable_kv_cache_events: true, publisher: "zmq", endpoint: "tcp://127.0.0.1:0", replay_endpoint: `tcp://127.0.0.1:${port}` });
      const r = run(["--role", "solo", "--backend", "rngd", "--port", "0", "--kv-events-config", events], { MODEL: model });
      expect([r.status, r.signal, r.stderr]).toEqual([1, null, expect.stringContaining("Address already in use")]);
    } finally {
      taken.close();
    }
  });
});

const models: string[] = [];
afterAll(() => {
  for (const m of models) rmSync(m, { recursive: true, force: true });
});
