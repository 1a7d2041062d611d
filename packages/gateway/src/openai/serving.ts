// The serving path every generation endpoint (completions/, chat/, responses/) shares: the body
// read as UTF-8 JSON, parsed by the endpoint into a GenerationRequest for a model this gateway
// serves (its constraint checked by the grammar checker), the prefill placement, then one run on
// the orchestrator per prompt and the answer, JSON or SSE (answers.ts's, or the endpoint's own).
// Worker calls, timeouts and releases are the orchestrator's.

import type { GrammarChecker } from "@airm/grammar";
import { ApiError, OverloadedError, toApiError } from "@airm/internal-api";
import { isAirmError } from "@airm/rm-core";
import { SpanKind, context, trace } from "@opentelemetry/api";
import type { Context, Hono } from "hono";
import { bodyLimit } from "hono/body-limit";
import type { Logger } from "pino";
import { GatewayDrain } from "../drain.ts";
import type { EndpointPool } from "../endpoint-pool.ts";
import type { GatewayMetrics } from "../gateway-metrics.ts";
import { newRequestId, timeoutSignal, type GenEvent, type Orchestrator, type Placement } from "../orchestrator/index.ts";
import { type AnswerContext, jsonAnswer, sseAnswer } from "./answers.ts";
import type { ToolSettings } from "./chat/tools.ts";
import { Timing } from "./completion.ts";
import { generationOf } from "./parse.ts";
import type { GenerationRequest, ParseOptions } from "./request-common.ts";
import type { RuntimeAdapters } from "../runtime-adapters.ts";

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
  /** The gateway's log (default: warnings and worse, on stderr). */
  log?: Logger;
  /** The gateway's drain: refuses new requests and cuts the open ones at its end (default: none). */
  drain?: GatewayDrain;
  /** The LoRA adapters loaded through the load route, which the pools give back to a worker that restarted (the pools' `adapters`). */
  adapters?: RuntimeAdapters;
}

/** Field names already logged as ignored (once per name and process: no request body in the log). */
const loggedFields = new Set<string>();

const tracer = trace.getTracer("@airm/gateway");

/** The request body as JSON. Throws ApiError 400 when it is not UTF-8 JSON. */
export async function jsonBody(c: Context): Promise<unknown> {
  const raw = new Uint8Array(await c.req.arrayBuffer());
  let text: string;
  try {
    text = new TextDecoder("utf-8", { fatal: true }).decode(raw);
  } catch {
    throw new ApiError(400, "invalid_encoding", "the request body is not valid UTF-8");
  }
  try {
    return JSON.parse(text);
  } catch (err) {
    throw new ApiError(400, "invalid_json", `the request body is not valid JSON: ${(err as Error).message}`);
  }
}

/** A request's kind: an OpenAI completions body, chat body, or a Responses body (run as chat). */
export type Kind = "completion" | "chat" | "responses";

/** A generation endpoint, as its folder hands it to the shared serving path. */
export interface GenerationEndpoint<B> {
  /** The POST route. */
  path: string;
  kind: Kind;
  /**
   * The body as a checked GenerationRequest, and what of the body the answer needs besides (the
   * Responses API's own body). Throws ApiError (4xx).
   */
  parse: (body: unknown, o: ParseOptions) => { req: GenerationRequest; body: B };
  /** The endpoint's own answer; without one, answers.ts's JSON or SSE answer. */
  answer?: (c: Context, a: AnswerContext, body: B) => Response | Promise<Response>;
}

/**
 * The request body as a checked GenerationRequest for a model this gateway serves (and what of
 * the body the endpoint's answer needs: the Responses API's own body). Throws ApiError (4xx, 503).
 */
async function parseRequest<B>(c: Context, endpoint: GenerationEndpoint<B>, o: GatewayAppOptions): Promise<{ req: GenerationRequest; body: B }> {
  const body = await jsonBody(c);
  const served = o.modelPool.served();
  // A request that names no model takes the only one's defaults (a wrong name is a 404 below).
  // An adapter's request takes its base model's sampling defaults.
  const generationDefaults = (model: string | null) =>
    served.generationDefaults.get(model === null ? (served.modelIds.length === 1 ? served.modelIds[0] : "") : (served.loras.get(model)?.parent ?? model));
  const options = { maxContext: served.maxContext, vocabSize: served.vocabSize, maxChoices: served.slots, generationDefaults, tools: o.tools };
  const parsed = endpoint.parse(body, options);
  const req = parsed.req;
  for (const f of req.ignored) {
    if (loggedFields.has(f) || loggedFields.size > 1000) continue;
    loggedFields.add(f);
    o.log?.warn({ field: f.slice(0, 80) }, "a request field that neither OpenAI nor vLLM defines was ignored (logged once per name)");
  }
  if (served.modelIds.length === 0) throw new ApiError(503, "no_healthy_worker", `no worker has reported its model yet: ${o.modelPool.describeDown()}`);
  if (req.model === null) {
    // As vLLM does: a request that names no model gets the only one served.
    if (served.modelIds.length !== 1) {
      throw new ApiError(404, "model_not_found", `the request names no model and this server serves several: ${served.modelIds.join(", ")}; pass 'model'`, "model");
    }
    req.model = served.modelIds[0];
  }
  // A LoRA adapter is named by its name (vLLM's lora_name), as /v1/models lists it.
  if (served.loras.has(req.model)) req.lora = req.model;
  else if (!served.modelIds.includes(req.model)) {
    const all = [...served.modelIds, ...served.loras.keys()];
    throw new ApiError(404, "model_not_found", `the model '${req.model}' does not exist; this server serves ${all.join(", ")}`, "model");
  }
  // A schema or grammar that does not build is a 400 here, before any worker is called.
  if (req.constraint) await o.grammar.check(req.constraint.spec, req.constraint.param).catch((e) => Promise.reject(toApiError(e)));
  return { req, body: parsed.body };
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
  const ep = o.prefillPool.byHostPort(named);
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
 * `gen`, ended with `error()` once `stop` fired (whatever the aborted worker calls then threw, or
 * an early end): the request's deadline (504 request_timeout) or the end of the gateway's drain
 * (503 gateway_draining). The orchestrator saw the same signal and released the request's slots,
 * lease and blobs on the workers.
 */
async function* endedBy(gen: AsyncGenerator<GenEvent>, stop: AbortSignal, error: () => ApiError): AsyncGenerator<GenEvent> {
  try {
    yield* gen;
  } catch (err) {
    throw stop.aborted ? error() : err;
  }
  if (stop.aborted) throw error();
}

/** `gens`, with `end` called once every one of them has ended (finished, failed or returned after it started). */
function untilAllEnd(gens: AsyncGenerator<GenEvent>[], end: () => void): AsyncGenerator<GenEvent>[] {
  let open = gens.length;
  return gens.map(async function* (gen) {
    try {
      yield* gen;
    } finally {
      if (--open === 0) end();
    }
  });
}

/** The error of a request that ran past its deadline of `limitS` (its own `timeout`, or the server's). */
function timedOut(limitS: number, own: boolean): ApiError {
  return new ApiError(
    504,
    "request_timeout",
    `the request ran past its deadline of ${limitS} s (${own ? "its timeout" : "the server's AIRM_REQUEST_TIMEOUT_S"}); its work on the workers was released`,
  );
}

/** Runs one completion request and answers it (JSON or SSE). */
async function complete<B>(c: Context, endpoint: GenerationEndpoint<B>, o: GatewayAppOptions, timing: Timing): Promise<Response> {
  const kind = endpoint.kind;
  const { req, body } = await parseRequest(c, endpoint, o);
  timing.span?.setAttributes({
    "gen_ai.operation.name": kind === "chat" ? "chat" : kind === "responses" ? "responses" : "text_completion",
    ...(req.model !== null ? { "gen_ai.request.model": req.model } : {}),
    ...(req.maxTokens !== null ? { "gen_ai.request.max_tokens": req.maxTokens } : {}),
    "airm.stream": req.stream,
    "airm.n": req.n,
    "airm.prompts": req.prompts.length,
  });
  const waiting = o.orchestrator.inFlight.beforeFirst;
  if (o.maxWaiting !== undefined && waiting >= o.maxWaiting) {
    throw new OverloadedError(1, `the server holds ${waiting} requests waiting for their first token, its limit (AIRM_MAX_WAITING); retry in 1 s`);
  }
  const requestId = newRequestId();
  timing.span?.setAttribute("airm.request_id", requestId);
  const at = placement(c, o);
  // Aborted when the client goes away: the request signal, or the SSE body being cancelled (which can come first).
  const clientGone = new AbortController();
  const limitS = Math.min(req.timeoutS ?? Number.POSITIVE_INFINITY, o.requestTimeoutS ?? Number.POSITIVE_INFINITY);
  const deadline = Number.isFinite(limitS) ? timeoutSignal(Math.ceil(limitS * 1000)) : undefined;
  const drained = o.drain?.signal;
  const signal = AbortSignal.any([c.req.raw.signal, clientGone.signal, ...(deadline ? [deadline.signal] : []), ...(drained ? [drained] : [])]);
  const own = req.timeoutS !== null && req.timeoutS <= (o.requestTimeoutS ?? Number.POSITIVE_INFINITY);
  // One generation per prompt (a completions batch has several), each under its own request id.
  let gens = req.prompts.map((input, p) => {
    let run = o.orchestrator.run(generationOf(req, input), p === 0 ? requestId : `${requestId}-${p}`, signal, at);
    if (deadline) run = endedBy(run, deadline.signal, () => timedOut(limitS, own));
    return drained ? endedBy(run, drained, GatewayDrain.cutError) : run;
  });
  // The deadline's timer goes once every generation has ended (it would hold the request's signals until it fired).
  if (deadline) gens = untilAllEnd(gens, deadline.clear);
  // Every generation's first token before answering: a failure before any token is an HTTP error.
  const firsts = await Promise.allSettled(gens.map((g) => g.next()));
  const failed = firsts.find((r) => r.status === "rejected");
  if (failed) {
    await Promise.all(gens.map((g) => g.return(undefined).catch(() => {})));
    throw (failed as PromiseRejectedResult).reason;
  }
  const runs = firsts.map((r, p) => {
    const v = (r as PromiseFulfilledResult<IteratorResult<GenEvent>>).value;
    if (v.done || v.value.type !== "first") throw new ApiError(502, "worker_stream_broken", "the worker answered without a first token");
    return { gen: gens[p], first: v.value.first, base: p * req.bestOf };
  });
  const answer = {
    kind: kind === "completion" ? ("completion" as const) : ("chat" as const),
    id: kind === "chat" ? `chatcmpl-${requestId.slice(5)}` : kind === "responses" ? `resp_${requestId.slice(5)}` : requestId,
    created: Math.floor(Date.now() / 1000),
    req,
    runs,
    timing,
    metrics: o.metrics,
    clientGone,
  };
  timing.streaming = req.stream;
  if (endpoint.answer) return endpoint.answer(c, answer, body);
  return req.stream ? sseAnswer(c, answer) : jsonAnswer(c, answer);
}

/**
 * Serves `endpoint` on `app`: POST on its path behind the body limit, in a gateway.request span;
 * an error answers as an OpenAI error body, and every answer is counted by route and status.
 */
export function serveGeneration<B>(app: Hono, o: GatewayAppOptions, endpoint: GenerationEndpoint<B>): void {
  const limit = bodyLimit({
    maxSize: o.maxBodyBytes,
    // The rest of the body is not read, so the connection cannot be reused: say so to the client.
    onError: () => new ApiError(413, "request_too_large", `the request body exceeds ${o.maxBodyBytes} bytes`).toResponse({ connection: "close" }),
  });
  const path = endpoint.path;
  app.post(path, limit, async (c) => {
    const span = tracer.startSpan("gateway.request", { kind: SpanKind.SERVER, attributes: { "http.request.method": "POST", "http.route": path } });
    // The span ends with the answer: here for a JSON body or an error, at the stream's end for SSE.
    const timing = new Timing(span);
    let status = 200;
    try {
      return await context.with(trace.setSpan(context.active(), span), () => complete(c, endpoint, o, timing));
    } catch (err) {
      const e = err instanceof ApiError ? err : isAirmError(err) ? toApiError(err) : new ApiError(500, "internal_error", `gateway error: ${(err as Error).message}`);
      status = e.status;
      span.setAttributes({ "http.response.status_code": e.status, "error.type": e.code });
      timing.streaming = false;
      timing.endSpan(e.message);
      return e.toResponse();
    } finally {
      o.metrics.countRequest(path, status);
      if (!timing.streaming) timing.endSpan();
    }
  });
}
