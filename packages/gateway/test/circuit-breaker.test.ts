// The gateway's per-endpoint circuit breaker: a worker whose /health says ready but whose calls
// fail (500) is taken out of rotation after AIRM_BREAKER_FAILURES failures in a row, gets one
// trial call per cooldown (which doubles while trials fail), and comes back once a trial
// succeeds. The workers are scripted HTTP servers speaking the internal contract: a real engine
// cannot be made to fail its calls while its /health stays green, and then to recover.
import { createServer, type Server } from "node:http";
import type { AddressInfo } from "node:net";
import { ApiError, encodeEvent } from "@airm/internal-api";
import { afterAll, describe, expect, it } from "vitest";
import { createGatewayApp, EndpointPool, GatewayMetrics, Orchestrator } from "../src/index.ts";
import { scriptedHealth } from "./scripted-health.ts";

const health = scriptedHealth("scripted");
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
const servers: Server[] = [];
const pools: EndpointPool[] = [];
afterAll(() => {
  for (const p of pools) p.stop();
  for (const s of servers) s.close();
});

/** A solo worker answering generate with one token, or with 500 while `state.broken`; counts its generate calls. */
async function worker(state: { broken: boolean; calls: number }): Promise<string> {
  const server = createServer((req, res) => {
    if (req.url === "/health") return res.writeHead(200, { "content-type": "application/json" }).end(JSON.stringify(health));
    if (req.url === "/internal/release") return res.writeHead(200, { "content-type": "application/json" }).end(JSON.stringify({ requestId: "x", released: false }));
    state.calls++;
    if (state.broken)
      return new ApiError(500, "engine_error", "the engine failed")
        .toResponse()
        .text()
        .then((t) => res.writeHead(500, { "content-type": "application/json" }).end(t));
    res.writeHead(200, { "content-type": "application/x-ndjson" });
    res.write(encodeEvent({ type: "first", token: 1, text: "a", eos: false, promptTokens: 2, seqLen: 64, maxTokens: 1, prefillMs: 1 }));
    res.end(encodeEvent({ type: "done", finishReason: "length", completionTokens: 1, text: "", decodeMs: 0 }));
  });
  servers.push(server);
  await new Promise<void>((r) => server.listen(0, "127.0.0.1", r));
  return `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
}

describe("the circuit breaker", () => {
  it("opens after consecutive failures, probes with one trial per cooldown, and closes on a good trial", async () => {
    const bad = { broken: true, calls: 0 };
    const good = { broken: false, calls: 0 };
    const pool = new EndpointPool("solo", [await worker(bad), await worker(good)], { breakerFailures: 2, breakerCooldownMs: 300 });
    pools.push(pool);
    await pool.start(60_000);
    const app = createGatewayApp({
      orchestrator: new Orchestrator({ solo: pool, prefillTimeoutMs: 5000, decodeIdleTimeoutMs: 5000, kvTimeoutMs: 5000 }),
      pools: [pool],
      modelPool: pool,
      metrics: new GatewayMetrics(),
      maxBodyBytes: 1 << 20,
    });
    const ask = async () =>
      (await app.request("/v1/completions", { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify({ prompt: "x", max_tokens: 1 }) })).status;

    // Sequential requests alternate between the two (equal load) until the bad one has failed twice.
    const first = [];
    for (let i = 0; i < 10; i++) first.push(await ask());
    expect(bad.calls).toBe(2);
    expect(first.filter((s) => s === 500)).toHaveLength(2);
    expect(first.filter((s) => s === 200)).toHaveLength(8);
    expect(pool.endpoints[0].breaker.state).toBe("open");
    expect(pool.endpoints[0].lastError).toMatch(/^circuit open after 2 failed calls/);

    // After the cooldown one trial goes there; it fails, so the breaker opens for twice as long.
    await sleep(350);
    for (let i = 0; i < 4; i++) await ask();
    expect(bad.calls).toBe(3);
    expect(pool.endpoints[0].breaker.cooldownMs).toBe(600);
    await sleep(350);
    for (let i = 0; i < 4; i++) await ask();
    expect(bad.calls).toBe(3); // still inside the doubled cooldown

    // The worker recovers: the next trial succeeds and it takes its share again.
    bad.broken = false;
    await sleep(300);
    const after = [];
    for (let i = 0; i < 6; i++) after.push(await ask());
    expect(after.every((s) => s === 200)).toBe(true);
    expect(pool.endpoints[0].breaker.state).toBe("closed");
    expect(bad.calls).toBeGreaterThanOrEqual(6);
  });
});
