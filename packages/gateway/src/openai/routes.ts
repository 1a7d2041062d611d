// The OpenAI-compatible routes: /v1/completions and /v1/chat/completions (parse, run, then the
// JSON or the SSE answer), /v1/models and /health. Worker calls, timeouts and releases are the
// orchestrator's; the answer shapes are answers.ts's.

import type { GrammarChecker } from "@airm/grammar";
import { ApiError, OverloadedError, toApiError } from "@airm/internal-api";
import { isAirmError } from "@airm/rm-core";
import { SpanStatusCode, context, trace } from "@opentelemetry/api";
import type { Context, Hono } from "hono";
import { bodyLimit } from "hono/body-limit";
import type { EndpointPool } from "../endpoint-pool.ts";
import type { GatewayMetrics } from "../gateway-metrics.ts";
import { newRequestId, type GenEvent, type Orchestrator, type Placement } from "../orchestrator/index.ts";
import { jsonAnswer, sseAnswer } from "./answers.ts";
import { Timing } from "./completion.ts";
import { parseGenerationRequest, type GenerationRequest } from "./parse.ts";
import type { ToolSettings } from "./tools.ts";

export interface GatewayAppOptions {
  orchestrator: Orchestrator;
  /** Pools whose /health decides the gateway's: prefill + decode, or solo. */
  pools: EndpointPool[];
  /** The pool whose /health names the served model and context (decode or solo). */
  modelPool: EndpointPool;
  /** The prefill workers (PD): where an x-prefiller-host-port header may send a prefill. */
  prefillPool?: EndpointPool;
  metrics: GatewayMetrics;
  /** Largest accepted request body (bytes). */
  maxBodyBytes: number;
  /** Most requests held before their first token; beyond it, 429 (default: no bound). */
  maxWaiting?: number;
  /** Longest a request may run (s; a request's `timeout` may shorten it; default: no limit). */
  requestTimeoutS?: number;
  /** Checks structured-output constraints before the workers see them. */
  grammar: GrammarChecker;
  /** How tool calls are read (the parser of tool_choice auto). */
  tools: ToolSettings;
}

const tracer = trace.getTracer("@airm/gateway");

/** The request body as a checked GenerationRequest for a model this gateway serves. Throws ApiError (4xx, 503). */
async function parseRequest(c: Context, kind: "completion" | "chat", o: GatewayAppOptions): Promise<GenerationRequest> {
  const raw = new Uint8Array(await c.req.arrayBuffer());
  let text: string;
  try {
    text = new TextDecoder("utf-8", { fatal: true }).decode(raw);
  } catch {
    throw new ApiError(400, "invalid_encoding", "the request body is not valid UTF-8");
  }
  let body: unknown;
  try {
    body = JSON.parse(text);
  } catch (err) {
    throw new ApiError(400, "invalid_json", `the request body is not valid JSON: ${(err as Error).message}`);
  }
  const served = o.modelPool.served();
  const req = parseGenerationRequest(kind, body, { maxContext: served.maxContext, vocabSize: served.vocabSize, tools: o.tools });
  if (served.modelIds.length === 0) throw new ApiError(503, "no_healthy_worker", `no worker has reported its model yet: ${o.modelPool.describeDown()}`);
  if (req.model === null) {
    // As vLLM does: a request that names no model gets the only one served.
    if (served.modelIds.length !== 1) {
      throw new ApiError(404, "model_not_found", `the request names no model and this server serves several: ${served.modelIds.join(", ")}; pass 'model'`, "model");
    }
    req.model = served.modelIds[0];
  }
  if (!served.modelIds.includes(req.model)) {
    throw new ApiError(404, "model_not_found", `the model '${req.model}' does not exist; this server serves ${served.modelIds.join(", ")}`, "model");
  }
  // A schema or grammar that does not build is a 400 here, before any worker is called.
  if (req.constraint) await o.grammar.check(req.constraint.spec, req.constraint.param).catch((e) => Promise.reject(toApiError(e)));
  return req;
}

/** The header an llm-d endpoint picker sets to name the prefill pod (llm-d's routing-sidecar protocol). */
export const PREFILLER_HEADER = "x-prefiller-host-port";

/**
 * Where the request's prefill runs: the pod an endpoint picker named in x-prefiller-host-port,
 * which must be one of this gateway's prefill workers (anything else is refused: the header
 * cannot send the gateway to an arbitrary host), else the prefill pool's pick.
 */
function placement(c: Context, o: GatewayAppOptions): Placement {
  const named = c.req.header(PREFILLER_HEADER)?.trim();
  if (!named) return {};
  if (!o.prefillPool) throw new ApiError(400, "invalid_request", `${PREFILLER_HEADER} names a prefill pod, but this gateway runs solo workers`, PREFILLER_HEADER);
  if (!/^(\[[0-9a-fA-F:.]+\]|[A-Za-z0-9.-]+):\d{1,5}$/.test(named)) {
    throw new ApiError(400, "invalid_request", `${PREFILLER_HEADER} must be host:port, got ${JSON.stringify(named.slice(0, 100))}`, PREFILLER_HEADER);
  }
  const ep = o.prefillPool.byUrl(`http://${named}`);
  if (!ep) {
    throw new ApiError(
      403,
      "prefiller_not_in_pool",
      `${PREFILLER_HEADER} names ${named}, which is not one of this gateway's prefill workers (${o.prefillPool.endpoints.map((e) => e.url.replace(/^https?:\/\//, "")).join(", ") || "none known yet"})`,
      PREFILLER_HEADER,
    );
  }
  if (!ep.healthy) throw new ApiError(503, "no_healthy_worker", `the prefill worker ${named} named by ${PREFILLER_HEADER} is not healthy: ${ep.lastError ?? "unknown"}`);
  return { prefill: ep };
}

/**
 * `gen`, ended with 504 request_timeout once `deadline` fired (whatever the aborted worker calls
 * then threw, or an early end). The orchestrator saw the same signal and released the request's
 * slots, lease and blobs on the workers.
 */
async function* withDeadline(gen: AsyncGenerator<GenEvent>, deadline: AbortSignal, limitS: number, own: boolean): AsyncGenerator<GenEvent> {
  const timedOut = () =>
    new ApiError(
      504,
      "request_timeout",
      `the request ran past its deadline of ${limitS} s (${own ? "its timeout" : "the server's AIRM_REQUEST_TIMEOUT_S"}); its work on the workers was released`,
    );
  try {
    yield* gen;
  } catch (err) {
    throw deadline.aborted ? timedOut() : err;
  }
  if (deadline.aborted) throw timedOut();
}

/** Runs one completion request and answers it (JSON or SSE). */
async function complete(c: Context, kind: "completion" | "chat", o: GatewayAppOptions): Promise<Response> {
  const req = await parseRequest(c, kind, o);
  const waiting = o.orchestrator.inFlight.beforeFirst;
  if (o.maxWaiting !== undefined && waiting >= o.maxWaiting) {
    throw new OverloadedError(1, `the server holds ${waiting} requests waiting for their first token, its limit (AIRM_MAX_WAITING); retry in 1 s`);
  }
  const timing = new Timing();
  const requestId = newRequestId();
  trace.getActiveSpan()?.setAttribute("airm.request_id", requestId);
  // Aborted when the client goes away: the request signal, or the SSE body being cancelled (which can come first).
  const clientGone = new AbortController();
  const limitS = Math.min(req.timeoutS ?? Number.POSITIVE_INFINITY, o.requestTimeoutS ?? Number.POSITIVE_INFINITY);
  const deadline = Number.isFinite(limitS) ? AbortSignal.timeout(Math.ceil(limitS * 1000)) : undefined;
  const signals = [c.req.raw.signal, clientGone.signal, ...(deadline ? [deadline] : [])];
  const run = o.orchestrator.run(req, requestId, AbortSignal.any(signals), placement(c, o));
  const gen = deadline ? withDeadline(run, deadline, limitS, req.timeoutS !== null && req.timeoutS <= (o.requestTimeoutS ?? Number.POSITIVE_INFINITY)) : run;
  const r = await gen.next();
  if (r.done || r.value.type !== "first") throw new ApiError(502, "worker_stream_broken", "the worker answered without a first token");
  const answer = {
    kind,
    id: kind === "chat" ? `chatcmpl-${requestId.slice(5)}` : requestId,
    created: Math.floor(Date.now() / 1000),
    req,
    gen,
    first: r.value.first,
    timing,
    metrics: o.metrics,
    clientGone,
  };
  return req.stream ? sseAnswer(c, answer) : jsonAnswer(c, answer);
}

export function openAIRoutes(app: Hono, o: GatewayAppOptions): void {
  app.get("/health", (c) => {
    const roles = o.pools.map((p) => ({
      role: p.role,
      endpoints: p.endpoints.map((e) => ({ url: e.url, healthy: e.healthy, circuit: e.breaker.state, outstanding: e.outstanding, error: e.lastError })),
    }));
    const ok = o.pools.every((p) => p.endpoints.some((e) => e.healthy));
    return c.json({ status: ok ? "ok" : "degraded", mode: o.orchestrator.isSolo ? "solo" : "pd", roles }, ok ? 200 : 503);
  });

  app.get("/metrics", async () => new Response(await o.metrics.registry.metrics(), { headers: { "content-type": o.metrics.registry.contentType } }));

  app.get("/v1/models", (c) => {
    const created = Math.floor(Date.now() / 1000);
    const { modelIds, maxContext } = o.modelPool.served();
    return c.json({ object: "list", data: modelIds.map((id) => ({ id, object: "model", created, owned_by: "rngd-pd", max_model_len: maxContext ?? null })) });
  });

  const limit = bodyLimit({
    maxSize: o.maxBodyBytes,
    // The rest of the body is not read, so the connection cannot be reused: say so to the client.
    onError: () => new ApiError(413, "request_too_large", `the request body exceeds ${o.maxBodyBytes} bytes`).toResponse({ connection: "close" }),
  });
  for (const [path, kind] of [
    ["/v1/completions", "completion"],
    ["/v1/chat/completions", "chat"],
  ] as const) {
    app.post(path, limit, async (c) => {
      const span = tracer.startSpan("gateway.request", { attributes: { "http.route": path } });
      let status = 200;
      try {
        return await context.with(trace.setSpan(context.active(), span), () => complete(c, kind, o));
      } catch (err) {
        const e = err instanceof ApiError ? err : isAirmError(err) ? toApiError(err) : new ApiError(500, "internal_error", `gateway error: ${(err as Error).message}`);
        status = e.status;
        span.setStatus({ code: SpanStatusCode.ERROR, message: e.message });
        return e.toResponse();
      } finally {
        o.metrics.countRequest(path, status);
        span.end();
      }
    });
  }
}
