// The vllm:* gauges the gateway serves on its own port for an endpoint picker: requests before
// their first token count as waiting, streaming ones as running up to the workers' slots (the
// rest wait), and KV usage is the workers' used KV blocks over their blocks, as their /health
// reports them. The worker is a scripted solo worker (2 slots, 8 blocks of 16, 4 blocks per
// request it holds) whose requests the test holds open at will.
import { createServer, type Server } from "node:http";
import type { AddressInfo } from "node:net";
import { encodeEvent } from "@airm/internal-api";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { startGateway, type RunningGateway } from "../src/index.ts";
import { scriptedHealth } from "./scripted-health.ts";

const MODEL = "scripted";
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

let worker: Server;
let gw: RunningGateway;
/** While true, new requests get no first token. */
let holdFirst = false;

/** Requests the scripted worker holds (each takes 4 of its 8 KV blocks, at most all 8). */
let held = 0;

beforeAll(async () => {
  const health = () => {
    const used = Math.min(8, 4 * held);
    return {
      ...scriptedHealth(MODEL),
      requests: { waiting: 0, running: 0, slots: 2 },
      kvCache: { blockSize: 16, totalBlocks: 8, usedBlocks: used, freeBlocks: 8 - used, cachedBlocks: 0, preemptions: 0 },
    };
  };
  worker = createServer(async (req, res) => {
    if (req.url === "/health") return res.writeHead(200, { "content-type": "application/json" }).end(JSON.stringify(health()));
    if (req.url === "/internal/release") return res.writeHead(200, { "content-type": "application/json" }).end(JSON.stringify({ requestId: "x", released: false }));
    res.writeHead(200, { "content-type": "application/x-ndjson" });
    res.flushHeaders();
    held++;
    const closed = new Promise<void>((r) =>
      res.once("close", () => {
        held--;
        r();
      }),
    );
    if (holdFirst) return closed;
    res.write(encodeEvent({ type: "first", token: 1, text: "a", eos: false, promptTokens: 2, seqLen: 64, maxTokens: 60, prefillMs: 1 }));
    return closed; // streaming until the client goes
  });
  await new Promise<void>((r) => worker.listen(0, "127.0.0.1", r));
  gw = await startGateway({ port: 0, solo: [`http://127.0.0.1:${(worker.address() as AddressInfo).port}`], maxWaiting: 3, healthIntervalMs: 50 });
});

afterAll(async () => {
  await gw?.close();
  worker?.closeAllConnections();
  worker?.close();
});

async function gauges(): Promise<{ waiting: number; running: number; kv: number; text: string }> {
  const text = await (await fetch(`${gw.url}/metrics`)).text();
  const g = (n: string) => Number(new RegExp(`^${n} (\\S+)$`, "m").exec(text)?.[1]);
  return { waiting: g("vllm:num_requests_waiting"), running: g("vllm:num_requests_running"), kv: g("vllm:kv_cache_usage_perc"), text };
}

/** A streamed completion, held open: resolves once its response started; abort to end it. */
async function open(ac: AbortController): Promise<Response | null> {
  return fetch(`${gw.url}/v1/completions`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify({ model: MODEL, prompt: "x", max_tokens: 50, stream: true }),
    signal: ac.signal,
  }).catch(() => null);
}

async function until(what: string, f: () => Promise<boolean>): Promise<void> {
  for (let i = 0; i < 100; i++) {
    if (await f()) return;
    await sleep(20);
  }
  throw new Error(`not within 2 s: ${what}; gauges ${JSON.stringify(await gauges().then(({ text: _t, ...g }) => g))}`);
}

describe("the pod's vllm:* gauges on the gateway's port", () => {
  it("keeps idle connections 65 s, past a caller's own idle timeout (no request sent on a connection the gateway is closing)", async () => {
    const r = await fetch(`${gw.url}/metrics`);
    await r.text();
    expect(r.headers.get("keep-alive")).toBe("timeout=65");
  });

  it("idle: zeros, and the KV geometry of the worker's 8 blocks of 16 positions", async () => {
    const g = await gauges();
    expect([g.waiting, g.running, g.kv]).toEqual([0, 0, 0]);
    expect(g.text).toMatch(/^vllm:cache_config_info\{block_size="16",num_gpu_blocks="8"\} 1$/m);
  });

  it("streaming requests run up to the slots, the rest wait; KV usage reads the workers' blocks in use (1.0 when they are all taken); all back to 0 after", async () => {
    const ac = new AbortController();
    await Promise.all([open(ac), open(ac), open(ac)]);
    await until("3 streaming: 2 running, 1 waiting", async () => {
      const g = await gauges();
      return g.running === 2 && g.waiting === 1 && g.kv === 1;
    });
    // One more whose prefill has not answered: waiting before its first token.
    holdFirst = true;
    const pending = open(ac);
    await until("a fourth before its first token: 2 waiting", async () => (await gauges()).waiting === 2);
    const g = await gauges();
    expect([g.running, g.kv]).toEqual([2, 1]);
    holdFirst = false;
    ac.abort();
    await pending;
    await until("every request gone", async () => {
      const z = await gauges();
      return z.waiting === 0 && z.running === 0 && z.kv === 0;
    });
  });
});

describe("a bounded waiting queue (AIRM_MAX_WAITING, 3 here)", () => {
  it("one request past the bound gets 429 with Retry-After and an OpenAI error body; streaming ones do not count; room frees as they start", async () => {
    const ac = new AbortController();
    await Promise.all([open(ac), open(ac)]); // streaming: not waiting
    holdFirst = true;
    const pending = [open(ac), open(ac), open(ac)];
    await until("3 waiting for their first token", async () => (await gauges()).waiting === 3);
    const r = await fetch(`${gw.url}/v1/completions`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({ model: MODEL, prompt: "x", max_tokens: 5 }),
    });
    expect(r.status).toBe(429);
    expect(r.headers.get("retry-after")).toBe("1");
    expect(((await r.json()) as any).error).toMatchObject({ code: "server_overloaded", type: "invalid_request_error", param: null });
    expect(await (await fetch(`${gw.url}/metrics`)).text()).toMatch(/^airm_gateway_requests_total\{route="\/v1\/completions",status="429"\} 1$/m);
    holdFirst = false;
    ac.abort();
    await Promise.all(pending);
    await until("the queue empty", async () => (await gauges()).waiting === 0);
    const ac2 = new AbortController();
    const again = await open(ac2);
    expect(again?.status).toBe(200);
    ac2.abort();
  });
});
