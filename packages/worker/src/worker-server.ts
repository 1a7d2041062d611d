// Starts a worker process's pieces: the HTTP server first (so /health answers "loading" at
// once), then the transport (prefill, decode) and the engine, both chosen by name through the
// registry. Used by the CLI and by tests. Knows nothing about the routes' semantics.

import { serve } from "@hono/node-server";
import type { Server } from "node:http";
import type { AddressInfo } from "node:net";
import pino, { type Logger } from "pino";
import { registry, selectTransport, transportName, ConfigError, type KVTransport } from "@airm/rm-core";
import { createWorkerApp, type Role, type WorkerRuntime } from "./worker-app.ts";
import { engineForBackend, loadServingEngine } from "./serving-engine.ts";
import { LeaseTable } from "./kv-leases.ts";
import { RequestSlots } from "./request-slots.ts";
import { DecodeBatcher } from "./decode-batcher.ts";
import { WorkerMetrics } from "./worker-metrics.ts";

registry.addHost(import.meta.url);

export interface WorkerOptions {
  role: Role;
  backend: string;
  model: string;
  port: number;
  host?: string;
  chip?: number;
  seqLen?: number;
  /** Batch width B (engine slots). */
  batch?: number;
  threads?: number;
  /** Transport name; else AIRM_KV_TRANSPORT, else shm. Ignored for solo. */
  kvTransport?: string;
  /** Lease TTL (s); else AIRM_KV_LEASE_TTL_S, else 120. */
  leaseTtlS?: number;
  /** How long a KV pull waits for a blob (ms). */
  kvTimeoutMs?: number;
  env?: NodeJS.ProcessEnv;
  logger?: Logger;
}

export interface RunningWorker {
  url: string;
  port: number;
  runtime: WorkerRuntime;
  /** Resolves once the engine (and transport) loaded; rejects with the load error. */
  ready: Promise<void>;
  close(): Promise<void>;
}

const ROLES: Role[] = ["prefill", "decode", "solo"];

/**
 * Starts a worker: listens at once, then loads transport and engine. Throws ConfigError for a bad
 * role or backend; load failures reject `ready` (and /health reports them).
 */
export async function startWorker(o: WorkerOptions): Promise<RunningWorker> {
  if (!ROLES.includes(o.role)) throw new ConfigError("--role", `unknown role ${JSON.stringify(o.role)}; use prefill, decode or solo`);
  const engineName = engineForBackend(o.backend);
  const env = o.env ?? process.env;
  const ttlS = o.leaseTtlS ?? (env.AIRM_KV_LEASE_TTL_S ? Number(env.AIRM_KV_LEASE_TTL_S) : 120);
  if (!(ttlS > 0)) throw new ConfigError("AIRM_KV_LEASE_TTL_S", `must be a positive number of seconds, got ${JSON.stringify(env.AIRM_KV_LEASE_TTL_S)}`);
  const log = o.logger ?? pino({ name: `airm-worker-${o.role}`, level: env.AIRM_LOG_LEVEL ?? "info" }, pino.destination(2));

  let runtime!: WorkerRuntime;
  const leases = new LeaseTable(
    ttlS * 1000,
    async (rid) => {
      await runtime.transport?.release(rid);
    },
    (reason, rid) => {
      runtime.metrics.leaseEnds.inc({ reason });
      if (reason === "expired") log.warn({ request_id: rid }, "KV lease expired; blobs released");
    },
  );
  const slots = new RequestSlots(o.batch ?? 1);
  runtime = {
    role: o.role,
    backend: o.backend,
    engineName,
    engine: null,
    transport: null,
    loadError: null,
    leases,
    slots,
    batcher: null,
    metrics: undefined as unknown as WorkerMetrics,
    log,
    kvTimeoutMs: o.kvTimeoutMs ?? 60_000,
    kvWaiting: 0,
  };
  runtime.metrics = new WorkerMetrics(
    {
      waiting: () => slots.numWaiting + runtime.kvWaiting,
      running: () => slots.numRunning,
      kvUsage: () => {
        const s = runtime.engine?.stats?.();
        if (s && s.kvCapacityBytes > 0) return s.kvBytes / s.kvCapacityBytes;
        return slots.numRunning / slots.capacity;
      },
      leases: () => leases.counters(),
    },
    { role: o.role, backend: o.backend },
  );

  const app = createWorkerApp(runtime);
  const host = o.host ?? "127.0.0.1";
  const server = await new Promise<Server>((resolve, reject) => {
    const s = serve({ fetch: app.fetch, port: o.port, hostname: host }) as Server;
    s.once("listening", () => resolve(s));
    s.once("error", reject);
  });
  const port = (server.address() as AddressInfo).port;

  const ready = (async () => {
    let transport: KVTransport | null = null;
    if (o.role !== "solo") {
      const name = transportName({ name: o.kvTransport, env });
      transport = await selectTransport({ name, env });
      runtime.transport = transport;
    }
    const t0 = performance.now();
    const engine = await loadServingEngine(engineName, {
      model: o.model,
      backend: o.backend,
      chip: o.chip,
      seqLen: o.seqLen,
      batch: o.batch,
      threads: o.threads ?? 1,
    });
    const b = o.batch ?? engine.activeVariant?.batch ?? 1;
    slots.capacity = b;
    runtime.batcher = new DecodeBatcher(engine, b);
    runtime.engine = engine;
    log.info(
      {
        role: o.role,
        backend: o.backend,
        engine: engineName,
        device: engine.device,
        model: engine.model.id,
        variants: engine.variants(),
        transport: transport?.name ?? null,
        load_ms: Math.round(performance.now() - t0),
        url: `http://${host}:${port}`,
      },
      `worker ready on ${engine.device.path === "native" ? `native ${engine.device.device}` : "the CPU reference path"}`,
    );
  })();
  ready.catch((err) => {
    runtime.loadError = (err as Error).message;
    log.error({ err: (err as Error).message }, "worker failed to load");
  });

  return {
    url: `http://${host}:${port}`,
    port,
    runtime,
    ready,
    async close() {
      await new Promise<void>((resolve) => {
        server.close(() => resolve());
        server.closeAllConnections?.();
      });
      await leases.endAll("aborted");
      await runtime.engine?.close().catch(() => {});
      await runtime.transport?.close().catch(() => {});
    },
  };
}
