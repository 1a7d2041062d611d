// The solo path's prefill timeout bounds the wait for the first token, not the whole generation:
// a worker that answers its first token in time and then streams for longer than the timeout is
// relayed to the end; one that sends no first token in time is a 504. The worker here is a
// scripted HTTP server speaking the internal contract (its events built with the contract's own
// encoder and checked by the gateway's parser), because a real engine cannot be made to take a
// chosen time for its first token and its later ones.
import { createServer, type Server } from "node:http";
import type { AddressInfo } from "node:net";
import { encodeEvent, type WorkerEvent } from "@airm/internal-api";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { createGatewayApp, EndpointPool, GatewayMetrics, Orchestrator } from "../src/index.ts";
import { scriptedHealth } from "./scripted-health.ts";

const MODEL = "scripted";
const health = scriptedHealth(MODEL);

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

/** Generate calls whose connection the gateway closed before the worker finished them. */
let cutShort = 0;

/** A solo worker whose first token comes after `firstMs` and each of `tokens` more after `stepMs`. */
function scriptedWorker(firstMs: number, tokens: number, stepMs: number): Promise<{ server: Server; url: string }> {
  const server = createServer(async (req, res) => {
    res.once("close", () => {
      if (!res.writableFinished) cutShort++;
    });
    if (req.url === "/health") {
      res.writeHead(200, { "content-type": "application/json" }).end(JSON.stringify(health));
      return;
    }
    if (req.url === "/internal/release") {
      res.writeHead(200, { "content-type": "application/json" }).end(JSON.stringify({ requestId: "x", released: false }));
      return;
    }
    res.writeHead(200, { "content-type": "application/x-ndjson" });
    res.flushHeaders();
    const send = (ev: WorkerEvent) => !res.destroyed && res.write(encodeEvent(ev));
    await sleep(firstMs);
    send({ type: "first", token: 1, text: "a", eos: false, promptTokens: 2, seqLen: 64, maxTokens: tokens + 1, prefillMs: firstMs });
    for (let i = 1; i <= tokens; i++) {
      await sleep(stepMs);
      send({ type: "token", index: i, token: 1, text: "a" });
    }
    send({ type: "done", finishReason: "length", completionTokens: tokens + 1, text: "", decodeMs: tokens * stepMs });
    res.end();
  });
  return new Promise((resolve) => server.listen(0, "127.0.0.1", () => resolve({ server, url: `http://127.0.0.1:${(server.address() as AddressInfo).port}` })));
}

const servers: Server[] = [];
const pools: EndpointPool[] = [];

async function gatewayFor(url: string, prefillTimeoutMs: number, requestTimeoutS?: number) {
  const pool = new EndpointPool("solo", [url]);
  pools.push(pool);
  await pool.start(60_000);
  const app = createGatewayApp({
    orchestrator: new Orchestrator({ solo: pool, prefillTimeoutMs, decodeIdleTimeoutMs: 5_000, kvTimeoutMs: 5_000 }),
    pools: [pool],
    modelPool: pool,
    metrics: new GatewayMetrics(),
    maxBodyBytes: 1 << 20,
    requestTimeoutS,
  });
  return (body: unknown) => app.request("/v1/completions", { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify(body) });
}

let slowStream: string;
let slowFirst: string;
beforeAll(async () => {
  const a = await scriptedWorker(50, 8, 100); // first token at 50 ms, the stream ends after ~850 ms
  const b = await scriptedWorker(1_500, 1, 10); // first token after 1.5 s
  servers.push(a.server, b.server);
  slowStream = a.url;
  slowFirst = b.url;
});
afterAll(() => {
  for (const p of pools) p.stop();
  for (const s of servers) s.close();
});

describe("solo prefill timeout", () => {
  it("does not cut a generation that outlasts it once the first token arrived", async () => {
    const post = await gatewayFor(slowStream, 400);
    const r = await post({ model: MODEL, prompt: "x", max_tokens: 9 });
    const body = (await r.json()) as any;
    expect(r.status, JSON.stringify(body)).toBe(200);
    expect(body.usage.completion_tokens).toBe(9);
    expect(body.choices[0].finish_reason).toBe("length");
  });

  it("is a 504 prefill_timeout when no first token comes in time", async () => {
    const post = await gatewayFor(slowFirst, 400);
    const r = await post({ model: MODEL, prompt: "x", max_tokens: 2 });
    expect(r.status).toBe(504);
    expect(((await r.json()) as any).error).toMatchObject({ code: "prefill_timeout", type: "server_error" });
  });
});

describe("request deadlines", () => {
  const sse = async (r: Response) =>
    (await r.text())
      .split("\n")
      .filter((l) => l.startsWith("data: ") && l !== "data: [DONE]")
      .map((l) => JSON.parse(l.slice(6)));

  it("a request's own timeout ends it with 504 request_timeout and drops the worker call", async () => {
    const post = await gatewayFor(slowStream, 5_000, 60);
    const before = cutShort;
    const r = await post({ model: MODEL, prompt: "x", max_tokens: 9, timeout: 0.4 });
    expect(r.status).toBe(504);
    const err = ((await r.json()) as any).error;
    expect(err).toMatchObject({ code: "request_timeout", type: "server_error" });
    expect(err.message).toContain("its timeout");
    await new Promise((res) => setTimeout(res, 100));
    expect(cutShort).toBe(before + 1);
  });

  it("the server's maximum ends a stream with a request_timeout error event after the tokens it sent", async () => {
    const post = await gatewayFor(slowStream, 5_000, 0.45);
    const r = await post({ model: MODEL, prompt: "x", max_tokens: 9, stream: true, timeout: 30 });
    expect(r.status).toBe(200);
    const chunks = await sse(r);
    const last = chunks.at(-1);
    expect(last.error).toMatchObject({ code: "request_timeout" });
    expect(last.error.message).toContain("AIRM_REQUEST_TIMEOUT_S");
    expect(chunks.filter((c) => c.choices?.[0]?.text).length).toBeGreaterThan(0);
  });

  it("refuses a timeout that is not a positive number", async () => {
    const post = await gatewayFor(slowStream, 5_000, 60);
    const r = await post({ model: MODEL, prompt: "x", max_tokens: 1, timeout: -1 });
    expect(r.status).toBe(400);
    expect(((await r.json()) as any).error.param).toBe("timeout");
  });
});
