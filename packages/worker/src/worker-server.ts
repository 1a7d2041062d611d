// Starts a worker process's pieces: the HTTP server first (so /health answers "loading" at
// once), then the transport (prefill, decode) and the engine, both chosen by name through the
// registry and configured from the worker's environment. With AIRM_TLS_DIR the server is HTTPS and
// refuses, at the handshake, a caller without a certificate of the deployment's CA. Used by the
// CLI and by tests. Knows nothing about the routes' semantics.

import { serve } from "@hono/node-server";
import { keepIdleConnections } from "@airm/internal-api";
import type { Server } from "node:http";
import { createServer as createHttpsServer, type Server as HttpsServer } from "node:https";
import type { AddressInfo } from "node:net";
import type { TLSSocket } from "node:tls";
import {
  ConfigError,
  engineForBackend,
  RM_CORE_CONFIG,
  refusalReason,
  registry,
  selectTransport,
  serveReloads,
  serverTlsOptions,
  tlsMaterialOf,
  transportName,
  type KVTransport,
  type LoraServingOptions,
  type TlsMaterial,
  type WorkerRole,
} from "@airm/rm-core";
import pino, { type Logger } from "pino";
import { createProbeApp, createWorkerApp } from "./app.ts";
import type { KvEventPublisher } from "./kv-events.ts";
import { parseKvEventsConfig } from "./kv-events-config.ts";
import { WorkerRuntime } from "./runtime.ts";
import { loadServingEngine, type ServingEngine } from "./serving-engine.ts";
import { WORKER_CONFIG } from "./worker-config.ts";

registry.addHost(import.meta.url);

export interface WorkerOptions {
  role: WorkerRole;
  backend: string;
  model: string;
  port: number;
  host?: string;
  chip?: number;
  /** The longest request served (--max-model-len; default the engine's AIRM_MAX_MODEL_LEN, else the model's context). */
  maxModelLen?: number;
  /** Batch width B: the widest decode batch compiled (caps the default batches). */
  batch?: number;
  /** Requests run at once (--max-num-seqs; default AIRM_MAX_NUM_SEQS). */
  maxNumSeqs?: number;
  /** Engine settings given on the command line (--block-size, --kv-cache-memory, --max-num-batched-tokens): they win over the engine's variables. */
  engineOptions?: Record<string, unknown>;
  /** CPU threads of the reference backend (the engine's `threads` setting). */
  threads?: number;
  /** Transport name; else AIRM_KV_TRANSPORT, else shm. Ignored for solo. */
  kvTransport?: string;
  /** Decode role: also serve /internal/generate (prefill locally when the picker did not disaggregate). */
  localPrefill?: boolean;
  /** vLLM's --kv-events-config JSON (else AIRM_KV_EVENTS_CONFIG): publish the prefix cache's block events. */
  kvEventsConfig?: string;
  /** Serve LoRA adapters (vLLM's --enable-lora, --max-loras, --max-lora-rank, --lora-modules); unset: none. */
  lora?: LoraServingOptions;
  /** Also serve GET /health and GET /metrics, plain HTTP, on this port (0 picks one): for kubelet probes and scrapers that cannot present a client certificate when AIRM_TLS_DIR makes the serving port mutual TLS. */
  metricsPort?: number;
  /** The environment the worker, its engine and its transport are configured from (default: none); AIRM_INTERNAL_TOKEN in it guards /internal/*. */
  env?: Record<string, string | undefined>;
  logger?: Logger;
}

export interface RunningWorker {
  url: string;
  port: number;
  /** The plain /health and /metrics port (--metrics-port), or null. */
  metricsPort: number | null;
  runtime: WorkerRuntime;
  /** Resolves once the engine (and transport) loaded; rejects with the load error. */
  ready: Promise<void>;
  close(): Promise<void>;
  /**
   * Drains: admits nothing new and reports not ready, lets requests finish for up to `graceMs`
   * (default AIRM_DRAIN_S),
   * then hands the rest back (worker_draining) and waits up to 5 s for their streams to end.
   * Resolves with how many were handed back. Call close() after it.
   */
  drain(graceMs?: number): Promise<number>;
}

const ROLES: WorkerRole[] = ["prefill", "decode", "solo"];

/** The node-server options of an HTTPS server with mutual TLS (none without TLS: plain HTTP as before). */
function tlsServing(tls: TlsMaterial | undefined): object {
  return tls ? { createServer: createHttpsServer, serverOptions: serverTlsOptions(tls) } : {};
}

/** Logs a refused TLS handshake (a certificate missing, of another CA, expired) at warn; other aborted handshakes (a port probe) at debug. */
function logRefusals(server: Server, log: Logger): void {
  server.on("tlsClientError", (err: Error, socket: TLSSocket) => {
    const reason = refusalReason(err, socket);
    if (reason) log.warn({ remote: socket.remoteAddress, reason }, `TLS handshake refused: ${reason}`);
    else log.debug({ remote: socket.remoteAddress, err: err.message }, "TLS handshake aborted");
  });
}

function listen(app: { fetch: (r: Request) => Response | Promise<Response> }, port: number, host: string, tls: TlsMaterial | undefined, log: Logger): Promise<Server> {
  return new Promise((resolve, reject) => {
    const s = serve({ fetch: app.fetch, port, hostname: host, ...tlsServing(tls) }) as Server;
    keepIdleConnections(s);
    if (tls) {
      logRefusals(s, log);
      s.once(
        "close",
        serveReloads(s as unknown as HttpsServer, tls, () => log.info({ dir: tls.dir, generation: tls.generation }, "TLS certificates reloaded")),
      );
    }
    s.once("listening", () => resolve(s));
    s.once("error", reject);
  });
}

/** Closes a server and its connections (none: nothing). */
function closeServer(server: Server | null): Promise<void> {
  return new Promise<void>((resolve) => {
    if (!server) return resolve();
    server.close(() => resolve());
    server.closeAllConnections?.();
  });
}

/** A second port that cannot listen: the first closes, so the process can exit with the error. */
async function closeThenThrow(server: Server, err: unknown): Promise<never> {
  await closeServer(server);
  throw err;
}

/**
 * Starts a worker: listens at once, then loads transport and engine. Throws ConfigError for a bad
 * role, backend or setting; load failures reject `ready` (and /health reports them).
 */
export async function startWorker(o: WorkerOptions): Promise<RunningWorker> {
  if (!ROLES.includes(o.role)) throw new ConfigError("--role", `unknown role ${JSON.stringify(o.role)}; use prefill, decode or solo`);
  if (o.localPrefill && o.role !== "decode") throw new ConfigError("--local-prefill", `is for decode workers (a ${o.role} worker already prefills)`);
  const env = o.env ?? {};
  const cfg = WORKER_CONFIG.resolve({ env });
  const engineName = engineForBackend(o.backend, o.role);
  const kvName = o.role === "solo" ? null : transportName({ name: o.kvTransport, env });
  const log = o.logger ?? pino({ name: `airm-worker-${o.role}`, level: cfg.logLevel }, pino.destination(2));
  const rt = new WorkerRuntime({
    role: o.role,
    backend: o.backend,
    engineName,
    maxNumSeqs: o.maxNumSeqs ?? cfg.maxNumSeqs,
    leaseTtlMs: cfg.leaseTtlS * 1000,
    kvTimeoutMs: cfg.kvTimeoutMs,
    maxWaiting: cfg.maxWaiting,
    grammarCache: cfg.grammarCache,
    localPrefill: o.localPrefill,
    log,
  });
  const host = o.host ?? "127.0.0.1";
  // The engine's and the transport's code is imported before listening: importing (and, from the
  // sources, compiling) it holds the event loop for a second or more, and a worker that accepts
  // connections should answer /health and /metrics at once ("loading") rather than time out.
  await registry.load("airm.workloads", engineName).catch(() => {});
  if (kvName) await registry.load("airm.kv_transports", kvName).catch(() => {});
  const core = RM_CORE_CONFIG.resolve({ env });
  const tls = tlsMaterialOf(core.tlsDir, { reloadS: core.tlsReloadS });
  const server = await listen(createWorkerApp(rt, o.localPrefill, core.internalToken), o.port, host, tls, log);
  const port = (server.address() as AddressInfo).port;
  const url = `${tls ? "https" : "http"}://${host}:${port}`;
  const probes = o.metricsPort === undefined ? null : await listen(createProbeApp(rt), o.metricsPort, host, undefined, log).catch((err) => closeThenThrow(server, err));

  let events: KvEventPublisher | null = null;
  const ready = (async () => {
    let transport: KVTransport | null = null;
    try {
      if (kvName) transport = await selectTransport({ name: kvName, env });
      const t0 = performance.now();
      const engine = await loadServingEngine(
        engineName,
        { model: o.model, backend: o.backend, chip: o.chip, maxModelLen: o.maxModelLen, batch: o.batch, ...(o.lora ? { lora: o.lora } : {}) },
        // --threads (and the other engine flags) win over the engine's variables; without them the engine reads its own settings.
        { env, options: { ...(o.threads === undefined ? {} : { threads: o.threads }), ...(o.engineOptions ?? {}) } },
      );
      // Events before ready: a worker that cannot publish fails to load (and closes its engine,
      // whose threads would keep the process alive) without having said it was ready.
      events = await startKvEvents(o.kvEventsConfig ?? cfg.kvEventsConfig, engine, rt, log, host).catch(async (err) => {
        await engine.close().catch(() => {});
        throw err;
      });
      rt.markReady({ engine, transport });
      const kv = engine.kvCache();
      const info = {
        role: o.role,
        backend: o.backend,
        engine: engineName,
        device: engine.device,
        model: engine.model.id,
        max_model_len: kv.maxModelLen,
        kv_cache: { block_size: kv.blockSize, blocks: kv.totalBlocks, tokens: kv.totalBlocks * kv.blockSize, gib: +((kv.totalBlocks * kv.blockBytes) / 2 ** 30).toFixed(2) },
        transport: kvName,
      };
      log.info(
        { ...info, load_ms: Math.round(performance.now() - t0), url, tls: Boolean(tls) },
        `worker ready on ${engine.device.path === "native" ? `native ${engine.device.device}` : "the CPU reference path"}`,
      );
    } catch (err) {
      await transport?.close().catch(() => {});
      throw err;
    }
  })();
  ready.catch((err) => {
    rt.markFailed((err as Error).message);
    log.error({ err: (err as Error).message }, "worker failed to load");
  });

  return {
    url,
    port,
    metricsPort: probes ? (probes.address() as AddressInfo).port : null,
    runtime: rt,
    ready,
    async drain(graceMs = RM_CORE_CONFIG.resolve({ env }).drainS * 1000) {
      rt.draining = true;
      rt.drainedBy = "signal";
      // Idle keep-alive connections (a gateway's pool) close now, so their next call connects
      // again and, behind a Service, reaches a pod that is not draining.
      server.closeIdleConnections?.();
      const sleep = () => new Promise((r) => setTimeout(r, 50));
      log.info({ running: rt.inFlight(), leases: rt.leases.counters().outstanding, grace_ms: graceMs }, "draining: no new requests");
      const end = performance.now() + graceMs;
      // A connection whose stream ended while draining is idle now: close it too.
      while (!rt.idle() && performance.now() < end) {
        await sleep();
        server.closeIdleConnections?.();
      }
      if (rt.idle()) return 0;
      const handed = rt.inFlight();
      rt.handBackAll();
      log.warn({ handed_back: handed }, "drain grace passed: requests handed back");
      const last = performance.now() + 5000;
      while (rt.inFlight() > 0 && performance.now() < last) await sleep();
      return handed;
    },
    async close() {
      await Promise.all([server, probes].map(closeServer));
      await rt.leases.endAll("aborted");
      await rt.serving?.grammar?.close().catch(() => {});
      await rt.serving?.engine.close().catch(() => {});
      await events?.close().catch(() => {});
      await rt.serving?.transport?.close().catch(() => {});
    },
  };
}

/**
 * Publishes the engine's prefix-cache block events when --kv-events-config enables them: first a
 * cleared event (what a consumer knew of this worker before a restart is gone), then every change.
 */
async function startKvEvents(json: string | undefined, engine: ServingEngine, rt: WorkerRuntime, log: Logger, host: string): Promise<KvEventPublisher | null> {
  if (!json) return null;
  const cfg = parseKvEventsConfig(json);
  if (!cfg.enable_kv_cache_events || cfg.publisher === "null") return null;
  if (!engine.onBlockEvent) throw new ConfigError("--kv-events-config", "this engine keeps no prefix cache to publish events of");
  const { KvEventPublisher } = await import("./kv-events.ts");
  const publisher = await KvEventPublisher.start(cfg, host);
  rt.kvEvents = publisher;
  publisher.add({ kind: "cleared" });
  engine.onBlockEvent((e) => publisher.add(e));
  log.info({ endpoint: publisher.endpoints.events, replay: publisher.endpoints.replay, topic: cfg.topic }, "publishing KV events");
  return publisher;
}
