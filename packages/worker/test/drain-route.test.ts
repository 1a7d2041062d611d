// POST / DELETE /internal/drain over real HTTP: a worker drained on request keeps its process and
// the request it runs (which ends whole), refuses new ones with 503 worker_draining, says so on
// /health and in airm_draining; DELETE makes it serve again. The route asks the internal token.
import { INTERNAL_TOKEN_HEADER, newInternalToken } from "@airm/rm-core";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { RunningWorker } from "../src/index.ts";
import { tinyWorker } from "./tiny-worker.ts";

const token = newInternalToken();
let w: RunningWorker;

beforeAll(async () => {
  w = await tinyWorker({ role: "solo", backend: "rngd", seed: 7, env: { AIRM_INTERNAL_TOKEN: token } });
}, 60_000);
afterAll(async () => {
  await w?.close();
});

const auth = { [INTERNAL_TOKEN_HEADER]: token, "content-type": "application/json" };
const drain = (method: "POST" | "DELETE" | "GET", headers: Record<string, string> = auth) => fetch(`${w.url}/internal/drain`, { method, headers });
const generate = (requestId: string, maxTokens: number) =>
  fetch(`${w.url}/internal/generate`, { method: "POST", headers: auth, body: JSON.stringify({ requestId, input: { promptTokenIds: [5, 6, 7, 8] }, maxTokens, ignoreEos: true }) });
const drainingGauge = async () => Number((await (await fetch(`${w.url}/metrics`)).text()).match(/^airm_draining(?:\{[^}]*\})? (\d+)/m)?.[1]);

describe("draining a worker on request", () => {
  it("asks the internal token", async () => {
    expect((await drain("POST", {})).status).toBe(401);
    expect((await drain("GET")).status).toBe(200);
    expect(await (await drain("GET")).json()).toMatchObject({ draining: false, drained_by: null });
  });

  it("ends a request in its stream whole, refuses new ones, and says it drains; DELETE resumes", async () => {
    const running = generate("cmpl-drain-running", 40);
    const r = await running;
    expect(r.status).toBe(200);
    const body = r.text();
    const d = await drain("POST");
    expect(d.status).toBe(200);
    expect(await d.json()).toMatchObject({ draining: true, drained_by: "api" });
    const lines = (await body)
      .trim()
      .split("\n")
      .map((l) => JSON.parse(l));
    expect(lines.filter((e) => e.type === "token" || e.type === "first")).toHaveLength(40);
    expect(lines.at(-1)).toMatchObject({ type: "done" });

    const refused = await generate("cmpl-drain-new", 4);
    expect(refused.status).toBe(503);
    expect(((await refused.json()) as { error: { code: string } }).error.code).toBe("worker_draining");
    expect((await fetch(`${w.url}/health`)).status).toBe(503);
    expect(await drainingGauge()).toBe(1);

    const resumed = await drain("DELETE");
    expect(await resumed.json()).toMatchObject({ draining: false, drained_by: null });
    expect((await fetch(`${w.url}/health`)).status).toBe(200);
    expect(await drainingGauge()).toBe(0);
    const again = await generate("cmpl-drain-after", 4);
    expect(again.status).toBe(200);
    await again.text();
  });

  it("cannot resume a drain a stop signal started (409)", async () => {
    w.runtime.draining = true;
    w.runtime.drainedBy = "signal";
    const r = await drain("DELETE");
    expect(r.status).toBe(409);
    expect(((await r.json()) as { error: { code: string } }).error.code).toBe("stopping");
    w.runtime.draining = false;
    w.runtime.drainedBy = null;
  });
});
