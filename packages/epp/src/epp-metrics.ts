// The picker's own Prometheus metrics (prom-client, one registry per picker) and the small HTTP
// server on --metrics-port that serves GET /metrics and GET /health. Reads the scraper's states
// at scrape time; changes nothing.

import { createServer, type Server } from "node:http";
import type { AddressInfo } from "node:net";
import type { PrefixEvents } from "./prefix-events.ts";
import { Counter, Gauge, Histogram, Registry, collectDefaultMetrics } from "prom-client";
import { ROLES } from "@airm/routing";
import { isFresh, type EndpointState } from "./metrics-scraper.ts";

/** Decision latency buckets, in ms: most decisions take tens of microseconds. */
const DECISION_BUCKETS_MS = [0.025, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 25, 50];

export class EppMetrics {
  readonly registry = new Registry();
  readonly picks: Counter<"reason" | "role">;
  readonly paths: Counter<"path" | "reason">;
  readonly decisionMs: Histogram;
  readonly immediate: Counter<"status" | "code">;
  readonly scrapeErrors: Counter<"endpoint">;

  /** `states()` is read at every scrape; `staleAfterMs` decides which endpoints count as ready. */
  constructor(states: () => EndpointState[], staleAfterMs: number) {
    const registers = [this.registry];
    // The process's own figures (process_start_time_seconds shows a restart), as every part exports them.
    collectDefaultMetrics({ register: this.registry });
    this.picks = new Counter({ name: "airm_epp_picks_total", help: "Endpoints picked, by reason and by the picked endpoint's role", labelNames: ["reason", "role"], registers });
    this.paths = new Counter({
      name: "airm_epp_disaggregation_picks_total",
      help: "Requests to a decode-only endpoint with prefill endpoints available, by path (pd: a prefill endpoint named; local: the decode endpoint prefills) and reason (kv_faster, local_faster, explore_kv, explore_local: the measured decision; prompt_length: the threshold rule; forced: always, or no local path)",
      labelNames: ["path", "reason"],
      registers,
    });
    this.decisionMs = new Histogram({
      name: "airm_epp_decision_duration_ms",
      help: "Time from a request's complete body to its destination (parse and pick), in ms",
      buckets: DECISION_BUCKETS_MS,
      registers,
    });
    this.immediate = new Counter({
      name: "airm_epp_immediate_responses_total",
      help: "Requests refused with an immediate response, by HTTP status and error code",
      labelNames: ["status", "code"],
      registers,
    });
    this.scrapeErrors = new Counter({ name: "airm_epp_scrape_errors_total", help: "Failed /metrics scrapes of model servers", labelNames: ["endpoint"], registers });
    new Gauge({
      name: "airm_epp_endpoint_metrics_age_seconds",
      help: "Age of each endpoint's last good /metrics scrape (+Inf before the first)",
      labelNames: ["endpoint", "name", "role"],
      registers,
      collect() {
        this.reset();
        const now = performance.now();
        for (const s of states()) this.set({ endpoint: s.key, name: s.endpoint.name, role: s.endpoint.role }, s.load ? (now - s.scrapedAt) / 1000 : Number.POSITIVE_INFINITY);
      },
    });
    const byRole = (name: string, help: string, keep: (s: EndpointState, now: number) => boolean) =>
      new Gauge({
        name,
        help,
        labelNames: ["role"],
        registers,
        collect() {
          const now = performance.now();
          const all = states();
          for (const role of ROLES) this.set({ role }, all.filter((s) => s.endpoint.role === role && keep(s, now)).length);
        },
      });
    byRole("airm_epp_endpoints", "Endpoints in the pool, by role", () => true);
    byRole("airm_epp_endpoints_ready", "Endpoints with fresh metrics (scraped without error within the stale limit), by role", (s, now) => isFresh(s, now, staleAfterMs));
  }

  /** Precise prefix routing's index (--routing prefix): its blocks per endpoint, the KV events behind it, the prompts tokenized. */
  exportEvents(events: PrefixEvents): void {
    const registers = [this.registry];
    new Gauge({
      name: "airm_epp_index_blocks",
      help: "KV blocks the prefix index holds per endpoint, from its KV events",
      labelNames: ["endpoint"],
      registers,
      collect() {
        this.reset();
        for (const w of events.index.workers()) this.set({ endpoint: w }, events.index.blocksOf(w));
      },
    });
    const read = (name: string, help: string, value: () => number) =>
      new Gauge({
        name,
        help: `${help} (a counter, read from the index)`,
        registers,
        collect() {
          this.set(value());
        },
      });
    read("airm_epp_kv_events_total", "KV events applied to the index", () => events.eventCounts().events);
    read("airm_epp_kv_event_replays_total", "replays asked of the endpoints' replay sockets (start, gap, restart)", () => events.eventCounts().replays);
    read("airm_epp_kv_event_batches_missed_total", "event batches lost and not replayed", () => events.eventCounts().missed);
    read("airm_epp_prefix_lookups_total", "prompts tokenized for a precise prefix pick", () => events.counts.lookups);
    read("airm_epp_tokenize_failures_total", "tokenizer calls that failed (those requests were routed by load)", () => events.counts.tokenizeFailures);
  }
}

export interface MetricsServer {
  port: number;
  close(): Promise<void>;
}

/** Serves GET /metrics (Prometheus text) and GET /health (JSON from `health()`) on host:port (0 picks a port). */
export async function startMetricsServer(metrics: EppMetrics, health: () => unknown, host: string, port: number): Promise<MetricsServer> {
  const server: Server = createServer((req, res) => {
    const path = (req.url ?? "/").split("?")[0];
    if (req.method === "GET" && path === "/metrics") {
      metrics.registry.metrics().then(
        (text) => res.writeHead(200, { "content-type": metrics.registry.contentType }).end(text),
        (e: Error) => res.writeHead(500, { "content-type": "text/plain" }).end(e.message),
      );
    } else if (req.method === "GET" && path === "/health") {
      res.writeHead(200, { "content-type": "application/json" }).end(JSON.stringify(health()));
    } else res.writeHead(404, { "content-type": "text/plain" }).end("not found: GET /metrics or GET /health\n");
  });
  await new Promise<void>((resolve, reject) => {
    server.once("error", reject);
    server.listen(port, host, () => resolve());
  });
  return {
    port: (server.address() as AddressInfo).port,
    close: () =>
      new Promise<void>((resolve) => {
        server.close(() => resolve());
        server.closeAllConnections();
      }),
  };
}
