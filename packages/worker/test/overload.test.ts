// A worker's bounded waiting queue over real HTTP: with AIRM_MAX_WAITING=1 a decode worker holds
// one request waiting for its KV and answers the next one at once with 429, Retry-After and an
// OpenAI error body (the contract's client turns it into an OverloadedError); once the waiting
// one ends, the worker takes requests again. Real shm transport, real engine on a tiny model.
import { rmSync } from "node:fs";
import { ErrorBodySchema, OverloadedError, WorkerClient } from "@airm/internal-api";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { RunningWorker } from "../src/index.ts";
import { tinyWorker } from "./tiny-worker.ts";

const shmRoot = `/dev/shm/airm-worker-overload-${process.pid}`;
let w: RunningWorker;

beforeAll(async () => {
  w = await tinyWorker({ role: "decode", backend: "atom", kvTransport: "shm", seed: 4, env: { PD_SHM_ROOT: shmRoot, AIRM_MAX_WAITING: "1" } });
}, 60_000);
afterAll(async () => {
  await w?.close();
  rmSync(shmRoot, { recursive: true, force: true });
});

describe("a worker with AIRM_MAX_WAITING=1", () => {
  it("answers 429 with Retry-After past its bound at once, and takes requests again when the queue drains", async () => {
    const client = new WorkerClient(w.url, "decode worker");
    const held = new AbortController();
    // Waits for KV that never comes: one request in the queue.
    const first = client.decode({ requestId: "cmpl-wait-1", maxTokens: 2, kvTimeoutMs: 60_000 }, { signal: held.signal });
    first.catch(() => {});
    await first; // accepted: its stream is open and it waits
    for (let i = 0; i < 100 && w.runtime.kvWaiting === 0; i++) await new Promise((res) => setTimeout(res, 20));
    expect(w.runtime.kvWaiting).toBe(1);

    const t0 = performance.now();
    const r = await fetch(`${w.url}/internal/decode`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({ requestId: "cmpl-wait-2", maxTokens: 2 }),
    });
    expect(performance.now() - t0).toBeLessThan(5000); // refused, not queued (a bound on a hang, not a benchmark)
    expect(r.status).toBe(429);
    expect(r.headers.get("retry-after")).toBe("1");
    expect(ErrorBodySchema.parse(await r.json()).error.code).toBe("server_overloaded");
    const err = await client.decode({ requestId: "cmpl-wait-3", maxTokens: 2 }).catch((e) => e);
    expect(err).toBeInstanceOf(OverloadedError);
    expect(err.retryAfterS).toBe(1);

    // the waiting one ends (its caller leaves): room again, and nothing is left held
    await client.release({ requestId: "cmpl-wait-1", reason: "client_gone" });
    held.abort();
    for (let i = 0; i < 100 && w.runtime.kvWaiting > 0; i++) await new Promise((res) => setTimeout(res, 20));
    expect(w.runtime.kvWaiting).toBe(0);
    expect(w.runtime.leases.counters().outstanding).toBe(0);
    const again = await client.decode({ requestId: "cmpl-wait-4", maxTokens: 2, kvTimeoutMs: 200 });
    const events = [];
    for await (const ev of again.events(10_000)) events.push(ev);
    expect(events.at(-1)).toMatchObject({ type: "error", code: "kv_timeout" }); // accepted (and its KV never came)
    const m = await (await fetch(`${w.url}/metrics`)).text();
    expect(m).toMatch(/^airm_worker_requests_total\{[^}]*route="decode"[^}]*outcome="overloaded"[^}]*\} 2$/m);
  });
});
