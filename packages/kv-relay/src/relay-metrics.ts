// The relay's Prometheus metrics (prom-client, one registry per relay) and the small HTTP server
// that serves /metrics and /health. Reads the relay's counters; changes nothing in it.

import type { AddressInfo } from "node:net";
import { serve, type ServerType } from "@hono/node-server";
import { Hono } from "hono";
import { Counter, Gauge, Registry, collectDefaultMetrics } from "prom-client";

/** What the relay holds and has done, as the metrics report it. */
export interface RelayStats {
  blobs: number;
  /** Blob bytes stored (the sum of blob sizes). */
  bytesHeld: number;
  /** Pool bytes handed out (size classes, including pushes in progress and blobs still being sent). */
  poolHeldBytes: number;
  poolIdleBytes: number;
  maxBytes: number;
  expired: number;
  crcFailures: number;
  connections: number;
  framesRejected: number;
  slotsReused: number;
  slotsAllocated: number;
}

interface StatsSource {
  stats(): RelayStats;
  readonly bytesIn: number;
  readonly bytesOut: number;
  readonly latePushes: number;
  readonly address: string;
}

export class RelayMetrics {
  readonly registry = new Registry();
  readonly expired: Counter<"read">;
  readonly framesRejected: Counter<"reason">;

  constructor(source: StatsSource) {
    const r = [this.registry];
    // The process's own figures (process_start_time_seconds shows a restart), as every part exports them.
    collectDefaultMetrics({ register: this.registry });
    const gauge = (name: string, help: string, read: (s: RelayStats) => number) =>
      new Gauge({
        name,
        help,
        registers: r,
        collect() {
          this.set(read(source.stats()));
        },
      });
    gauge("airm_kv_relay_bytes_held", "Blob bytes stored in the relay", (s) => s.bytesHeld);
    gauge("airm_kv_relay_blobs", "Blobs stored in the relay", (s) => s.blobs);
    gauge("airm_kv_relay_pool_bytes", "Buffer bytes handed out (size classes, incl. pushes and sends in progress)", (s) => s.poolHeldBytes);
    gauge("airm_kv_relay_pool_idle_bytes", "Pre-touched buffer bytes kept for reuse", (s) => s.poolIdleBytes);
    gauge("airm_kv_relay_max_bytes", "The relay's byte cap (AIRM_KV_TCP_MAX_MB)", (s) => s.maxBytes);
    gauge("airm_kv_relay_connections", "Open client connections", (s) => s.connections);
    // Totals kept as plain numbers on the hot path, exposed as counters when scraped.
    const total = (name: string, help: string, read: () => number) =>
      new Counter({
        name,
        help,
        registers: r,
        collect() {
          this.reset();
          this.inc(read());
        },
      });
    total("airm_kv_relay_crc_failures_total", "Pushes refused because their CRC-32 did not match", () => source.stats().crcFailures);
    total("airm_kv_relay_received_bytes_total", "Bytes read from clients", () => source.bytesIn);
    total("airm_kv_relay_late_pushes_total", "Pushes dropped because their request was released before they completed", () => source.latePushes);
    total("airm_kv_relay_sent_bytes_total", "Blob bytes sent to pullers", () => source.bytesOut);
    this.expired = new Counter({ name: "airm_kv_relay_expired_total", help: "Blobs dropped by the TTL, by whether they had been read", labelNames: ["read"], registers: r });
    this.framesRejected = new Counter({
      name: "airm_kv_relay_frames_rejected_total",
      help: "Connections closed for a malformed frame, a caller without the relay's token (unauthenticated, bad_token) or a refused TLS handshake (tls_handshake), by reason",
      labelNames: ["reason"],
      registers: r,
    });
  }
}

export interface MetricsServer {
  port: number;
  close(): Promise<void>;
}

/** Serves GET /metrics (Prometheus text) and GET /health (JSON) on host:port (0 picks a port). */
export async function startMetricsServer(relay: StatsSource & { metricsText(): Promise<string> }, host: string, port: number): Promise<MetricsServer> {
  const app = new Hono();
  app.get("/health", (c) => {
    const s = relay.stats();
    return c.json({ status: "ok", address: relay.address, blobs: s.blobs, bytes_held: s.bytesHeld, max_bytes: s.maxBytes, connections: s.connections });
  });
  app.get("/metrics", async (c) => c.text(await relay.metricsText(), 200, { "content-type": "text/plain; version=0.0.4; charset=utf-8" }));
  let server!: ServerType;
  const info = await new Promise<AddressInfo>((resolve, reject) => {
    server = serve({ fetch: app.fetch, hostname: host, port }, resolve);
    server.once("error", reject);
  });
  return {
    port: info.port,
    close: () => new Promise<void>((resolve) => server.close(() => resolve())),
  };
}
