// The gateway's airm_* figures over the most recent 512 requests, exposed with prom-client:
// airm_ttft_p90_ms, airm_tpot_p90_ms, airm_tok_s and airm_kv_transfer_ms{kv_transport}
// (median per-request kv push + load); every request's TTFT and TPOT as histograms
// (airm_ttft_seconds, airm_tpot_seconds: a Prometheus computes any quantile and the SLO share
// from them), the migrations of streams between workers (airm_migrations_total{role,reason},
// airm_migration_seconds), each worker endpoint's health and circuit-breaker state, and the
// process's own figures (process_start_time_seconds, ...). Knows nothing about how requests are
// served.

import type { WorkerEstimates } from "@airm/internal-api";
import { DRAINING_GAUGE, ESTIMATE_GAUGES } from "@airm/rm-core";
import { Counter, Gauge, Histogram, Registry, collectDefaultMetrics } from "prom-client";

export interface RequestRecord {
  startMs: number;
  endMs: number;
  ttftMs: number;
  /** Mean time per output token after the first (null with fewer than 2 tokens). */
  tpotMs: number | null;
  completionTokens: number;
  kvTransferMs: number | null;
  transport: string | null;
}

export const WINDOW = 512;

/** TTFT and TPOT histogram buckets (s): fine around the seed's SLO (p99 TPOT 150 ms), up to a minute. */
export const LATENCY_BUCKETS = [0.005, 0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.125, 0.15, 0.2, 0.3, 0.5, 0.75, 1, 2, 5, 10, 30, 60];

/** A worker endpoint as the gauges see it (the gateway's pools). */
export interface EndpointView {
  role: string;
  url: string;
  healthy: boolean;
  circuit: "closed" | "half-open" | "open";
}

/** Circuit-breaker states, as the airm_endpoint_circuit_state label says them. */
export const CIRCUIT_STATES = ["closed", "half_open", "open"] as const;

/** The q-quantile (0-1) of `xs` by nearest rank; NaN when empty. */
export function quantile(xs: number[], q: number): number {
  if (xs.length === 0) return Number.NaN;
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.min(s.length - 1, Math.max(0, Math.ceil(q * s.length) - 1))];
}

export class GatewayMetrics {
  readonly registry = new Registry();
  private readonly window: RequestRecord[] = [];
  private readonly requests: Counter<"route" | "status">;
  /** Streams moved to another worker, by the role of the worker that failed them and why. */
  readonly migrations: Counter<"role" | "reason">;
  /** From a stream's break to its next token from the worker that took it over. */
  readonly migrationSeconds: Histogram;
  /** PD requests by path (pd: the KV shipped, local: the decode worker prefilled) and why. */
  readonly paths: Counter<"path" | "reason">;
  private readonly ttft: Histogram;
  private readonly tpot: Histogram;

  /**
   * Re-exports a decode worker's disaggregation estimates under the workers' own gauge names: in
   * llm-d's topology an endpoint picker scrapes the decode pod's serving port, which is this
   * gateway (NaN: nothing measured, or no decode worker reports them).
   */
  exportEstimates(read: () => WorkerEstimates | null, localPath: boolean): void {
    const r = [this.registry];
    const gauge = (name: string, help: string, value: (e: WorkerEstimates) => number | null) =>
      new Gauge({
        name,
        help,
        registers: r,
        collect() {
          const e = read();
          this.set((e && value(e)) ?? Number.NaN);
        },
      });
    gauge(ESTIMATE_GAUGES.kvBandwidth, "the decode worker's KV bandwidth (bytes/s while the bytes moved; EWMA), from its /health", (e) => e.kvBandwidth);
    gauge(ESTIMATE_GAUGES.kvBytes, "KV bytes per request the decode worker received (the prompt's blocks; EWMA), from its /health", (e) => e.kvBytes);
    gauge(ESTIMATE_GAUGES.kvBytesPerToken, "KV bytes per prompt token the decode worker received (EWMA), from its /health", (e) => e.kvBytesPerToken ?? null);
    gauge(ESTIMATE_GAUGES.prefillFixed, "the decode worker's own prefill time model: fixed part (s), from its /health", (e) => (e.prefill ? e.prefill.fixedMs / 1000 : null));
    gauge(ESTIMATE_GAUGES.prefillPerToken, "the decode worker's own prefill time model: s per token, from its /health", (e) => (e.prefill ? e.prefill.msPerToken / 1000 : null));
    gauge(ESTIMATE_GAUGES.localPrefill, "1 when this gateway and its decode worker run requests whole there (--local-prefill): both paths exist", (e) =>
      localPath && e.localPrefill ? 1 : 0,
    );
  }

  constructor() {
    const self = this;
    new Gauge({
      name: "airm_ttft_p90_ms",
      help: "p90 time to first token (ms) over the last 512 requests",
      registers: [this.registry],
      collect() {
        this.set(
          self.orZero(
            quantile(
              self.window.map((r) => r.ttftMs),
              0.9,
            ),
          ),
        );
      },
    });
    new Gauge({
      name: "airm_tpot_p90_ms",
      help: "p90 time per output token after the first (ms) over the last 512 requests",
      registers: [this.registry],
      collect() {
        this.set(
          self.orZero(
            quantile(
              self.window.flatMap((r) => (r.tpotMs === null ? [] : [r.tpotMs])),
              0.9,
            ),
          ),
        );
      },
    });
    new Gauge({
      name: "airm_tok_s",
      help: "output tokens per second over the wall-clock span of the last 512 requests",
      registers: [this.registry],
      collect() {
        this.set(self.tokensPerSecond());
      },
    });
    new Gauge({
      name: "airm_kv_transfer_ms",
      help: "median per-request KV push + load (ms) over the last 512 requests, by transport",
      labelNames: ["kv_transport"],
      registers: [this.registry],
      collect() {
        this.reset();
        const by = new Map<string, number[]>();
        for (const r of self.window) {
          if (r.kvTransferMs === null || r.transport === null) continue;
          by.set(r.transport, [...(by.get(r.transport) ?? []), r.kvTransferMs]);
        }
        for (const [t, xs] of by) this.set({ kv_transport: t }, quantile(xs, 0.5));
      },
    });
    this.paths = new Counter({
      name: "airm_disaggregation_picks_total",
      help: "PD requests by path (pd: KV shipped from a prefill worker; local: prefilled on the decode worker) and reason (kv_faster, local_faster, explore_kv, explore_local: the measured decision; header: an endpoint picker's placement or llm-d's sidecar rule; forced: --disaggregation always/never, or no local path)",
      labelNames: ["path", "reason"],
      registers: [this.registry],
    });
    this.migrations = new Counter({
      name: "airm_migrations_total",
      help: "streamed generations moved to another worker mid-stream, by the role of the worker that failed (decode, prefill, solo) and the reason (its error code, e.g. worker_stream_broken, worker_draining, kv_timeout)",
      labelNames: ["role", "reason"],
      registers: [this.registry],
    });
    this.migrationSeconds = new Histogram({
      name: "airm_migration_seconds",
      help: "time from a stream's break to its next token from the worker that took it over (the re-prefill of prompt + tokens sent, and the new worker's queue)",
      buckets: [0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30],
      registers: [this.registry],
    });
    this.ttft = new Histogram({
      name: "airm_ttft_seconds",
      help: "time to first token of each request answered whole (s), from the request's arrival",
      buckets: LATENCY_BUCKETS,
      registers: [this.registry],
    });
    this.tpot = new Histogram({
      name: "airm_tpot_seconds",
      help: "mean time per output token after the first of each request answered whole (s; requests of two or more tokens)",
      buckets: LATENCY_BUCKETS,
      registers: [this.registry],
    });
    collectDefaultMetrics({ register: this.registry });
    this.requests = new Counter({
      name: "airm_gateway_requests_total",
      help: "requests answered by the gateway, by route and HTTP status",
      labelNames: ["route", "status"],
      registers: [this.registry],
    });
  }

  private orZero(x: number): number {
    return Number.isNaN(x) ? 0 : x;
  }

  /** DRAINING_GAUGE: 1 once the gateway drains, so an endpoint picker that scrapes it stops picking it. */
  exportDraining(draining: () => boolean): void {
    new Gauge({
      name: DRAINING_GAUGE,
      help: "1 while this gateway drains (it takes no new request: 503 gateway_draining), else 0",
      registers: [this.registry],
      collect() {
        this.set(draining() ? 1 : 0);
      },
    });
  }

  /**
   * Exports each worker endpoint's state at every scrape: airm_endpoint_healthy{role,endpoint}
   * (its last probe) and airm_endpoint_circuit_state{role,endpoint,state} (1 for its breaker's
   * state, 0 for the others).
   */
  exportEndpoints(endpoints: () => EndpointView[]): void {
    new Gauge({
      name: "airm_endpoint_healthy",
      help: "1 when the worker endpoint answered its last health probe ready, else 0",
      labelNames: ["role", "endpoint"],
      registers: [this.registry],
      collect() {
        this.reset();
        for (const e of endpoints()) this.set({ role: e.role, endpoint: e.url }, e.healthy ? 1 : 0);
      },
    });
    new Gauge({
      name: "airm_endpoint_circuit_state",
      help: "the worker endpoint's circuit breaker: 1 for its state (closed, half_open, open), 0 for the others",
      labelNames: ["role", "endpoint", "state"],
      registers: [this.registry],
      collect() {
        this.reset();
        for (const e of endpoints()) for (const state of CIRCUIT_STATES) this.set({ role: e.role, endpoint: e.url, state }, e.circuit.replace("-", "_") === state ? 1 : 0);
      },
    });
  }

  /** Prefix-aware routing's index (AIRM_ROUTING=prefix): its size per worker, and the KV events and lookups behind it. */
  exportPrefixRouting(
    view: () => { blocks: { endpoint: string; blocks: number }[]; events: { batches: number; events: number; replays: number; missed: number }; lookups: number },
  ): void {
    new Gauge({
      name: "airm_router_index_blocks",
      help: "KV blocks the prefix-routing index holds per worker, from the workers' KV events",
      labelNames: ["endpoint"],
      registers: [this.registry],
      collect() {
        this.reset();
        for (const b of view().blocks) this.set({ endpoint: b.endpoint }, b.blocks);
      },
    });
    const counter = (name: string, help: string, read: (v: ReturnType<typeof view>) => number) =>
      new Gauge({
        name,
        help: `${help} (a counter, read from the router)`,
        registers: [this.registry],
        collect() {
          this.set(read(view()));
        },
      });
    counter("airm_router_kv_events_total", "KV events the gateway applied to its index", (v) => v.events.events);
    counter("airm_router_kv_event_replays_total", "replays asked of the workers' replay endpoints (start, gap, restart)", (v) => v.events.replays);
    counter("airm_router_kv_event_batches_missed_total", "event batches lost and not replayed", (v) => v.events.missed);
    counter("airm_router_prefix_lookups_total", "prompts hashed for a prefix-aware pick", (v) => v.lookups);
  }

  /** Adds one finished request to the window and the histograms. */
  record(r: RequestRecord): void {
    this.ttft.observe(r.ttftMs / 1000);
    if (r.tpotMs !== null) this.tpot.observe(r.tpotMs / 1000);
    this.window.push(r);
    if (this.window.length > WINDOW) this.window.shift();
  }

  countRequest(route: string, status: number): void {
    this.requests.inc({ route, status: String(status) });
  }

  tokensPerSecond(): number {
    if (this.window.length === 0) return 0;
    const start = Math.min(...this.window.map((r) => r.startMs));
    const end = Math.max(...this.window.map((r) => r.endMs));
    const tokens = this.window.reduce((a, r) => a + r.completionTokens, 0);
    return end > start ? (tokens * 1000) / (end - start) : 0;
  }

  snapshot(): RequestRecord[] {
    return [...this.window];
  }
}
