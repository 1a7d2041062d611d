// --metrics-port with mutual TLS on the serving port (AIRM_TLS_DIR, certificates made by openssl):
// the plain port answers GET /health and GET /metrics (what a kubelet probe and a scraper without
// a client certificate read) and nothing else; the serving port still refuses plain HTTP; a
// draining worker says so on both.
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { makeTlsTestDirs } from "@airm/rm-core";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { RunningWorker } from "../src/index.ts";
import { tinyWorker } from "./tiny-worker.ts";

let certs: string;
let w: RunningWorker;
let plain: string;

beforeAll(async () => {
  certs = mkdtempSync(join(tmpdir(), "airm-worker-metrics-port-"));
  const dirs = makeTlsTestDirs(certs);
  w = await tinyWorker({ role: "solo", backend: "rngd", seed: 5, metricsPort: 0, env: { AIRM_TLS_DIR: dirs.good } });
  plain = `http://127.0.0.1:${w.metricsPort}`;
}, 60_000);
afterAll(async () => {
  await w?.close();
  if (certs) rmSync(certs, { recursive: true, force: true });
});

describe("a TLS worker with --metrics-port", () => {
  it("serves /health and /metrics in plain HTTP on that port", async () => {
    expect(w.url).toMatch(/^https:\/\//);
    expect(w.metricsPort).not.toBe(w.port);
    const h = await fetch(`${plain}/health`);
    expect(h.status).toBe(200);
    expect(await h.json()).toMatchObject({ role: "solo" });
    const m = await (await fetch(`${plain}/metrics`)).text();
    expect(m).toContain("vllm:num_requests_running");
  });

  it("serves nothing else there: the internal routes stay behind TLS", async () => {
    const r = await fetch(`${plain}/internal/generate`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({ requestId: "x", input: { prompt: "hi" }, maxTokens: 2 }),
    });
    expect(r.status).toBe(404);
    expect(((await r.json()) as { error: { message: string } }).error.message).toContain("GET /health and GET /metrics only");
    const onServing = await fetch(`${w.url.replace("https://", "http://")}/health`, { signal: AbortSignal.timeout(5000) }).then(
      (x) => `status ${x.status}`,
      (e: Error) => e.message,
    );
    expect(onServing).toBe("fetch failed");
  });

  it("reports a drain on the plain port (a kubelet readiness probe sees it)", async () => {
    const drained = w.drain(0);
    expect((await fetch(`${plain}/health`)).status).toBe(503);
    await drained;
  });
});
