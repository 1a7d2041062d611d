// A finished request leaves no timer behind. The request deadline (AIRM_REQUEST_TIMEOUT_S, 30 min
// by default) and the PD prefill and KV-hold bounds (AIRM_PREFILL_TIMEOUT_MS, 10 min) are each
// combined with other signals in AbortSignal.any; Node (24) keeps an AbortSignal.timeout given to
// AbortSignal.any alive until its timer fires, with what hangs on it (about 0.8 kB a request), so
// a gateway's heap grew with every request for the whole timeout. The timers are cleared when
// the request (or the worker call) ends instead; the bounds still end what runs too long. The
// workers are scripted HTTP servers speaking the internal contract (a solo worker, and a prefill
// and a decode worker).
import { createHook } from "node:async_hooks";
import { createServer, type Server } from "node:http";
import type { AddressInfo } from "node:net";
import { encodeEvent, type WorkerEvent } from "@airm/internal-api";
import { afterAll, describe, expect, it } from "vitest";
import { createGatewayApp, EndpointPool, GatewayMetrics, Orchestrator } from "../src/index.ts";
import { scriptedHealth } from "./scripted-health.ts";

const health = scriptedHealth("scripted");
const TOKENS = 4;
const servers: Server[] = [];
const pools: EndpointPool[] = [];
afterAll(() => {
  for (const p of pools) p.stop();
  for (const s of servers) s.close();
});

const json = (res: import("node:http").ServerResponse, body: unknown) => res.writeHead(200, { "content-type": "application/json" }).end(JSON.stringify(body));
const first = { token: 0, text: "t0 ", eos: false, promptTokens: 3, seqLen: 64, maxTokens: TOKENS, prefillMs: 1 };

/** A worker of every role: solo generate, PD prefill (after `prefillMs`), kv-hold and decode; TOKENS tokens each. */
async function worker(prefillMs = 0): Promise<string> {
  const server = createServer(async (req, res) => {
    let raw = "";
    for await (const c of req) raw += c;
    const requestId = raw ? (JSON.parse(raw) as { requestId?: string }).requestId : undefined;
    if (req.url === "/health") return void json(res, health);
    if (req.url === "/internal/release") return void json(res, { requestId, released: false });
    if (req.url === "/internal/kv-hold") return void json(res, { requestId, held: null, promptTokens: 3 });
    if (req.url === "/internal/prefill") {
      await new Promise((r) => setTimeout(r, prefillMs));
      return void json(res, { requestId, first, transport: "scripted", kvPushMs: 0, kvBytes: 0 });
    }
    const events: WorkerEvent[] = req.url === "/internal/generate" ? [{ type: "first", ...first }] : [{ type: "ready", promptTokens: 3, seqLen: 64, kvLoadMs: 0, kvWaitMs: 0 }];
    for (let i = 1; i < TOKENS; i++) events.push({ type: "token", index: i, token: i, text: `t${i} ` });
    events.push({ type: "done", finishReason: "length", completionTokens: TOKENS, text: "", decodeMs: 1 });
    res.writeHead(200, { "content-type": "application/x-ndjson" }).end(events.map(encodeEvent).join(""));
  });
  servers.push(server);
  await new Promise<void>((r) => server.listen(0, "127.0.0.1", r));
  return `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
}

async function gateway(urls: { solo?: string[]; prefill?: string[]; decode?: string[] }, prefillTimeoutMs: number) {
  const p = Object.fromEntries(Object.entries(urls).map(([role, u]) => [role, new EndpointPool(role, u)])) as Record<string, EndpointPool>;
  for (const pool of Object.values(p)) {
    pools.push(pool);
    await pool.start(60_000);
  }
  const app = createGatewayApp({
    orchestrator: new Orchestrator({ ...p, prefillTimeoutMs, decodeIdleTimeoutMs: 5_000, kvTimeoutMs: 5_000 }),
    pools: Object.values(p),
    modelPool: p.solo ?? p.decode,
    metrics: new GatewayMetrics(),
    maxBodyBytes: 1 << 20,
    requestTimeoutS: 1800,
  });
  return async (stream: boolean) => {
    const r = await app.request("/v1/completions", {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({ prompt: "x", max_tokens: TOKENS, stream }),
    });
    return { status: r.status, text: await r.text() };
  };
}

/** Runs `fn` and counts the timers of a minute or more it started that are still pending at its end. */
async function longTimersLeft(fn: () => Promise<void>): Promise<number> {
  const pending = new Set<number>();
  const hook = createHook({
    init(id, type, _trigger, resource) {
      if (type === "Timeout" && (resource as { _idleTimeout?: number })._idleTimeout! >= 60_000) pending.add(id);
    },
    destroy(id) {
      pending.delete(id);
    },
  });
  hook.enable();
  try {
    await fn();
    await new Promise((r) => setImmediate(r));
  } finally {
    hook.disable();
  }
  return pending.size;
}

describe("a finished request's timers", () => {
  it.each([
    ["solo: the request deadline's timer goes with the request (JSON and streamed)", false],
    ["PD: the deadline's, the KV hold's and the prefill's timers go with the request", true],
  ])("%s", async (_name, pd) => {
    const ask = await gateway(pd ? { prefill: [await worker()], decode: [await worker()] } : { solo: [await worker()] }, 600_000);
    const left = await longTimersLeft(async () => {
      for (let i = 0; i < 10; i++) {
        const r = await ask(i % 2 === 0);
        expect(r.status, r.text).toBe(200);
        expect(r.text).toContain("t3 ");
      }
    });
    expect(left).toBe(0);
  });

  it("PD: a prefill that takes longer than AIRM_PREFILL_TIMEOUT_MS is still a 504", async () => {
    const ask = await gateway({ prefill: [await worker(2_000)], decode: [await worker()] }, 300);
    const r = await ask(false);
    expect(r.status).toBe(504);
    expect(JSON.parse(r.text).error).toMatchObject({ code: "prefill_unreachable" });
    expect(JSON.parse(r.text).error.message).toMatch(/did not answer/);
  });
});
