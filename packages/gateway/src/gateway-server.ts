// Starts a gateway: endpoint pools with health probes, the orchestrator, the OpenAI app and
// /metrics (airm_* and the pod's vllm:* gauges, which an endpoint picker scrapes) on its port and,
// when asked, the same metrics on a separate port too. Used by the CLI and by tests.

import { serve } from "@hono/node-server";
import type { Server } from "node:http";
import type { AddressInfo } from "node:net";
import { GrammarChecker } from "@airm/grammar";
import { keepIdleConnections, registerPrefixCacheInfo, registerVllmGauges } from "@airm/internal-api";
import { ConfigError, RM_CORE_CONFIG, type TlsMaterial } from "@airm/rm-core";
import pino from "pino";
import { createGatewayApp } from "./app.ts";
import { GatewayDrain } from "./drain.ts";
import { EndpointPool, type PoolOptions } from "./endpoint-pool.ts";
import { GATEWAY_CONFIG, type GatewayConfig } from "./gateway-config.ts";
import { GatewayMetrics } from "./gateway-metrics.ts";
import { Orchestrator, estimatesOf, type DisaggregationMode } from "./orchestrator/index.ts";
import { decodeSlots, podBlocks, podGeometry, podLoad, podLora } from "./pod-load.ts";
import { PrefixRouter } from "./prefix-router.ts";
import { RuntimeAdapters } from "./runtime-adapters.ts";

export interface GatewayOptions extends Partial<GatewayConfig> {
  port: number;
  host?: string;
  prefill?: string[];
  decode?: string[];
  solo?: string[];
  /**
   * Prefill workers from a Kubernetes InferencePool instead of (or besides) --prefill: the pool's
   * pods labelled llm-d.ai/role=prefill, at the pool's target port, followed as they come and go
   * (llm-d's topology: this gateway is the decode pod's sidecar, the picker names the prefill pod).
   */
  prefillPool?: { name: string; namespace: string };
  /** PD: the decode workers also prefill whole requests (started with --local-prefill): a request may run there instead of shipping its KV. */
  localPrefill?: boolean;
  /** With localPrefill, how each request's path is chosen (default auto: measured; see orchestrator/disaggregation.ts). */
  disaggregation?: DisaggregationMode;
  /** The deployment's internal token (AIRM_INTERNAL_TOKEN), sent on every worker call. */
  internalToken?: string;
  /** The deployment's TLS material (AIRM_TLS_DIR): every worker call is mutual TLS (https worker URLs). The client port stays plain HTTP. */
  tls?: TlsMaterial;
}

export interface RunningGateway {
  url: string;
  port: number;
  metricsPort: number | null;
  metrics: GatewayMetrics;
  /**
   * Drains (drain.ts): /health says draining, new requests get 503 gateway_draining, the open ones
   * finish for up to `graceMs` (default: AIRM_DRAIN_S's default; the CLI passes the resolved one) and what is left then ends with
   * gateway_draining. Resolves with the number of requests cut; close() afterwards.
   */
  drain(graceMs?: number): Promise<number>;
  close(): Promise<void>;
}

function listen(fetchFn: (r: Request) => Response | Promise<Response>, port: number, host: string): Promise<Server> {
  return new Promise((resolve, reject) => {
    const server = serve({ fetch: fetchFn, port, hostname: host }) as Server;
    keepIdleConnections(server);
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

function workerPools(o: GatewayOptions, pool: PoolOptions): { solo?: EndpointPool; prefill?: EndpointPool; decode?: EndpointPool } {
  const solo = o.solo?.length ? o.solo : undefined;
  const pd = o.prefill?.length || o.decode?.length || o.prefillPool;
  if (solo && pd) throw new ConfigError("--solo", "give either --solo or --prefill (or --prefill-pool) with --decode, not both");
  if (!solo && !((o.prefill?.length || o.prefillPool) && o.decode?.length)) {
    throw new ConfigError("--prefill/--decode", "give at least one --prefill URL (or --prefill-pool) and one --decode URL (or --solo URL)");
  }
  for (const u of [...(o.prefill ?? []), ...(o.decode ?? []), ...(o.solo ?? [])]) {
    if (!/^https?:\/\/[^/]+/.test(u)) throw new ConfigError("worker URL", `${JSON.stringify(u)} is not an http(s) URL like http://127.0.0.1:8101`);
  }
  return solo
    ? { solo: new EndpointPool("solo", solo, pool) }
    : { prefill: new EndpointPool("prefill", o.prefill ?? [], pool), decode: new EndpointPool("decode", o.decode!, pool) };
}

/**
 * The gateway's figures read from its pools at scrape time: the disaggregation estimates, each
 * endpoint's health and circuit, the vllm:* gauges of the pod it speaks for, and how its serving
 * workers name their blocks (for an endpoint picker that routes by prefix: a pod's gateway speaks
 * for its worker; several workers behind one gateway share a root).
 */
function exportPoolMetrics(metrics: GatewayMetrics, pools: ReturnType<typeof workerPools>, orchestrator: Orchestrator, localPrefill: boolean): void {
  const all = Object.values(pools) as EndpointPool[];
  const servingPool = pools.solo ?? pools.decode!;
  if (pools.decode) metrics.exportEstimates(() => estimatesOf(pools.decode), localPrefill);
  metrics.exportEndpoints(() => all.flatMap((p) => p.endpoints.map((e) => ({ role: p.role, url: e.url, healthy: e.healthy, circuit: e.breaker.state }))));
  registerVllmGauges(
    metrics.registry,
    () => ({ ...podLoad(orchestrator.inFlight, decodeSlots(servingPool), podBlocks(servingPool)), lora: podLora(servingPool) }),
    () => podGeometry(servingPool),
  );
  registerPrefixCacheInfo(metrics.registry, () => {
    const e = servingPool.endpoints.find((x) => x.health?.prefixCache?.enabled && x.health.model && x.health.kvCache);
    if (!e) return null;
    const h = e.health!;
    return { modelFingerprint: h.model!.modelFingerprint, numericsFingerprint: h.model!.numericsFingerprint, blockSize: h.kvCache!.blockSize, instance: h.prefixCache!.instance };
  });
}

/**
 * Keeps `pool`'s members the InferencePool's prefill pods (plus the static `urls`). Resolves once
 * the pool was read; throws the watcher's error (naming the pool and what to check) otherwise.
 */
async function followPrefillPool(at: { name: string; namespace: string }, pool: EndpointPool, urls: string[], scheme: string): Promise<{ stop(): void }> {
  const { InferencePoolMembers, hostPortOf } = await import("@airm/routing");
  const members = new InferencePoolMembers({ poolName: at.name, namespace: at.namespace });
  const sync = () =>
    pool.setUrls([
      ...urls,
      ...members
        .endpoints()
        .filter((e) => e.role === "prefill")
        .map((e) => `${scheme}://${hostPortOf(e)}`),
    ]);
  members.onChange(sync);
  await members.start();
  sync();
  return members;
}

/**
 * Starts the gateway. Unset settings take GATEWAY_CONFIG's defaults. Throws ConfigError when
 * neither --solo nor both --prefill and --decode are given, or both are.
 */
export async function startGateway(opts: GatewayOptions): Promise<RunningGateway> {
  const { port: _p, host: _h, prefill: _pr, decode: _d, solo: _s, prefillPool: _pp, localPrefill, disaggregation, internalToken, tls, ...settings } = opts;
  if (localPrefill && opts.solo?.length) throw new ConfigError("--local-prefill", "is for a PD gateway (--decode workers started with --local-prefill), not --solo");
  if ((disaggregation === "never" || disaggregation === "header") && !localPrefill)
    throw new ConfigError("--disaggregation", `${disaggregation} runs requests whole on the decode workers: it needs --local-prefill (and decode workers started with it)`);
  const cfg = GATEWAY_CONFIG.resolve({ options: settings });
  const host = opts.host ?? "127.0.0.1";
  const adapters = new RuntimeAdapters();
  const pools = workerPools(opts, { token: internalToken, tls, breakerFailures: cfg.breakerFailures, breakerCooldownMs: cfg.breakerCooldownMs, routing: cfg.routing, adapters });
  const all = Object.values(pools) as EndpointPool[];
  const members = opts.prefillPool ? await followPrefillPool(opts.prefillPool, pools.prefill!, opts.prefill ?? [], tls ? "https" : "http") : null;
  await Promise.all(all.map((p) => p.start(cfg.healthIntervalMs)));
  const metrics = new GatewayMetrics();
  const log = pino({ name: "airm-gateway", level: cfg.logLevel }, pino.destination(2));
  const router = cfg.routing === "prefix" ? new PrefixRouter(all, log) : undefined;
  if (router) {
    metrics.exportPrefixRouting(() => ({
      blocks: all.flatMap((p) => p.endpoints.map((e) => ({ endpoint: e.url, blocks: router.index.blocksOf(e.url) }))),
      events: router.eventCounts(),
      lookups: router.counts.lookups,
    }));
  }
  const orchestrator = new Orchestrator({
    ...pools,
    router,
    prefillTimeoutMs: cfg.prefillTimeoutMs,
    decodeIdleTimeoutMs: cfg.decodeIdleTimeoutMs,
    kvTimeoutMs: cfg.kvTimeoutMs,
    workerWaitMs: cfg.workerWaitS * 1000,
    localPrefill: localPrefill === true,
    disaggregation: disaggregation ?? "auto",
    onPath: (id, p) => {
      metrics.paths.inc({ path: p.local ? "local" : "pd", reason: p.reason });
      if (p.decision) log.debug({ request_id: id, path: p.local ? "local" : "pd", prompt_tokens: p.promptTokens, ...p.decision }, "disaggregation decision");
    },
    migration: {
      limit: cfg.migrationLimit,
      onMigrate: (m) => {
        metrics.migrations.inc({ role: m.role, reason: m.reason });
        log.warn(
          { request_id: m.requestId, attempt: m.attempt, resume_at: m.resumeAt, role: m.role, worker: m.from, reason: m.reason, err: m.error },
          "stream moves to another worker",
        );
      },
      onResumed: (m) => {
        metrics.migrationSeconds.observe(m.seconds);
        log.info({ request_id: m.requestId, attempt: m.attempt, resume_at: m.resumeAt, ms: Math.round(m.seconds * 1000) }, "stream resumed");
      },
    },
  });
  const servingPool = pools.solo ?? pools.decode!;
  exportPoolMetrics(metrics, pools, orchestrator, localPrefill === true);
  const grammar = new GrammarChecker();
  const drain = new GatewayDrain();
  metrics.exportDraining(() => drain.draining);
  const app = createGatewayApp({
    drain,
    orchestrator,
    pools: all,
    modelPool: servingPool,
    prefillPool: pools.prefill,
    metrics,
    maxBodyBytes: cfg.maxBodyBytes,
    maxWaiting: cfg.maxWaiting,
    requestTimeoutS: cfg.requestTimeoutS,
    apiKeys: cfg.apiKeys,
    openPaths: cfg.openPaths,
    grammar,
    tools: { parser: cfg.toolCallParser === "none" ? null : cfg.toolCallParser },
    log,
    adapters,
  });
  // What runs so far (probe timers, the pool watch, the grammar thread) would keep a gateway that
  // cannot listen alive: stopped before the error goes up, so that the process exits.
  const abandon = async (err: unknown, opened: Server[]): Promise<never> => {
    members?.stop();
    router?.close();
    for (const p of all) p.stop();
    await Promise.all([...opened.map(closeServer), grammar.close()]);
    throw err;
  };
  const server = await listen(app.fetch, opts.port, host).catch((err) => abandon(err, []));
  const port = (server.address() as AddressInfo).port;
  let metricsServer: Server | undefined;
  if (cfg.metricsPort !== undefined) {
    const scrape = async () => new Response(await metrics.registry.metrics(), { headers: { "content-type": metrics.registry.contentType } });
    metricsServer = await listen(scrape, cfg.metricsPort, host).catch((err) => abandon(err, [server]));
  }
  return {
    url: `http://${host}:${port}`,
    port,
    metricsPort: metricsServer ? (metricsServer.address() as AddressInfo).port : null,
    metrics,
    async drain(graceMs = RM_CORE_CONFIG.resolve({ env: {} }).drainS * 1000) {
      log.info({ open_requests: drain.openRequests, grace_ms: graceMs }, "draining: no new requests");
      const cut = await drain.run(server, graceMs);
      if (cut > 0) log.warn({ cut }, "drain grace passed: open requests ended with gateway_draining");
      return cut;
    },
    async close() {
      members?.stop();
      router?.close();
      for (const p of all) p.stop();
      await Promise.all([closeServer(server), metricsServer ? closeServer(metricsServer) : undefined, grammar.close()]);
    },
  };
}
