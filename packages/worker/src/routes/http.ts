// HTTP plumbing every worker route uses: parse a JSON body with a contract schema (400 naming the
// field), continue the caller's trace, and answer an NDJSON event stream through hono/streaming
// (which tells the route when the client has gone).

import { ApiError, encodeEvent, invalidRequest, NDJSON, type WorkerEvent } from "@airm/internal-api";
import { context as otelContext, propagation, type Context as OtelContext, type Span, trace } from "@opentelemetry/api";
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

/**
 * A blank line goes out after this long without an event (the gateway skips it), so a prompt that
 * takes minutes to its first token (chunked beside running streams) never looks like a dead
 * connection to the caller's HTTP client (undici's body timeout is 300 s).
 */
export const HEARTBEAT_MS = 15_000;

/** Answers with an NDJSON event stream that `run` writes; errors thrown by `run` are logged by `onError`. */
export function eventStream(c: Context, run: (sink: EventSink) => Promise<void>, onError: (e: Error) => void, heartbeatMs = HEARTBEAT_MS): Response {
  c.header("content-type", NDJSON);
  c.header("cache-control", "no-cache");
  return stream(
    c,
    async (s) => {
      let last = performance.now();
      const beat = setInterval(
        () => {
          if (s.aborted || performance.now() - last < heartbeatMs) return;
          last = performance.now();
          s.write("\n").catch(() => {});
        },
        Math.max(1, heartbeatMs / 3),
      );
      const sink: EventSink = {
        write: async (ev) => {
          if (s.aborted) return;
          last = performance.now();
          await s.write(encodeEvent(ev));
        },
        get gone() {
          return s.aborted || c.req.raw.signal.aborted;
        },
      };
      try {
        await run(sink);
      } finally {
        clearInterval(beat);
      }
    },
    async (e) => onError(e),
  );
}

/** Most batch-size events one request's span carries (the size changes at most this often are kept). */
export const MAX_BATCH_EVENTS = 32;

/**
 * The decode batch size of a request's steps, for its span: an event each time the size changes
 * (at most MAX_BATCH_EVENTS) and the steps, smallest, largest and mean at the end. Nothing is
 * observed when the span is not recording (no exporter, or a trace not sampled).
 */
export function batchTrace(span: Span): { onBatch?: (size: number) => void; finish(): void } {
  if (!span.isRecording()) return { finish() {} };
  let steps = 0;
  let sum = 0;
  let min = Number.POSITIVE_INFINITY;
  let max = 0;
  let last = 0;
  let events = 0;
  return {
    onBatch(size) {
      steps++;
      sum += size;
      if (size < min) min = size;
      if (size > max) max = size;
      if (size !== last && events < MAX_BATCH_EVENTS) {
        events++;
        span.addEvent("airm.decode.batch_size", { "airm.batch_size": size, "airm.step": steps });
      }
      last = size;
    },
    finish() {
      if (steps)
        span.setAttributes({ "airm.decode.steps": steps, "airm.decode.batch_size.min": min, "airm.decode.batch_size.max": max, "airm.decode.batch_size.mean": sum / steps });
    },
  };
}
