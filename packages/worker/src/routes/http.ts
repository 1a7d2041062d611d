// HTTP plumbing every worker route uses: parse a JSON body with a contract schema (400 naming the
// field), continue the caller's trace, and answer an NDJSON event stream through hono/streaming
// (which tells the route when the client has gone).

import { ApiError, encodeEvent, invalidRequest, NDJSON, type WorkerEvent } from "@airm/internal-api";
import { context as otelContext, propagation, type Context as OtelContext, trace } from "@opentelemetry/api";
import type { Context } from "hono";
import { stream } from "hono/streaming";
import type { z } from "zod";

export const tracer = trace.getTracer("@airm/worker");

/** The request body parsed with `schema`. Throws ApiError 400 (not JSON, or the first schema issue). */
export async function parseBody<T extends z.ZodType>(c: Context, schema: T): Promise<z.output<T>> {
  let raw: unknown;
  try {
    raw = await c.req.json();
  } catch {
    throw new ApiError(400, "invalid_request", "body is not valid JSON");
  }
  const r = schema.safeParse(raw);
  if (!r.success) throw invalidRequest(r.error);
  return r.data;
}

/** The trace context the caller propagated (W3C traceparent), or the active one. */
export function callerContext(c: Context): OtelContext {
  return propagation.extract(otelContext.active(), Object.fromEntries(c.req.raw.headers));
}

/** A stream of worker events to the caller. */
export interface EventSink {
  /** Writes one event; resolves once the client has taken it (so a slow client slows only itself). */
  write(ev: WorkerEvent): Promise<void>;
  /** True once the client has gone. */
  readonly gone: boolean;
}

/** Answers with an NDJSON event stream that `run` writes; errors thrown by `run` are logged by `onError`. */
export function eventStream(c: Context, run: (sink: EventSink) => Promise<void>, onError: (e: Error) => void): Response {
  c.header("content-type", NDJSON);
  c.header("cache-control", "no-cache");
  return stream(
    c,
    async (s) => {
      const sink: EventSink = {
        write: async (ev) => {
          if (!s.aborted) await s.write(encodeEvent(ev));
        },
        get gone() {
          return s.aborted || c.req.raw.signal.aborted;
        },
      };
      await run(sink);
    },
    async (e) => onError(e),
  );
}
