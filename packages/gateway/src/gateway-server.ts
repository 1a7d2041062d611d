// Starts a gateway: endpoint pools with health probes, the orchestrator, the OpenAI app on its
// port and, when asked, the airm_* metrics on a separate port. Used by the CLI and by tests.

import { serve } from "@hono/node-server";
import type { AddressInfo } from "node:net";
import type { Server } from "node:http";
import { ConfigError } from "@airm/rm-core";
import { EndpointPool } from "./endpoint-pool.ts";
import { Orchestrator } from "./pd-orchestrator.ts";
import { createGatewayApp } from "./gateway-app.ts";
import { GatewayMetrics } from "./gateway-metrics.ts";

export interface GatewayOptions {
  port: number;
  host?: string;
  prefill?: string[];
  decode?: string[];
  solo?: string[];
  /** Port for airm_* metrics (AIRM_METRICS_PORT); none when undefined. */
  metricsPort?: number;
  maxBodyBytes?: number;
  prefillTimeoutMs?: number;
  decodeIdleTimeoutMs?: number;
  kvTimeoutMs?: number;
  healthIntervalMs?: number;
}

export interface RunningGateway {
  url: string;
  port: number;
  metricsPort: number | null;
  metrics: GatewayMetrics;
  close(): Promise<void>;
}

function listen(fetchFn: (r: Request) => Response | Promise<Response>, port: number, host: string): Promise<Server> {
  return new Promise((resolve, reject) => {
    const server = serve({ fetch: fetchFn, port, hostname: host }) as Server;
    server.once("listening", () => resolve(server));
    server.once("error", reject);
  });
}

function closeServer(s: Server): Promise<void> {
  return new Promise((resolve) => {
    s.close(() => resolve());
    s.closeAllConnections?.();
  });
}

/**
 * Starts the gateway. Throws ConfigError when neither --solo nor both --prefill and --decode are
 * given, or both are.
 */
export async function startGateway(opts: GatewayOptions): Promise<RunningGateway> {
  const host = opts.host ?? "127.0.0.1";
  const solo = opts.solo?.length ? opts.solo : undefined;
  const pd = opts.prefill?.length || opts.decode?.length;
  if (solo && pd) throw new ConfigError("--solo", "give either --solo or --prefill with --decode, not both");
  if (!solo && !(opts.prefill?.length && opts.decode?.length)) {
    throw new ConfigError("--prefill/--decode", "give at least one --prefill URL and one --decode URL (or --solo URL)");
  }
  for (const u of [...(opts.prefill ?? []), ...(opts.decode ?? []), ...(opts.solo ?? [])]) {
    if (!/^https?:\/\/[^/]+/.test(u)) throw new ConfigError("worker URL", `${JSON.stringify(u)} is not an http(s) URL like http://127.0.0.1:8101`);
  }
  const pools = solo
    ? { solo: new EndpointPool("solo", solo) }
    : { prefill: new EndpointPool("prefill", opts.prefill!), decode: new EndpointPool("decode", opts.decode!) };
  const all = Object.values(pools);
  await Promise.all(all.map((p) => p.start(opts.healthIntervalMs ?? 2000)));
  const orchestrator = new Orchestrator({
    ...pools,
    prefillTimeoutMs: opts.prefillTimeoutMs ?? 120_000,
    decodeIdleTimeoutMs: opts.decodeIdleTimeoutMs ?? 60_000,
    kvTimeoutMs: opts.kvTimeoutMs ?? 60_000,
  });
  const metrics = new GatewayMetrics();
  const app = createGatewayApp({
    orchestrator,
    pools: all,
    modelPool: pools.solo ?? pools.decode!,
    metrics,
    maxBodyBytes: opts.maxBodyBytes ?? 1 << 20,
  });
  const server = await listen(app.fetch, opts.port, host);
  const port = (server.address() as AddressInfo).port;
  let metricsServer: Server | undefined;
  if (opts.metricsPort !== undefined) {
    metricsServer = await listen(
      async () => new Response(await metrics.registry.metrics(), { headers: { "content-type": metrics.registry.contentType } }),
      opts.metricsPort,
      host,
    );
  }
  return {
    url: `http://${host}:${port}`,
    port,
    metricsPort: metricsServer ? (metricsServer.address() as AddressInfo).port : null,
    metrics,
    async close() {
      all.forEach((p) => p.stop());
      await Promise.all([closeServer(server), metricsServer ? closeServer(metricsServer) : undefined]);
    },
  };
}
