// The OpenAI-compatible HTTP surface (hono): /v1/completions, /v1/chat/completions (JSON and
// SSE), /v1/models, /health. Turns orchestrator events into OpenAI bodies, applies stop strings
// and records per-request figures. Worker calls, timeouts and releases are the orchestrator's.

import { Hono, type Context } from "hono";
import { bodyLimit } from "hono/body-limit";
import { SpanStatusCode, context, trace } from "@opentelemetry/api";
import { ApiError, errorResponse } from "./openai-errors.ts";
import { parseGenerationRequest, type GenerationRequest } from "./openai-requests.ts";
import { newRequestId, type GenEvent, type Orchestrator } from "./pd-orchestrator.ts";
import type { EndpointPool } from "./endpoint-pool.ts";
import { StopStringFilter } from "./stop-strings.ts";
import type { GatewayMetrics } from "./gateway-metrics.ts";

export interface GatewayAppOptions {
  orchestrator: Orchestrator;
  /** Pools whose /health decides the gateway's: prefill + decode, or solo. */
  pools: EndpointPool[];
  /** The pool whose /health names the served model and context (decode or solo). */
  modelPool: EndpointPool;
  metrics: GatewayMetrics;
  /** Largest accepted request body (bytes). */
  maxBodyBytes: number;
}

const tracer = trace.getTracer("@airm/gateway");

type Usage = { prompt_tokens: number; completion_tokens: number; total_tokens: number };

interface Outcome {
  text: string;
  finishReason: "stop" | "length";
  usage: Usage;
}

/** Consumes events, applying stop strings; calls `onText` with each safe text delta. */
async function consume(
  gen: AsyncGenerator<GenEvent>,
  first: Extract<GenEvent, { type: "first" }>,
  req: GenerationRequest,
  onText: (delta: string) => void | Promise<void>,
  timing: { firstAt: number; lastAt: number; kvMs: number | null; transport: string | null },
  afterFirst: () => void = () => {},
): Promise<Outcome> {
  const stops = new StopStringFilter(req.stop);
  let text = "";
  let tokens = 1;
  let finishReason: "stop" | "length" = "length";
  const emit = async (delta: string) => {
    if (!delta) return;
    text += delta;
    await onText(delta);
  };
  await emit(stops.push(first.text));
  afterFirst();
  if (stops.hit) finishReason = "stop";
  else {
    for (;;) {
      const r = await gen.next();
      if (r.done) throw new ApiError(502, "worker_stream_broken", "the worker stream ended without a final event");
      const ev = r.value;
      if (ev.type === "token") {
        tokens++;
        timing.lastAt = performance.now();
        await emit(stops.push(ev.text));
        if (stops.hit) {
          finishReason = "stop";
          break;
        }
      } else if (ev.type === "done") {
        tokens = ev.completionTokens;
        finishReason = ev.finishReason;
        timing.kvMs = ev.kvTransferMs;
        timing.transport = ev.transport;
        await emit(stops.flush());
        break;
      }
    }
  }
  await gen.return(undefined);
  return { text, finishReason, usage: { prompt_tokens: first.promptTokens, completion_tokens: tokens, total_tokens: first.promptTokens + tokens } };
}

function sse(obj: unknown): string {
  return `data: ${JSON.stringify(obj)}\n\n`;
}

/** Builds the hono app. */
export function createGatewayApp(o: GatewayAppOptions): Hono {
  const app = new Hono();

  app.onError((err) => {
    const e = err instanceof ApiError ? err : new ApiError(500, "internal_error", `gateway error: ${(err as Error).message}`);
    return errorResponse(e);
  });
  app.notFound((c) => errorResponse(new ApiError(404, "not_found", `no route ${c.req.method} ${c.req.path}; see /v1/completions, /v1/chat/completions, /v1/models, /health`)));

  app.get("/health", (c) => {
    const roles = o.pools.map((p) => ({
      role: p.role,
      endpoints: p.endpoints.map((e) => ({ url: e.url, healthy: e.healthy, outstanding: e.outstanding, error: e.lastError })),
    }));
    const ok = o.pools.every((p) => p.endpoints.some((e) => e.healthy));
    return c.json({ status: ok ? "ok" : "degraded", mode: o.orchestrator.isSolo ? "solo" : "pd", roles }, ok ? 200 : 503);
  });

  app.get("/v1/models", (c) => {
    const created = Math.floor(Date.now() / 1000);
    const { modelIds, maxContext } = o.modelPool.served();
    return c.json({
      object: "list",
      data: modelIds.map((id) => ({ id, object: "model", created, owned_by: "rngd-pd", max_model_len: maxContext ?? null })),
    });
  });

  const limit = bodyLimit({
    maxSize: o.maxBodyBytes,
    onError: () => {
      // The rest of the body is not read, so the connection cannot be reused: say so to the client.
      const r = errorResponse(new ApiError(413, "request_too_large", `the request body exceeds ${o.maxBodyBytes} bytes`));
      r.headers.set("connection", "close");
      return r;
    },
  });
  app.post("/v1/completions", limit, (c) => generate(c, "completion"));
  app.post("/v1/chat/completions", limit, (c) => generate(c, "chat"));

  async function generate(c: Context, kind: "completion" | "chat"): Promise<Response> {
    const route = kind === "chat" ? "/v1/chat/completions" : "/v1/completions";
    const startedAt = performance.now();
    const startMs = Date.now();
    let status = 200;
    const span = tracer.startSpan("gateway.request", { attributes: { "http.route": route } });
    try {
      return await context.with(trace.setSpan(context.active(), span), () => handle());
    } catch (err) {
      const e = err instanceof ApiError ? err : new ApiError(500, "internal_error", `gateway error: ${(err as Error).message}`);
      status = e.status;
      span.setStatus({ code: SpanStatusCode.ERROR, message: e.message });
      return errorResponse(e);
    } finally {
      o.metrics.countRequest(route, status);
      span.end();
    }

    async function handle(): Promise<Response> {
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
      const req = parseGenerationRequest(kind, body, served.maxContext);
      if (served.modelIds.length === 0) {
        throw new ApiError(503, "no_healthy_worker", `no worker has reported its model yet: ${o.modelPool.describeDown()}`);
      }
      if (!served.modelIds.includes(req.model)) {
        throw new ApiError(404, "model_not_found", `the model '${req.model}' does not exist; this server serves ${served.modelIds.join(", ")}`, "model");
      }
      const requestId = newRequestId();
      span.setAttribute("airm.request_id", requestId);
      const id = kind === "chat" ? `chatcmpl-${requestId.slice(5)}` : requestId;
      const created = Math.floor(Date.now() / 1000);
      // Aborted when the client goes away: the request signal, or the SSE body being cancelled
      // (which can come first).
      const clientGone = new AbortController();
      const gen = o.orchestrator.run(req, requestId, AbortSignal.any([c.req.raw.signal, clientGone.signal]));
      const r = await gen.next();
      if (r.done || r.value.type !== "first") throw new ApiError(502, "worker_stream_broken", "the worker answered without a first token");
      const first = r.value;
      const timing = { firstAt: performance.now(), lastAt: performance.now(), kvMs: null as number | null, transport: null as string | null };
      const record = (out: Outcome) => {
        const n = out.usage.completion_tokens;
        o.metrics.record({
          startMs,
          endMs: Date.now(),
          ttftMs: timing.firstAt - startedAt,
          tpotMs: n > 1 ? (timing.lastAt - timing.firstAt) / (n - 1) : null,
          completionTokens: n,
          kvTransferMs: timing.kvMs,
          transport: timing.transport,
        });
      };

      if (!req.stream) {
        let out: Outcome;
        try {
          out = await consume(gen, first, req, () => {}, timing);
        } catch (err) {
          await gen.return(undefined).catch(() => {});
          throw err;
        }
        record(out);
        const choice =
          kind === "chat"
            ? { index: 0, message: { role: "assistant", content: out.text }, logprobs: null, finish_reason: out.finishReason }
            : { index: 0, text: out.text, logprobs: null, finish_reason: out.finishReason };
        return c.json({ id, object: kind === "chat" ? "chat.completion" : "text_completion", created, model: req.model, choices: [choice], usage: out.usage });
      }

      const enc = new TextEncoder();
      const object = kind === "chat" ? "chat.completion.chunk" : "text_completion";
      const chunk = (delta: string | null, finish: string | null) =>
        sse({
          id,
          object,
          created,
          model: req.model,
          choices: [
            kind === "chat"
              ? { index: 0, delta: finish ? {} : { content: delta }, logprobs: null, finish_reason: finish }
              : { index: 0, text: delta ?? "", logprobs: null, finish_reason: finish },
          ],
        });
      const stream = new ReadableStream<Uint8Array>({
        async start(ctrl) {
          const write = (s: string) => ctrl.enqueue(enc.encode(s));
          try {
            if (kind === "chat") {
              write(sse({ id, object, created, model: req.model, choices: [{ index: 0, delta: { role: "assistant", content: "" }, logprobs: null, finish_reason: null }] }));
            }
            // The first token is sent at once, even when its text is still "" (an incomplete
            // character), so clients see the time to first token.
            let sentFirst = kind === "chat";
            const out = await consume(gen, first, req, (delta) => {
              sentFirst = true;
              write(chunk(delta, null));
            }, timing, () => {
              if (!sentFirst) write(chunk("", null));
              sentFirst = true;
            });
            write(chunk(kind === "chat" ? null : "", out.finishReason));
            if (req.includeUsage) write(sse({ id, object, created, model: req.model, choices: [], usage: out.usage }));
            write("data: [DONE]\n\n");
            record(out);
          } catch (err) {
            await gen.return(undefined).catch(() => {});
            if (!c.req.raw.signal.aborted && !clientGone.signal.aborted) {
              const e = err instanceof ApiError ? err : new ApiError(500, "internal_error", (err as Error).message);
              write(sse(e.body()));
              write("data: [DONE]\n\n");
            }
          } finally {
            try {
              ctrl.close();
            } catch {
              // already cancelled by the client
            }
          }
        },
        async cancel() {
          clientGone.abort();
          await gen.return(undefined).catch(() => {});
        },
      });
      return new Response(stream, {
        headers: { "content-type": "text/event-stream", "cache-control": "no-cache", connection: "keep-alive" },
      });
    }
  }

  return app;
}
