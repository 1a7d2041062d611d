// Busy is not dead: a worker whose /health does not answer while it computes (as a worker whose
// event loop is held by the engine would) keeps getting requests as long as the requests it holds
// make progress; one that stops making progress, or refuses connections, is taken out. The worker
// is a scripted HTTP server speaking the internal contract (events built with the contract's
// encoder), because the point is a /health that cannot answer, which a real worker must not do.
import { createServer, type Server } from "node:http";
import type { AddressInfo } from "node:net";
import { encodeEvent, type WorkerEvent } from "@airm/internal-api";
import { afterAll, describe, expect, it } from "vitest";
import { createGatewayApp, EndpointPool, GatewayMetrics, Orchestrator } from "../src/index.ts";
import { scriptedHealth } from "./scripted-health.ts";

const MODEL = "scripted";
const health = scriptedHealth(MODEL);

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

/**
 * A solo worker that streams `tokens` tokens `stepMs` apart (or, with `stall`, sends nothing
 * after the first token), and whose /health waits until no request is in flight.
 */
function busyWorker(tokens: number, stepMs: number, stall = false): Promise<{ server: Server; url: string; healthWaits: () => number }> {
  let inFlight = 0;
  let waits = 0;
  const idle: Array<() => void> = [];
  const server = createServer(async (req, res) => {
    if (req.url === "/health") {
      if (inFlight > 0) {
        waits++;
        await new Promise<void>((r) => idle.push(r));
      }
      if (!res.destroyed) res.writeHead(200, { "content-type": "application/json" }).end(JSON.stringify(health));
      return;
    }
    if (req.url === "/internal/release") {
      res.writeHead(200, { "content-type": "application/json" }).end(JSON.stringify({ requestId: "x", released: false }));
      return;
    }
    inFlight++;
    try {
      res.writeHead(200, { "content-type": "application/x-ndjson" });
      res.flushHeaders();
      const send = (ev: WorkerEvent) => !res.destroyed && res.write(encodeEvent(ev));
      await sleep(stepMs);
      send({ type: "first", token: 1, text: "a", eos: false, promptTokens: 2, seqLen: 64, maxTokens: tokens + 1, prefillMs: stepMs });
      if (stall) {
        await new Promise<void>((r) => res.once("close", () => r()));
        return;
      }
      for (let i = 1; i <= tokens; i++) {
        await sleep(stepMs);
        send({ type: "token", index: i, token: 1, text: "a" });
      }
      send({ type: "done", finishReason: "length", completionTokens: tokens + 1, text: "", decodeMs: tokens * stepMs });
      res.end();
    } finally {
      inFlight--;
      if (inFlight === 0) for (const wake of idle.splice(0)) wake();
    }
  });
  return new Promise((resolve) =>
    server.listen(0, "127.0.0.1", () => resolve({ server, url: `http://127.0.0.1:${(server.address() as AddressInfo).port}`, healthWaits: () => waits })),
  );
}

const servers: Server[] = [];
const pools: EndpointPool[] = [];
afterAll(() => {
  for (const p of pools) p.stop();
  for (const s of servers) s.close();
});

/** A gateway over one solo worker probed every 50 ms with a 150 ms probe timeout. */
async function gatewayFor(url: string, busyGraceMs: number) {
  const pool = new EndpointPool("solo", [url], { probeTimeoutMs: 150, busyGraceMs });
  pools.push(pool);
  await pool.start(50);
  const app = createGatewayApp({
    orchestrator: new Orchestrator({ solo: pool, prefillTimeoutMs: 10_000, decodeIdleTimeoutMs: 10_000, kvTimeoutMs: 5_000 }),
    pools: [pool],
    modelPool: pool,
    metrics: new GatewayMetrics(),
    maxBodyBytes: 1 << 20,
  });
  const post = (body: unknown) => app.request("/v1/completions", { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify(body) });
  return { pool, post };
}

describe("busy is not dead", () => {
  it("a worker whose /health stalls while its requests make progress gets every request (no 503)", async () => {
    const w = await busyWorker(20, 40); // ~840 ms per request, a token every 40 ms
    servers.push(w.server);
    const { pool, post } = await gatewayFor(w.url, 2_000);
    // Requests arrive over ~2 s while others run: the worker is never idle, its probes time out.
    const statuses = await Promise.all(
      Array.from({ length: 8 }, async (_, i) => {
        await sleep(i * 250);
        const r = await post({ model: MODEL, prompt: "x", max_tokens: 21 });
        const body = (await r.json()) as any;
        return r.status === 200 ? body.usage.completion_tokens : `${r.status} ${JSON.stringify(body.error)}`;
      }),
    );
    expect(statuses).toEqual(Array(8).fill(21));
    // The probes did stall (the case is real), and the endpoint stayed up throughout.
    expect(w.healthWaits()).toBeGreaterThan(3);
    expect(pool.endpoints[0].healthy).toBe(true);
  });

  it("a worker that holds requests but makes no progress past the grace is taken out (503 for the next)", async () => {
    const w = await busyWorker(5, 20, true);
    servers.push(w.server);
    const { pool, post } = await gatewayFor(w.url, 400);
    const stuck = post({ model: MODEL, prompt: "x", max_tokens: 6, stream: true });
    const r0 = await stuck;
    expect(r0.status).toBe(200);
    // Its probes time out, nothing arrives: after the grace it is down.
    for (let i = 0; i < 40 && pool.endpoints[0].healthy; i++) await sleep(50);
    expect(pool.endpoints[0].healthy).toBe(false);
    expect(pool.endpoints[0].lastError).toContain("health probe failed");
    const r = await post({ model: MODEL, prompt: "x", max_tokens: 2 });
    expect(r.status).toBe(503);
    expect(((await r.json()) as any).error.code).toBe("no_healthy_worker");
    await r0.body?.cancel();
  });

  it("a worker that refuses connections is down at the next probe even with requests outstanding", async () => {
    const w = await busyWorker(50, 40);
    const { pool, post } = await gatewayFor(w.url, 60_000);
    const running = post({ model: MODEL, prompt: "x", max_tokens: 51, stream: true });
    const r0 = await running;
    expect(r0.status).toBe(200);
    w.server.closeAllConnections();
    w.server.close();
    for (let i = 0; i < 40 && pool.endpoints[0].healthy; i++) await sleep(50);
    expect(pool.endpoints[0].healthy).toBe(false);
    // Refused, or a pooled connection found closed: either way a failed probe, not a slow one.
    expect(pool.endpoints[0].lastError).toContain("health probe failed");
    await r0.body?.cancel().catch(() => {});
  });
});
