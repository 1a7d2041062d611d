import { describe, expect, test } from "vitest";
import type { PartSample, RawSample } from "./collect.ts";
import { parseMetrics } from "./prom-text.ts";
import { buildSnapshot, Watch } from "./snapshot.ts";
import type { Target } from "./targets.ts";

const target = (name: string, kind: Target["kind"], role: string, restarts: number | null = null): Target => ({
  name,
  kind,
  role,
  url: `http://127.0.0.1/${name}`,
  drainUrl: kind === "worker" ? `http://127.0.0.1/${name}` : null,
  logs: null,
  restarts,
});

/** A decode worker's page: pulled KV bytes, decode steps (count) of `streams` streams in all (each a generated token), prefix lookups. */
function decodePage(o: { pulled: number; steps: number; streams: number; queried: number; hits: number; start?: number; draining?: number }): string {
  return [
    `airm_kv_pulled_bytes_total ${o.pulled}`,
    'airm_worker_decode_batch_size_bucket{le="1"} 0',
    `airm_worker_decode_batch_size_bucket{le="+Inf"} ${o.steps}`,
    `airm_worker_decode_batch_size_sum ${o.streams}`,
    `airm_worker_decode_batch_size_count ${o.steps}`,
    `vllm:generation_tokens_total ${o.streams}`,
    `vllm:prefix_cache_queries_total ${o.queried}`,
    `vllm:prefix_cache_hits_total ${o.hits}`,
    `vllm:num_preemptions_total 2`,
    `process_start_time_seconds ${o.start ?? 1000}`,
    `airm_draining ${o.draining ?? 0}`,
  ].join("\n");
}

/** A gateway's page: requests by status and TTFT observations in buckets 0.1 / 1 / +Inf. */
function gatewayPage(o: { ok: number; limited: number; ttft: [number, number, number]; migrations: number }): string {
  return [
    `airm_gateway_requests_total{route="/v1/completions",status="200"} ${o.ok}`,
    `airm_gateway_requests_total{route="/v1/completions",status="429"} ${o.limited}`,
    `airm_ttft_seconds_bucket{le="0.1"} ${o.ttft[0]}`,
    `airm_ttft_seconds_bucket{le="1"} ${o.ttft[1]}`,
    `airm_ttft_seconds_bucket{le="+Inf"} ${o.ttft[2]}`,
    `airm_ttft_seconds_count ${o.ttft[2]}`,
    `airm_migrations_total{role="decode",reason="worker_draining"} ${o.migrations}`,
  ].join("\n");
}

const workerHealth = (running: number, status = "ok") => ({
  status: 200,
  body: {
    status,
    role: "decode",
    engine: "atom",
    backend: "atom",
    device: { vendor: "cpu", path: "cpu-reference" },
    transport: "tcp",
    kvCache: { usedBlocks: 3, totalBlocks: 100 },
    requests: { running, waiting: 1 },
  },
});

function reading(at: number, decode: string, gateway: string, running = 2): RawSample {
  const parts: PartSample[] = [
    {
      target: target("gateway", "gateway", "gateway"),
      health: {
        status: 200,
        body: { status: "ok", open_requests: 5, roles: [{ role: "decode", endpoints: [{ url: "http://127.0.0.1/decode", healthy: true, circuit: "half-open" }] }] },
      },
      metrics: parseMetrics(gateway),
      error: null,
    },
    { target: target("decode", "worker", "decode"), health: workerHealth(running), metrics: parseMetrics(decode), error: null },
    { target: target("kv-relay", "relay", "relay"), health: null, metrics: null, error: "/health: ECONNREFUSED" },
  ];
  return { at, parts, notes: [] };
}

describe("a snapshot of two readings", () => {
  const first = reading(10_000, decodePage({ pulled: 1000, steps: 10, streams: 20, queried: 100, hits: 50 }), gatewayPage({ ok: 10, limited: 1, ttft: [4, 8, 10], migrations: 1 }));
  const second = reading(
    12_000,
    decodePage({ pulled: 5000, steps: 14, streams: 32, queried: 300, hits: 200 }),
    gatewayPage({ ok: 16, limited: 3, ttft: [4, 14, 16], migrations: 2 }),
  );
  const snap = buildSnapshot("test", second, first, first, () => null);

  test("a worker's rates come from its counters' gains over the interval", () => {
    const d = snap.parts.find((p) => p.name === "decode")!;
    expect(snap.intervalS).toBe(2);
    expect(d.kvInBytesPerS).toBe((5000 - 1000) / 2);
    expect(d.kvOutBytesPerS).toBeNull(); // it exports no pushed-bytes counter
    expect(d.decodeBatch).toBe((32 - 20) / (14 - 10));
    expect(d.prefixHit).toBe((200 - 50) / (300 - 100));
  });

  test("a worker's state and load come from its /health; the gateway's breaker from the gateway's", () => {
    const d = snap.parts.find((p) => p.name === "decode")!;
    expect(d).toMatchObject({
      state: "ok",
      running: 2,
      waiting: 1,
      kvUsedBlocks: 3,
      kvTotalBlocks: 100,
      engine: "atom",
      device: "cpu:cpu-reference",
      transport: "tcp",
      circuit: "half-open",
    });
    expect(snap.parts.find((p) => p.name === "gateway")!.running).toBe(5);
  });

  test("the cluster's figures: requests by status since start, rates over the interval, quantiles over the window", () => {
    const c = snap.cluster;
    expect(c.requests).toEqual({ "200": 16, "429": 3 });
    expect(c.rateLimited).toBe(3);
    expect(c.requestsPerS).toBe((16 + 3 - 11) / 2);
    expect(c.outputTokPerS).toBe((32 - 20) / 2);
    expect(c.migrations).toBe(2);
    expect(c.preemptions).toBe(2);
    // the window saw 6 observations, all in (0.1, 1]: the median is halfway through it
    expect(c.ttftS.count).toBe(6);
    expect(c.ttftS.p50).toBeCloseTo(0.1 + 0.9 * 0.5, 12);
    expect(c.windowS).toBe(2);
  });

  test("without a window start the quantiles cover everything the gateway observed", () => {
    const all = buildSnapshot("test", second, first, null, () => null);
    expect(all.cluster.windowS).toBeNull();
    expect(all.cluster.ttftS.count).toBe(16);
    expect(all.cluster.ttftS.p50).toBeCloseTo(0.1 + 0.9 * ((8 - 4) / 10), 12);
  });

  test("a part that does not answer is kept, marked, and named with why", () => {
    const r = snap.parts.find((p) => p.name === "kv-relay")!;
    expect(r.state).toBe("unreachable");
    expect(snap.unreachable).toEqual([{ name: "kv-relay", error: "/health: ECONNREFUSED" }]);
  });

  test("a worker whose metrics say airm_draining 1 is draining", () => {
    const draining = reading(
      14_000,
      decodePage({ pulled: 5000, steps: 14, streams: 32, queried: 300, hits: 200, draining: 1 }),
      gatewayPage({ ok: 16, limited: 3, ttft: [4, 14, 16], migrations: 2 }),
    );
    draining.parts[1].health = workerHealth(0, "draining");
    const d = buildSnapshot("test", draining, second, null, () => null).parts.find((p) => p.name === "decode")!;
    expect([d.state, d.draining, d.decodeBatch]).toEqual(["draining", true, 0]);
  });
});

describe("watching a cluster", () => {
  test("a counter that went down (a restarted part) counts from zero, and the restart is counted", () => {
    const w = new Watch("test");
    w.add(reading(0, decodePage({ pulled: 9000, steps: 50, streams: 80, queried: 0, hits: 0, start: 1000 }), gatewayPage({ ok: 1, limited: 0, ttft: [1, 1, 1], migrations: 0 })));
    const s = w.add(
      reading(1000, decodePage({ pulled: 300, steps: 2, streams: 2, queried: 0, hits: 0, start: 2000 }), gatewayPage({ ok: 2, limited: 0, ttft: [2, 2, 2], migrations: 0 })),
    );
    const d = s.parts.find((p) => p.name === "decode")!;
    expect(d.kvInBytesPerS).toBe(300);
    expect(d.restarts).toBe(1);
    expect(s.parts.find((p) => p.name === "gateway")!.restarts).toBeNull(); // no process_start_time_seconds, no launcher count
    expect(w.trend.outputTokPerS).toEqual([0, 2]);
  });

  test("the launcher's restart count wins over the ones seen", () => {
    const w = new Watch("test");
    const r = reading(0, decodePage({ pulled: 0, steps: 0, streams: 0, queried: 0, hits: 0 }), gatewayPage({ ok: 0, limited: 0, ttft: [0, 0, 0], migrations: 0 }));
    r.parts[1].target.restarts = 3;
    expect(w.add(r).parts.find((p) => p.name === "decode")!.restarts).toBe(3);
  });

  test("the quantiles' window is the last minute once there is a minute of readings", () => {
    const w = new Watch("test");
    const page = (ok: number) => gatewayPage({ ok, limited: 0, ttft: [ok, ok, ok], migrations: 0 });
    const dec = decodePage({ pulled: 0, steps: 0, streams: 0, queried: 0, hits: 0 });
    let s = w.add(reading(0, dec, page(0)));
    for (let t = 10_000; t <= 90_000; t += 10_000) s = w.add(reading(t, dec, page(t / 1000)));
    expect(s.cluster.windowS).toBe(60);
    expect(s.cluster.ttftS.count).toBe(60);
  });
});
