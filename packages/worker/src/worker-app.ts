// The worker's internal HTTP API (hono), per role: prefill pushes KV and answers the first
// token, decode pulls KV and streams tokens as NDJSON, solo does both in one process; plus
// release, /health and /metrics. The wire contract is docs/internal-api.md. Engines, transports
// and leases are given; this file wires them to routes and turns failures into OpenAI errors.

import { setImmediate as nextTurn } from "node:timers/promises";
import { Hono, type Context } from "hono";
import { z } from "zod";
import { context as otelContext, propagation, trace, SpanStatusCode } from "@opentelemetry/api";
import {
  ContextOverflowError,
  isAirmError,
  validateRequestId,
  type KVTransport,
  type SamplingParams,
} from "@airm/rm-core";
import type { Logger } from "pino";
import type { ServingEngine, EngineStream } from "./serving-engine.ts";
import { LeaseTable, type LeaseEnd } from "./kv-leases.ts";
import { RequestSlots } from "./request-slots.ts";
import { DecodeBatcher } from "./decode-batcher.ts";
import { KVPusher, pullKV } from "./kv-handoff.ts";
import { TextStream } from "./text-stream.ts";
import type { WorkerMetrics } from "./worker-metrics.ts";

export type Role = "prefill" | "decode" | "solo";

/** What the routes need; `engine` is null while loading. */
export interface WorkerRuntime {
  role: Role;
  backend: string;
  engineName: string;
  engine: ServingEngine | null;
  transport: KVTransport | null;
  loadError: string | null;
  leases: LeaseTable;
  slots: RequestSlots;
  batcher: DecodeBatcher | null;
  metrics: WorkerMetrics;
  log: Logger;
  kvTimeoutMs: number;
  /** Requests waiting for their KV to arrive (decode role). */
  kvWaiting: number;
}

class HttpError extends Error {
  constructor(
    readonly status: number,
    readonly code: string,
    message: string,
    readonly param: string | null = null,
    readonly extra: Record<string, unknown> = {},
  ) {
    super(message);
  }
  body() {
    return {
      error: { message: this.message, type: this.status >= 500 ? "server_error" : "invalid_request_error", param: this.param, code: this.code, ...this.extra },
    };
  }
}

/** Maps any failure to the internal API's error (see docs/internal-api.md). */
export function toHttpError(err: unknown): HttpError {
  if (err instanceof HttpError) return err;
  if (err instanceof ContextOverflowError || isAirmError(err, "CONTEXT_OVERFLOW")) {
    const e = err as ContextOverflowError;
    return new HttpError(400, "context_overflow", e.message, "max_tokens", { requested: e.requested, limit: e.limit });
  }
  if (isAirmError(err, "KV_INTEGRITY")) return new HttpError(502, "kv_integrity_error", err.message, (err as unknown as { field: string }).field ?? null);
  if (isAirmError(err, "TRANSPORT_TIMEOUT")) return new HttpError(504, "kv_timeout", err.message);
  if (isAirmError(err) && (err.code.startsWith("TRANSPORT") || err.code === "INVALID_KEY" || err.code === "UNSUPPORTED")) {
    return new HttpError(502, "kv_transport_error", err.message);
  }
  return new HttpError(500, "engine_error", `engine failed: ${(err as Error)?.message ?? String(err)}`);
}

const samplingSchema = z
  .object({
    temperature: z.number().min(0).max(2).optional(),
    top_p: z.number().gt(0).max(1).optional(),
    top_k: z.number().int().min(0).optional(),
    seed: z.number().int().optional(),
  })
  .strict();

const requestId = z.string().refine(
  (s) => {
    try {
      validateRequestId(s);
      return true;
    } catch {
      return false;
    }
  },
  { message: "must be a valid request id ([A-Za-z0-9._-], no '/')" },
);

const promptBody = z
  .object({
    request_id: requestId,
    prompt: z.string().optional(),
    prompt_token_ids: z.array(z.number().int().min(0)).min(1).optional(),
    messages: z.array(z.object({ role: z.string(), content: z.string() })).min(1).optional(),
    max_tokens: z.number().int().min(1).nullable().default(null),
    sampling: samplingSchema.default({}),
    seq_len: z.number().int().min(1).optional(),
  })
  .refine((b) => [b.prompt, b.prompt_token_ids, b.messages].filter((x) => x !== undefined).length === 1, {
    message: "give exactly one of prompt, prompt_token_ids, messages",
  });

const decodeBody = z.object({
  request_id: requestId,
  max_tokens: z.number().int().min(1).nullable().default(null),
  sampling: samplingSchema.default({}),
  kv_timeout_ms: z.number().int().min(1).optional(),
});

const releaseBody = z.object({
  request_id: requestId,
  reason: z.enum(["done", "client_gone", "decode_rejected", "prefill_failed", "aborted"]).default("done"),
});

function samplingOf(s: z.infer<typeof samplingSchema>): SamplingParams {
  const out: SamplingParams = {};
  if (s.temperature !== undefined) out.temperature = s.temperature;
  if (s.top_p !== undefined) out.topP = s.top_p;
  if (s.top_k !== undefined && s.top_k > 0) out.topK = s.top_k;
  if (s.seed !== undefined) out.seed = s.seed;
  return out;
}

async function parse<T extends z.ZodType>(c: Context, schema: T): Promise<z.infer<T>> {
  let raw: unknown;
  try {
    raw = await c.req.json();
  } catch {
    throw new HttpError(400, "invalid_request", "body is not valid JSON");
  }
  const r = schema.safeParse(raw);
  if (!r.success) {
    const i = r.error.issues[0];
    const param = i.path.map(String).join(".") || null;
    throw new HttpError(400, "invalid_request", param ? `${param}: ${i.message}` : i.message, param);
  }
  return r.data;
}

const tracer = trace.getTracer("@airm/worker");

function errorJson(err: HttpError): Response {
  return new Response(JSON.stringify(err.body()), { status: err.status, headers: { "content-type": "application/json" } });
}

/** Builds the worker's hono app over a runtime that may still be loading. */
export function createWorkerApp(rt: WorkerRuntime): Hono {
  const app = new Hono();
  const enc = new TextEncoder();

  app.onError((err) => {
    const e = toHttpError(err);
    if (e.status >= 500) rt.log.error({ err: (err as Error).message }, "request failed");
    return errorJson(e);
  });
  app.notFound((c) => errorJson(new HttpError(404, "wrong_role", `no route ${c.req.method} ${c.req.path} on a ${rt.role} worker`)));

  const ready = (): ServingEngine => {
    if (!rt.engine) throw new HttpError(503, "not_ready", rt.loadError ? `engine failed to load: ${rt.loadError}` : "the engine is still loading; retry when /health says ready");
    return rt.engine;
  };

  const withTrace = <T>(c: Context, name: string, fn: () => Promise<T>): Promise<T> => {
    const parent = propagation.extract(otelContext.active(), Object.fromEntries(c.req.raw.headers));
    const span = tracer.startSpan(name, {}, parent);
    return otelContext.with(trace.setSpan(parent, span), fn).then(
      (v) => {
        span.end();
        return v;
      },
      (e) => {
        span.setStatus({ code: SpanStatusCode.ERROR, message: (e as Error).message });
        span.end();
        throw e;
      },
    );
  };

  const endLease = (rid: string, reason: LeaseEnd) =>
    rt.leases.end(rid, reason, (err) => rt.log.warn({ request_id: rid, err: (err as Error).message }, "KV release failed"));

  function tokenize(engine: ServingEngine, b: z.infer<typeof promptBody>): number[] {
    let ids: number[];
    if (b.prompt_token_ids) {
      const bad = b.prompt_token_ids.find((t) => t >= engine.model.vocabSize);
      if (bad !== undefined) throw new HttpError(400, "invalid_request", `token id ${bad} is outside the vocabulary (size ${engine.model.vocabSize})`, "prompt");
      ids = b.prompt_token_ids;
    } else if (b.messages) {
      if (!engine.tokenizer.renderChat) throw new HttpError(400, "invalid_request", `model ${engine.model.id} has no chat template; use /v1/completions`, "messages");
      ids = engine.tokenizer.encode(engine.tokenizer.renderChat(b.messages, { addGenerationPrompt: true }), { addSpecialTokens: false });
    } else {
      ids = engine.tokenizer.encode(b.prompt!, { addSpecialTokens: true });
    }
    if (ids.length === 0) throw new HttpError(400, "invalid_request", "the prompt is empty after tokenization", "prompt");
    return ids;
  }

  /** Resolves max_tokens (null: the rest of the largest context) and picks the variant. */
  function plan(engine: ServingEngine, promptTokens: number, maxTokens: number | null, seqLen?: number) {
    const maxS = Math.max(...engine.variants().map((v) => v.seqLen));
    const m = maxTokens ?? maxS - promptTokens;
    if (m < 1) throw new ContextOverflowError(promptTokens + 1, maxS, `the prompt alone has ${promptTokens} tokens`);
    const variant = engine.pickVariant(promptTokens, m);
    if (seqLen !== undefined && seqLen !== variant.seqLen) {
      if (!engine.variants().some((v) => v.seqLen === seqLen)) {
        throw new HttpError(400, "invalid_request", `seq_len ${seqLen} is not compiled here (${engine.variants().map((v) => v.seqLen).join(", ")})`, "seq_len");
      }
      if (promptTokens + m > seqLen) throw new ContextOverflowError(promptTokens + m, seqLen, "seq_len pinned by the request");
      return { maxTokens: m, seqLen };
    }
    return { maxTokens: m, seqLen: variant.seqLen };
  }

  const isEos = (engine: ServingEngine, t: number) => engine.tokenizer.eosTokenIds.includes(t) || engine.model.eosTokenIds.includes(t);
  const newText = (engine: ServingEngine) => new TextStream((ids) => engine.tokenizer.decode(ids, { skipSpecialTokens: true }));
  /** The first-token fields both /internal/prefill and the solo stream's "first" event carry. */
  const firstFields = (engine: ServingEngine, firstToken: number, promptTokens: number, seqLen: number, maxTokens: number, prefillMs: number) => {
    const eos = isEos(engine, firstToken);
    return {
      first_token: firstToken,
      first_text: eos ? "" : newText(engine).push(firstToken),
      prompt_tokens: promptTokens,
      seq_len: seqLen,
      max_tokens: maxTokens,
      eos,
      prefill_ms: round(prefillMs),
    };
  };

  /**
   * Decodes from `stream` until max_tokens, an end-of-sequence token or `aborted()`; writes token
   * and done events. Returns the finish reason ("aborted" when stopped early).
   */
  async function decodeLoop(
    engine: ServingEngine,
    stream: EngineStream,
    first: number,
    maxTokens: number,
    sampling: SamplingParams,
    write: (ev: Record<string, unknown>) => void,
    aborted: () => boolean,
    extra: Record<string, unknown>,
  ): Promise<"stop" | "length" | "aborted"> {
    const text = newText(engine);
    text.push(first);
    let count = 1;
    let cur = first;
    let finish: "stop" | "length" = isEos(engine, first) ? "stop" : "length";
    const t0 = performance.now();
    while (finish !== "stop" && count < maxTokens) {
      if (aborted()) return "aborted";
      const next = await rt.batcher!.step(stream, cur, sampling);
      count++;
      if (isEos(engine, next)) {
        finish = "stop";
        break;
      }
      write({ type: "token", index: count - 1, token: next, text: text.push(next) });
      cur = next;
      await nextTurn();
    }
    if (aborted()) return "aborted";
    const decodeMs = performance.now() - t0;
    rt.metrics.decodeMs.observe(decodeMs);
    write({ type: "done", finish_reason: finish, completion_tokens: count, text: text.flush(), decode_ms: round(decodeMs), ...extra });
    return finish;
  }

  /** An NDJSON response whose body `run` writes; `aborted()` turns true when the client leaves. */
  function ndjson(c: Context, run: (write: (ev: Record<string, unknown>) => void, aborted: () => boolean) => Promise<void>): Response {
    let gone = false;
    const signal = c.req.raw.signal;
    const body = new ReadableStream<Uint8Array>({
      async start(ctrl) {
        const write = (ev: Record<string, unknown>) => {
          if (!gone) {
            try {
              ctrl.enqueue(enc.encode(`${JSON.stringify(ev)}\n`));
            } catch {
              gone = true;
            }
          }
        };
        try {
          await run(write, () => gone || signal.aborted);
        } finally {
          try {
            ctrl.close();
          } catch {
            // cancelled
          }
        }
      },
      cancel() {
        gone = true;
      },
    });
    return new Response(body, { headers: { "content-type": "application/x-ndjson", "cache-control": "no-cache" } });
  }

  // ---------------------------------------------------------------------------------- prefill
  if (rt.role === "prefill") {
    app.post("/internal/prefill", (c) =>
      withTrace(c, "worker.prefill", async () => {
        const engine = ready();
        const b = await parse(c, promptBody);
        const tokens = tokenize(engine, b);
        const { maxTokens, seqLen } = plan(engine, tokens.length, b.max_tokens, b.seq_len);
        const rid = b.request_id;
        if (!rt.leases.open(rid)) throw new HttpError(409, "duplicate_request", `request ${rid} is already in flight on this worker`, "request_id");
        let freeSlot: (() => void) | undefined;
        try {
          freeSlot = await rt.slots.acquire();
          const pusher = new KVPusher(rt.transport!, rid, rt.kvTimeoutMs);
          const t0 = performance.now();
          const res = await engine.prefill(tokens, { seqLen, sampling: samplingOf(b.sampling), onLayer: pusher.onLayer });
          const computed = performance.now();
          freeSlot();
          await tracer.startActiveSpan("kv.push", async (span) => {
            try {
              await pusher.finish(engine.model, res.kv, res.firstToken);
            } finally {
              span.end();
            }
          });
          const pushMs = performance.now() - computed;
          const prefillMs = res.computeMs ?? computed - t0;
          rt.metrics.prefillMs.observe(prefillMs);
          rt.metrics.kvPushMs.observe(pushMs);
          rt.metrics.requests.inc({ route: "prefill", outcome: "ok" });
          return c.json({
            request_id: rid,
            ...firstFields(engine, res.firstToken, tokens.length, seqLen, maxTokens, prefillMs),
            kv_push_ms: round(pushMs),
            kv_bytes: res.kv.k.reduce((a, x) => a + x.byteLength, 0) * 2,
          });
        } catch (err) {
          freeSlot?.();
          rt.metrics.requests.inc({ route: "prefill", outcome: "error" });
          await endLease(rid, "prefill_failed");
          throw err;
        }
      }),
    );
  }

  // ----------------------------------------------------------------------------------- decode
  if (rt.role === "decode") {
    app.post("/internal/decode", async (c) => {
      const engine = ready();
      const b = await parse(c, decodeBody);
      const rid = b.request_id;
      const parent = propagation.extract(otelContext.active(), Object.fromEntries(c.req.raw.headers));
      const stopped = new AbortController();
      let endedBy: LeaseEnd | null = null;
      if (!rt.leases.open(rid, (reason) => {
        endedBy = reason;
        stopped.abort(new Error(`request ${rid} ended: ${reason}`));
      })) {
        throw new HttpError(409, "duplicate_request", `request ${rid} is already in flight on this worker`, "request_id");
      }
      const onClientGone = () => stopped.abort(new Error("the client disconnected"));
      c.req.raw.signal.addEventListener("abort", onClientGone, { once: true });
      const sampling = samplingOf(b.sampling);
      return ndjson(c, async (write, clientGone) => {
        const aborted = () => clientGone() || stopped.signal.aborted;
        let stream: EngineStream | undefined;
        let freeSlot: (() => void) | undefined;
        let reason: LeaseEnd = "done";
        const span = tracer.startSpan("worker.decode", { attributes: { "airm.request_id": rid } }, parent);
        const t0 = performance.now();
        rt.kvWaiting++;
        let waiting = true;
        try {
          const pullSpan = tracer.startSpan("kv.pull", {}, trace.setSpan(parent, span));
          const pulled = await raceAbort(
            pullKV(rt.transport!, rid, engine.model, engine.variants(), b.kv_timeout_ms ?? rt.kvTimeoutMs),
            stopped.signal,
          ).finally(() => pullSpan.end());
          const m = pulled.manifest;
          const first = m.firstToken as number;
          const maxTokens = b.max_tokens ?? m.S - m.n;
          if (m.n + maxTokens > m.S) throw new ContextOverflowError(m.n + maxTokens, m.S, "KV manifest context");
          rt.kvWaiting--;
          waiting = false;
          freeSlot = await rt.slots.acquire(stopped.signal);
          if (aborted()) {
            reason = "client_gone";
            return;
          }
          stream = engine.importKV(pulled.kv);
          const kvLoadMs = performance.now() - pulled.arrivedAt;
          // The engine copied the KV: free the transport's copy now rather than at the end of
          // the request (the lease stays open until a terminal event).
          await rt.transport!.release(rid).catch((err) => rt.log.warn({ request_id: rid, err: (err as Error).message }, "early KV release failed"));
          const kvWaitMs = pulled.arrivedAt - t0;
          rt.metrics.kvLoadMs.observe(kvLoadMs);
          write({ type: "ready", prompt_tokens: m.n, first_token: first, seq_len: m.S, kv_load_ms: round(kvLoadMs), kv_wait_ms: round(kvWaitMs) });
          const finish = await decodeLoop(engine, stream, first, maxTokens, sampling, write, aborted, { kv_load_ms: round(kvLoadMs) });
          if (finish === "aborted") reason = "client_gone";
          rt.metrics.requests.inc({ route: "decode", outcome: finish === "aborted" ? reason : "ok" });
        } catch (err) {
          const e = toHttpError(err);
          reason = clientGone() || c.req.raw.signal.aborted ? "client_gone" : "decode_rejected";
          rt.log.warn({ request_id: rid, code: e.code, err: e.message }, "decode failed");
          rt.metrics.requests.inc({ route: "decode", outcome: e.code });
          span.setStatus({ code: SpanStatusCode.ERROR, message: e.message });
          write({ type: "error", status: e.status, code: e.code, param: e.param, message: e.message });
        } finally {
          if (waiting) rt.kvWaiting--;
          if (stream) engine.release(stream);
          freeSlot?.();
          c.req.raw.signal.removeEventListener("abort", onClientGone);
          // A lease ended from outside (release, TTL) has already released the blobs.
          if (endedBy === null) await endLease(rid, reason);
          span.end();
        }
      });
    });
  }

  // ------------------------------------------------------------------------------------- solo
  if (rt.role === "solo") {
    app.post("/internal/generate", async (c) => {
      const engine = ready();
      const b = await parse(c, promptBody);
      const tokens = tokenize(engine, b);
      const { maxTokens, seqLen } = plan(engine, tokens.length, b.max_tokens, b.seq_len);
      const sampling = samplingOf(b.sampling);
      const parent = propagation.extract(otelContext.active(), Object.fromEntries(c.req.raw.headers));
      return ndjson(c, async (write, aborted) => {
        let stream: EngineStream | undefined;
        let freeSlot: (() => void) | undefined;
        const span = tracer.startSpan("worker.generate", {}, parent);
        try {
          freeSlot = await rt.slots.acquire();
          const t0 = performance.now();
          const res = await engine.prefill(tokens, { seqLen, sampling, keepStream: true });
          stream = res.stream ?? engine.importKV(res.kv);
          const prefillMs = res.computeMs ?? performance.now() - t0;
          rt.metrics.prefillMs.observe(prefillMs);
          write({ type: "first", ...firstFields(engine, res.firstToken, tokens.length, seqLen, maxTokens, prefillMs) });
          await nextTurn();
          const finish = await decodeLoop(engine, stream, res.firstToken, maxTokens, sampling, write, aborted, {});
          rt.metrics.requests.inc({ route: "generate", outcome: finish === "aborted" ? "client_gone" : "ok" });
        } catch (err) {
          const e = toHttpError(err);
          rt.log.warn({ code: e.code, err: e.message }, "generate failed");
          rt.metrics.requests.inc({ route: "generate", outcome: e.code });
          write({ type: "error", status: e.status, code: e.code, param: e.param, message: e.message });
        } finally {
          if (stream) engine.release(stream);
          freeSlot?.();
          span.end();
        }
      });
    });
  }

  // ----------------------------------------------------------------------------- all roles
  app.post("/internal/release", async (c) => {
    const b = await parse(c, releaseBody);
    const released = rt.transport ? await endLease(b.request_id, b.reason) : false;
    return c.json({ request_id: b.request_id, released });
  });

  app.get("/health", (c) => {
    const e = rt.engine;
    const leases = rt.leases.counters();
    const body = {
      status: e ? "ok" : rt.loadError ? "failed" : "loading",
      ready: e !== null,
      role: rt.role,
      backend: rt.backend,
      engine: rt.engineName,
      device: e?.device ?? null,
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
          }
        : null,
      seq_len: e ? Math.max(...e.variants().map((v) => v.seqLen)) : null,
      variants: e?.variants() ?? [],
      transport: rt.transport?.name ?? null,
      leases: { outstanding: leases.outstanding, expired: leases.expired },
      requests: { waiting: rt.slots.numWaiting + rt.kvWaiting, running: rt.slots.numRunning },
      error: rt.loadError,
    };
    return c.json(body, e ? 200 : 503);
  });

  app.get("/metrics", async () => new Response(await rt.metrics.registry.metrics(), { headers: { "content-type": rt.metrics.registry.contentType } }));

  return app;
}

/** Rejects with the signal's reason as soon as it aborts. */
function raceAbort<T>(p: Promise<T>, signal: AbortSignal): Promise<T> {
  if (signal.aborted) return Promise.reject(signal.reason);
  return new Promise<T>((resolve, reject) => {
    const onAbort = () => reject(signal.reason);
    signal.addEventListener("abort", onAbort, { once: true });
    p.then(resolve, reject).finally(() => signal.removeEventListener("abort", onAbort));
  });
}

function round(x: number): number {
  return Math.round(x * 1000) / 1000;
}
