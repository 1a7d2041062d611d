// Which model a request gets when it names none: with several served (two workers reporting
// different models), a 404 that names them; nothing is sent to a worker. The workers are scripted
// /health answers (no generation is reached).
import { createServer, type Server } from "node:http";
import type { AddressInfo } from "node:net";
import { afterAll, expect, it } from "vitest";
import { createGatewayApp, EndpointPool, GatewayMetrics, Orchestrator } from "../src/index.ts";
import { scriptedHealth } from "./scripted-health.ts";

const servers: Server[] = [];
let generations = 0;

function worker(id: string): Promise<string> {
  const server = createServer((req, res) => {
    if (req.url === "/health") return void res.writeHead(200, { "content-type": "application/json" }).end(JSON.stringify(scriptedHealth(id)));
    generations++;
    res.writeHead(500).end();
  });
  servers.push(server);
  return new Promise((resolve) => server.listen(0, "127.0.0.1", () => resolve(`http://127.0.0.1:${(server.address() as AddressInfo).port}`)));
}

afterAll(() => {
  for (const s of servers) s.close();
});

it("a request without model is a 404 naming the served models when there are several", async () => {
  const pool = new EndpointPool("solo", [await worker("model-a"), await worker("model-b")]);
  await pool.start(60_000);
  try {
    const app = createGatewayApp({
      orchestrator: new Orchestrator({ solo: pool, prefillTimeoutMs: 5_000, decodeIdleTimeoutMs: 5_000, kvTimeoutMs: 5_000 }),
      pools: [pool],
      modelPool: pool,
      metrics: new GatewayMetrics(),
      maxBodyBytes: 1 << 20,
    });
    const r = await app.request("/v1/completions", { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify({ prompt: "x", max_tokens: 2 }) });
    expect(r.status).toBe(404);
    const err = ((await r.json()) as any).error;
    expect(err).toMatchObject({ code: "model_not_found", param: "model", type: "invalid_request_error" });
    expect(err.message).toContain("model-a");
    expect(err.message).toContain("model-b");
    expect(generations).toBe(0);
  } finally {
    pool.stop();
  }
});
