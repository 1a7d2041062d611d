// What both orchestrators need around a worker call: trace headers, describing a network failure,
// relaying a worker's event stream as GenEvents with the right error for every way it can break,
// and the fire-and-forget release.

import { ApiError, StreamIdleError, type ReleaseReason, type WorkerClient, type WorkerEventStream } from "@airm/internal-api";
import { context, propagation, type Span } from "@opentelemetry/api";
import type { Endpoint, EndpointPool } from "../endpoint-pool.ts";
import type { GenEvent } from "./gen-events.ts";
import { causeOf } from "../net-errors.ts";

/** W3C trace headers of the active span, for a worker call. */
export function traceHeaders(): Record<string, string> {
  const h: Record<string, string> = {};
  propagation.inject(context.active(), h);
  return h;
}

/**
 * True when `err` says the worker itself failed the call (a 5xx answer or error event, a broken or
 * silent stream), which counts against its circuit breaker. Not: the client's fault (4xx), an
 * overloaded worker (429/503: busy is not broken), bad KV (the producer's or the wire's fault), or one
 * request's structured output failing (grammar_error: the worker serves the others).
 */
export function isWorkerFault(err: unknown): boolean {
  return err instanceof ApiError && err.status >= 500 && err.status !== 503 && !err.code.startsWith("kv_") && err.code !== "grammar_error";
}

/** True when `signal` was aborted by a request deadline (a timeoutSignal) rather than by the client leaving. */
export function isDeadline(signal: AbortSignal): boolean {
  return signal.aborted && (signal.reason as Error | undefined)?.name === "TimeoutError";
}

/**
 * A signal that aborts with a TimeoutError after `ms`, as AbortSignal.timeout's does, and clear()
 * to drop its timer once what it bounds has ended. For a bound that goes into AbortSignal.any:
 * Node keeps an AbortSignal.timeout given to AbortSignal.any alive until its timer fires, with
 * what hangs on it, so a request deadline of 30 min held about 0.8 kB of every request for 30 min.
 */
export function timeoutSignal(ms: number): { signal: AbortSignal; clear(): void } {
  const ac = new AbortController();
  const timer = setTimeout(() => ac.abort(new DOMException("The operation was aborted due to timeout", "TimeoutError")), ms);
  timer.unref();
  return { signal: ac.signal, clear: () => clearTimeout(timer) };
}

/** Tells a worker the request ended; never throws, never waits long (the lease TTL is the backstop). */
export async function releaseOn(worker: WorkerClient, requestId: string, reason: ReleaseReason): Promise<void> {
  try {
    await worker.release({ requestId, reason }, { signal: AbortSignal.timeout(5000) });
  } catch {
    // The worker is gone: its lease TTL (or the other side's release) frees the blobs.
  }
}

export interface RelayOptions {
  who: string;
  /** Choices the stream carries: it ends after this many done events. */
  choices: number;
  idleMs: number;
  /** The longest wait for the first event (default idleMs): a solo worker's prefill, queue included, may take longer than a gap between tokens. */
  firstIdleMs?: number;
  /** KV push time of the prefill (PD) or null (solo). */
  kv: { pushMs: number; transport: string } | null;
  onReady?(kvLoadMs: number): void;
  /** Called on every event the worker sends (its liveness while it holds the request). */
  onEvent?(): void;
}

/**
 * Relays a worker's event stream (decode or generate) as GenEvents until every choice's `done`. Throws ApiError:
 * the worker's error event, 504 when it went silent, 502 when the stream broke or ended early.
 */
export async function* relayEvents(answer: WorkerEventStream, o: RelayOptions): AsyncGenerator<GenEvent> {
  let tokens = 0;
  let dones = 0;
  let loadMs: number | null = null;
  try {
    for await (const ev of answer.events(o.idleMs, o.firstIdleMs)) {
      o.onEvent?.();
      switch (ev.type) {
        case "first": {
          const { type: _type, ...first } = ev;
          yield { type: "first", first };
          break;
        }
        case "ready":
          loadMs = ev.kvLoadMs;
          o.onReady?.(loadMs);
          break;
        case "token":
          tokens++;
          yield ev;
          break;
        case "done":
          yield { ...ev, kvTransferMs: o.kv && loadMs !== null ? o.kv.pushMs + loadMs : null, transport: o.kv?.transport ?? null };
          if (++dones === o.choices) return;
          break;
        case "error":
          throw new ApiError(ev.status, ev.code, `${o.who}: ${ev.message}`, ev.param);
      }
    }
  } catch (err) {
    if (err instanceof ApiError) throw err;
    if (err instanceof StreamIdleError) throw new ApiError(504, "worker_timeout", `${o.who} sent nothing for ${err.idleMs} ms after ${tokens} tokens; the request was abandoned`);
    throw new ApiError(502, "worker_stream_broken", `${o.who} broke the stream after ${tokens} tokens: ${causeOf(err)}`);
  }
  throw new ApiError(502, "worker_stream_broken", `${o.who} closed the stream after ${tokens} tokens without finishing (did it crash?)`);
}

/**
 * Puts the endpoint a call went to on its span, and why it was picked (`why`, else the pool's
 * rule); the reason is worked out only when the span records (export on, trace sampled).
 */
export function notePick(span: Span, pool: EndpointPool, ep: Endpoint, avoid?: Set<Endpoint>, why?: string): void {
  span.setAttribute("airm.worker", ep.url);
  if (span.isRecording()) span.setAttribute("airm.pick.reason", why ?? pickReason(pool, ep, avoid));
}

/** Why the pool picked `ep` (a span attribute): the least loaded of its healthy endpoints, or the only one. */
function pickReason(pool: EndpointPool, ep: Endpoint, avoid?: Set<Endpoint>): string {
  const healthy = pool.endpoints.filter((e) => e.healthy).length;
  const away = avoid?.size && !avoid.has(ep) ? ", away from the worker a moved stream left" : "";
  return healthy <= 1 ? `the only healthy ${pool.role} worker${away}` : `fewest outstanding requests (${ep.outstanding}) of ${healthy} healthy${away}`;
}
