// Starts a whole endpoint picker in this process: the endpoint source, the metrics scraper, the
// picker, the ext_proc gRPC server (with the gRPC health service on the same port), the
// optional health-only gRPC port (GIE serves health on 9003) and the metrics HTTP port. The
// CLI (epp-cli.ts), the tests and the bench all start it through startEpp().

import { Server, ServerCredentials, type ServerDuplexStream } from "@grpc/grpc-js";
import type { TlsMaterial } from "@airm/rm-core";
import type { EndpointSource } from "@airm/routing";
import { hostPortOf } from "@airm/routing";
import { EppMetrics, startMetricsServer, type MetricsServer } from "./epp-metrics.ts";
import type { ProcessingResponse } from "./ext-proc-messages.ts";
import { serveProcessStream, type ProcessingRequest } from "./ext-proc-stream.ts";
import { HealthService } from "./health-service.ts";
import { silentLog, type Log } from "./log.ts";
import { isFresh, MetricsScraper } from "./metrics-scraper.ts";
import { Picker, type PickerOptions } from "./picker.ts";
import { PrefixEvents } from "./prefix-events.ts";
import { protos } from "./protos.ts";
import { PickingRouter, type FailureMode } from "./request-router.ts";

export interface EppOptions {
  source: EndpointSource;
  /** Address the gRPC and metrics ports bind (default 127.0.0.1). */
  host?: string;
  /** ext_proc (and health) gRPC port; 0 picks a free one (default 9002). */
  grpcPort?: number;
  /** Health-only gRPC port; 0 picks a free one, null serves none (default null). */
  healthPort?: number | null;
  /** Metrics HTTP port; 0 picks a free one, null serves none (default null). */
  metricsPort?: number | null;
  /** /metrics scrape period of every endpoint, ms (default 50). */
  scrapeIntervalMs?: number;
  /** Endpoints whose last good scrape is older are skipped, ms (default 2000). */
  staleAfterMs?: number;
  /** What happens when the picker itself fails (default FailClose: 500). */
  failureMode?: FailureMode;
  /** Request bodies above this are refused with 413 (default 16 MiB). */
  maxBodyBytes?: number;
  /** Scoring knobs (weights, saturation limits, prefix index, routing). */
  picker?: Omit<PickerOptions, "staleAfterMs">;
  /** With routing prefix: where the endpoints' KV events are when an endpoint names none (default 5557, replay 5558). */
  kvEvents?: { port: number; replayPort: number };
  /**
   * AIRM_TLS_DIR's material: the endpoints' /metrics are scraped over mutual TLS (plain HTTP for an
   * endpoint that answers in plain HTTP), and the ext_proc port serves TLS with this certificate
   * (client certificates are not asked: Envoy and the gateways of llm-d connect without one). The
   * health-only port stays plain (kubelet gRPC probes). Default: none, all plain.
   */
  tls?: TlsMaterial;
  log?: Log;
}

export interface Epp {
  /** "host:port" of the ext_proc gRPC server. */
  readonly address: string;
  readonly grpcPort: number;
  readonly healthPort: number | null;
  /** The ext_proc port serves TLS and scrapes present a certificate (AIRM_TLS_DIR). */
  readonly tls: boolean;
  readonly metricsPort: number | null;
  readonly picker: Picker;
  readonly scraper: MetricsScraper;
  readonly metrics: EppMetrics;
  readonly health: HealthService;
  /** The KV events' index and tokenizer calls (routing prefix), else null. */
  readonly events: PrefixEvents | null;
  close(): Promise<void>;
}

/** grpc-js options: channelz bookkeeping off (it costs per stream and nothing reads it). */
const SERVER_OPTIONS = { "grpc.enable_channelz": 0 };

/**
 * The ext_proc port's TLS (Envoy need not present a certificate): grpc-js's own SSL credentials,
 * whose secure context follows the TLS files' reloads (AIRM_TLS_RELOAD_S) as grpc-js lets
 * credentials do (its bound servers watch them).
 */
class ReloadingCredentials extends ServerCredentials {
  constructor(tls: TlsMaterial) {
    super({ requestCert: false }, { ca: tls.ca, cert: tls.cert, key: tls.key });
    tls.onReload(() => this.updateSecureContextOptions({ ca: tls.ca, cert: tls.cert, key: tls.key }));
  }

  _equals(other: ServerCredentials): boolean {
    return other === this;
  }
}

function bind(server: Server, host: string, port: number, tls?: TlsMaterial): Promise<number> {
  const addr = host.includes(":") ? `[${host}]:${port}` : `${host}:${port}`;
  const credentials = tls ? new ReloadingCredentials(tls) : ServerCredentials.createInsecure();
  return new Promise((resolve, reject) => server.bindAsync(addr, credentials, (err, p) => (err ? reject(err) : resolve(p))));
}

function shutdown(server: Server): Promise<void> {
  return new Promise((resolve) => {
    const force = setTimeout(() => server.forceShutdown(), 1000);
    server.tryShutdown(() => {
      clearTimeout(force);
      resolve();
    });
  });
}

/** Starts a picker; resolves once its endpoint source has loaded and every port listens. Throws when the source cannot load or a port cannot be bound. */
export async function startEpp(o: EppOptions): Promise<Epp> {
  const log = o.log ?? silentLog;
  const host = o.host ?? "127.0.0.1";
  const staleAfterMs = o.staleAfterMs ?? 2000;
  let metrics!: EppMetrics;
  const scraper = new MetricsScraper({
    intervalMs: o.scrapeIntervalMs ?? 50,
    onScrape: (s) => s.error && metrics.scrapeErrors.inc({ endpoint: s.key }),
    tls: o.tls,
    onPlain: (s) => log.info({ endpoint: s.key }, "endpoint answers /metrics in plain HTTP; scraped without TLS"),
  });
  metrics = new EppMetrics(() => scraper.states(), staleAfterMs);
  const picker = new Picker(scraper, { ...o.picker, staleAfterMs });
  const events = picker.routing === "prefix" ? new PrefixEvents({ kvEventsPort: o.kvEvents?.port ?? 5557, kvReplayPort: o.kvEvents?.replayPort ?? 5558, log }) : null;
  const router = new PickingRouter({ picker, failureMode: o.failureMode ?? "FailClose", metrics, log, ...(events ? { events } : {}) });
  if (events) metrics.exportEvents(events);
  // The events follow the endpoints as they come and go, and as their worker processes change (the scrapes say).
  const follow = events ? setInterval(() => events.sync(scraper.states()), 250) : undefined;
  follow?.unref();
  const health = new HealthService();
  const { extProc, health: healthProto } = protos();

  await o.source.start();
  scraper.setEndpoints(o.source.endpoints());
  const unsubscribe = o.source.onChange((eps) => scraper.setEndpoints(eps));
  scraper.start();

  const streamOptions = {
    maxBodyBytes: o.maxBodyBytes ?? 16 * 1024 * 1024,
    log,
    onRefused: (status: number, code: string) => metrics.immediate.inc({ status: String(status), code }),
  };
  const grpc = new Server(SERVER_OPTIONS);
  grpc.addService(extProc.service, { Process: (call: ServerDuplexStream<ProcessingRequest, ProcessingResponse>) => serveProcessStream(call, router, streamOptions) });
  grpc.addService(healthProto.service, health.implementation());
  const servers: Server[] = [grpc];
  let metricsServer: MetricsServer | undefined;
  try {
    const grpcPort = await bind(grpc, host, o.grpcPort ?? 9002, o.tls);
    const tls = o.tls;
    if (tls) tls.onReload(() => log.info({ dir: tls.dir, generation: tls.generation }, "TLS certificates reloaded"));
    let healthPort: number | null = null;
    if (o.healthPort !== undefined && o.healthPort !== null) {
      const hs = new Server(SERVER_OPTIONS);
      hs.addService(healthProto.service, health.implementation());
      servers.push(hs);
      healthPort = await bind(hs, host, o.healthPort);
    }
    const healthJson = () => {
      const states = scraper.states();
      const now = performance.now();
      return {
        status: "ok",
        endpoints: states.length,
        ready: states.filter((s) => isFresh(s, now, staleAfterMs)).map((s) => ({ endpoint: s.key, name: s.endpoint.name, role: s.endpoint.role })),
      };
    };
    if (o.metricsPort !== undefined && o.metricsPort !== null) metricsServer = await startMetricsServer(metrics, healthJson, host, o.metricsPort);
    health.setServing(true);
    log.info(
      { grpc: hostPortOf({ address: host, port: grpcPort }), tls: Boolean(o.tls), healthPort, metricsPort: metricsServer?.port ?? null, endpoints: scraper.states().length },
      "endpoint picker started",
    );
    return {
      address: hostPortOf({ address: host, port: grpcPort }),
      grpcPort,
      healthPort,
      tls: Boolean(o.tls),
      metricsPort: metricsServer?.port ?? null,
      picker,
      scraper,
      metrics,
      health,
      events,
      async close() {
        clearInterval(follow);
        events?.close();
        health.setServing(false);
        health.endWatches();
        unsubscribe();
        o.source.stop();
        scraper.stop();
        await Promise.all([...servers.map(shutdown), metricsServer?.close()]);
      },
    };
  } catch (e) {
    clearInterval(follow);
    events?.close();
    unsubscribe();
    o.source.stop();
    scraper.stop();
    for (const s of servers) s.forceShutdown();
    await metricsServer?.close();
    throw e;
  }
}
