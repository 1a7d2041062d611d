// The routes every role has: /internal/release (ends a request's lease), /internal/tokenize and
// /internal/detokenize (the model's tokenizer and chat template), /health (the contract's
// WorkerHealth) and /metrics (Prometheus), plus the error and not-found answers.

import {
  ApiError,
  DetokenizeRequestSchema,
  ReleaseRequestSchema,
  ROUTES,
  TokenizeRequestSchema,
  toApiError,
  type DetokenizeResponse,
  type ReleaseResponse,
  type TokenizeResponse,
  type WorkerHealth,
} from "@airm/internal-api";
import type { KVCacheInfo } from "@airm/rm-core";
import type { Hono } from "hono";
import { tokenize } from "../generation.ts";
import { loraHealth } from "../lora.ts";
import type { WorkerRuntime } from "../runtime.ts";
import { parseBody } from "./http.ts";

export function commonRoutes(app: Hono, rt: WorkerRuntime): void {
  app.onError((err) => {
    const e = toApiError(err);
    if (e.status >= 500) rt.log.error({ err: (err as Error).message }, "request failed");
    return e.toResponse();
  });
  app.notFound((c) => new ApiError(404, "wrong_role", `no route ${c.req.method} ${c.req.path} on a ${rt.role} worker`).toResponse());

  app.post(ROUTES.release, async (c) => {
    const b = await parseBody(c, ReleaseRequestSchema);
    const released = rt.serving?.transport ? await rt.endLease(b.requestId, b.reason) : false;
    return c.json({ requestId: b.requestId, released } satisfies ReleaseResponse);
  });

  app.post(ROUTES.tokenize, async (c) => {
    const { engine } = rt.ready();
    const b = await parseBody(c, TokenizeRequestSchema);
    const tokens = "promptTokenIds" in b.input ? b.input.promptTokenIds : tokenize(engine, b.input, b);
    const maxModelLen = engine.kvCache().maxModelLen;
    return c.json({ tokens, tokenStrs: tokens.map((t) => engine.tokenizer.decode([t])), maxModelLen } satisfies TokenizeResponse);
  });

  app.post(ROUTES.detokenize, async (c) => {
    const { engine } = rt.ready();
    const b = await parseBody(c, DetokenizeRequestSchema);
    const bad = b.tokens.find((t) => t >= engine.model.vocabSize);
    if (bad !== undefined) throw new ApiError(400, "invalid_request", `token id ${bad} is outside the vocabulary (size ${engine.model.vocabSize})`, "tokens");
    return c.json({ text: engine.tokenizer.decode(b.tokens) } satisfies DetokenizeResponse);
  });

  probeRoutes(app, rt);
}

/**
 * GET /health and GET /metrics: what probes and scrapers read. They start nothing and carry no
 * prompt or KV, so `--metrics-port` serves them alone on a plain port beside a TLS one.
 */
export function probeRoutes(app: Hono, rt: WorkerRuntime): void {
  app.get(ROUTES.health, (c) => c.json(health(rt), rt.serving && !rt.draining ? 200 : 503));
  app.get(ROUTES.metrics, async () => new Response(await rt.metrics.registry.metrics(), { headers: { "content-type": rt.metrics.registry.contentType } }));
}

function kvCacheHealth(kv: KVCacheInfo): NonNullable<WorkerHealth["kvCache"]> {
  return {
    blockSize: kv.blockSize,
    totalBlocks: kv.totalBlocks,
    usedBlocks: kv.usedBlocks,
    freeBlocks: kv.freeBlocks,
    cachedBlocks: kv.cachedBlocks,
    preemptions: kv.preemptions,
  };
}

/** The worker's /health body. */
export function health(rt: WorkerRuntime): WorkerHealth {
  const s = rt.serving;
  const e = s?.engine;
  const leases = rt.leases.counters();
  return {
    status: rt.draining ? "draining" : e ? "ok" : rt.loadError ? "failed" : "loading",
    ready: e !== undefined && !rt.draining,
    role: rt.role,
    backend: rt.backend,
    engine: rt.engineName,
    device: e ? { ...e.device } : null,
    model: e
      ? {
          id: e.model.id,
          architecture: e.model.architecture,
          layers: e.model.layers,
          kvHeads: e.model.kvHeads,
          headDim: e.model.headDim,
          vocabSize: e.model.vocabSize,
          modelFingerprint: e.model.modelFingerprint,
          numericsFingerprint: e.model.numericsFingerprint,
          ...(e.model.generationDefaults && Object.keys(e.model.generationDefaults).length ? { generationDefaults: { ...e.model.generationDefaults } } : {}),
        }
      : null,
    maxModelLen: e ? e.kvCache().maxModelLen : null,
    variants: e?.variants() ?? [],
    kvCache: e ? kvCacheHealth(e.kvCache()) : null,
    transport: s?.transport?.name ?? null,
    leases: { outstanding: leases.outstanding, expired: leases.expired },
    requests: { waiting: rt.admission.numWaiting + rt.kvWaiting, running: rt.admission.numRunning, slots: rt.admission.maxRunning },
    error: rt.loadError,
    estimates: rt.estimatesNow(),
    ...loraHealth(e),
    ...(e ? { prefixCache: { enabled: e.stats?.().prefixCache?.enabled ?? false, instance: rt.instance, events: rt.kvEvents?.advertised ?? null } } : {}),
  };
}
