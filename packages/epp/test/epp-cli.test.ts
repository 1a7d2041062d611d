// airm-epp as a user runs it: --help, bad arguments, a bad endpoints file, and a run in static
// mode (the listening line, /health and /metrics, a routed request, SIGTERM).

import { spawn, spawnSync, type ChildProcess } from "node:child_process";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { afterEach, expect, test } from "vitest";
import { EPP_CONFIG } from "../src/index.ts";
import { EnvoyStub, startFakeModelServer } from "../src/testing/index.ts";

const bin = fileURLToPath(new URL("../bin/airm-epp.mjs", import.meta.url));
const cleanup: (() => Promise<void> | void)[] = [];
afterEach(async () => {
  while (cleanup.length) await cleanup.pop()!();
});

function tempFile(name: string, text: string): string {
  const dir = mkdtempSync(join(tmpdir(), "airm-epp-cli-"));
  cleanup.push(() => rmSync(dir, { recursive: true, force: true }));
  writeFileSync(join(dir, name), text);
  return join(dir, name);
}

test("--help lists every flag and the environment variable", () => {
  const r = spawnSync(process.execPath, [bin, "--help"], { encoding: "utf8" });
  expect(r.status).toBe(0);
  const flags = ["--grpc-port", "--host", "--pool-name", "--pool-namespace", "--pool-poll-ms", "--endpoints-file", "--metrics-port", "--health-port"];
  for (const f of [...flags, "--scrape-interval-ms", "--stale-after-ms", "--failure-mode", "--log-level", "--help"]) expect(r.stdout).toContain(f);
  for (const name of EPP_CONFIG.envNames()) expect(r.stdout).toContain(name);
});

test("bad arguments exit 2 with a message naming the flag", () => {
  const file = tempFile("e.json", "[]");
  const cases: [string[], RegExp][] = [
    [["--endpoints-file", file, "--grpc-port", "x"], /--grpc-port/],
    [["--endpoints-file", file, "--failure-mode", "Maybe"], /--failure-mode: expected one of FailOpen, FailClose/],
    [["--endpoints-file", file, "--scrape-interval-ms", "0"], /--scrape-interval-ms/],
    [["--endpoints-file", file, "--bogus"], /bogus/],
    [[], /exactly one of --pool-name .* or --endpoints-file/],
    [["--endpoints-file", file, "--pool-name", "p"], /exactly one of/],
  ];
  for (const [args, message] of cases) {
    const r = spawnSync(process.execPath, [bin, ...args], { encoding: "utf8" });
    expect(r.status, args.join(" ")).toBe(2);
    expect(r.stderr).toMatch(message);
  }
});

test("an endpoints file that does not parse stops the start with exit 1 naming the entry", () => {
  const file = tempFile("e.yaml", "- address: 10.0.0.1\n  port: 8000\n  role: decoder\n");
  const r = spawnSync(process.execPath, [bin, "--endpoints-file", file, "--grpc-port", "0", "--metrics-port", "0", "--health-port", "0"], { encoding: "utf8" });
  expect(r.status).toBe(1);
  expect(r.stderr).toMatch(/endpoints file .*e\.yaml: entry 0\.role/);
});

test("static mode: listens, serves /health and /metrics, routes a request, stops on SIGTERM with 0", async () => {
  const pod = await startFakeModelServer({ waiting: 1 });
  cleanup.push(() => pod.close());
  const file = tempFile("e.yaml", `- address: 127.0.0.1\n  port: ${pod.port}\n  role: both\n  name: laptop\n`);
  const child: ChildProcess = spawn(process.execPath, [bin, "--endpoints-file", file, "--grpc-port", "0", "--metrics-port", "0", "--health-port", "0", "--log-level", "warn"], {
    stdio: ["ignore", "pipe", "pipe"],
  });
  cleanup.push(() => void child.kill("SIGKILL"));
  let out = "";
  child.stdout!.on("data", (d) => (out += d));
  for (let i = 0; i < 300 && !out.includes("listening"); i++) await new Promise((r) => setTimeout(r, 50));
  const m = /listening on (127\.0\.0\.1:\d+) .*health on port (\d+), metrics on port (\d+); endpoints from .*e\.yaml/.exec(out);
  expect(m, out).not.toBeNull();
  const [, address, , metricsPort] = m!;
  let health: any = {};
  for (let i = 0; i < 100 && !health.ready?.length; i++) {
    await new Promise((r) => setTimeout(r, 20));
    health = await (await fetch(`http://127.0.0.1:${metricsPort}/health`)).json();
  }
  expect(health).toEqual({ status: "ok", endpoints: 1, ready: [{ endpoint: `127.0.0.1:${pod.port}`, name: "laptop", role: "both" }] });
  const envoy = new EnvoyStub(address);
  const a = await envoy.request({ body: { model: "m", prompt: "hi" } });
  envoy.close();
  expect(a.setHeaders["x-gateway-destination-endpoint"]).toBe(`127.0.0.1:${pod.port}`);
  const text = await (await fetch(`http://127.0.0.1:${metricsPort}/metrics`)).text();
  expect(text).toMatch(/^airm_epp_picks_total\{reason="only_candidate",role="both"\} 1$/m);
  const code = new Promise<number | null>((resolve) => child.once("exit", resolve));
  child.kill("SIGTERM");
  expect(await code).toBe(0);
});
