// One generation on a solo worker (prefill and decode in one process): pick the least loaded
// healthy worker, call /internal/generate, relay its events. The worker ends its own request when
// the call is aborted.

import { ApiError, type WorkerEventStream } from "@airm/internal-api";
import { context, SpanKind, SpanStatusCode, trace } from "@opentelemetry/api";
import type { EndpointPool } from "../endpoint-pool.ts";
import type { Affinity, PrefixRouter } from "../prefix-router.ts";
import type { GenEvent } from "./gen-events.ts";
import { causeOf, nothingListens } from "../net-errors.ts";
import { blame, type MigrationTrail } from "./migration.ts";
import { type Generation, workerFields } from "./generation.ts";
import { isWorkerFault, notePick, relayEvents, traceHeaders } from "./worker-calls.ts";

const tracer = trace.getTracer("@airm/gateway");

export interface SoloTimeouts {
  prefillTimeoutMs: number;
  decodeIdleTimeoutMs: number;
  /** A migrating generation's record: endpoints to avoid when another is healthy, and whom this attempt blames. */
  trail?: MigrationTrail;
  /** Prefix-aware routing (AIRM_ROUTING=prefix): where the prompt's blocks are. */
  router?: PrefixRouter;
  /** The prompt's affinity when the caller worked it out already (undefined: ask the router). */
  affinity?: Affinity | null;
  /** How long to wait for a healthy worker (a restarting one) before 503 (default 0). */
  workerWaitMs?: number;
}

export async function* runSolo(pool: EndpointPool, t: SoloTimeouts, req: Generation, requestId: string, signal: AbortSignal): AsyncGenerator<GenEvent> {
  const affinity = t.affinity !== undefined ? t.affinity : t.router ? await t.router.affinity(req, [pool], pool, signal) : null;
  await pool.untilHealthy(t.workerWaitMs ?? 0, signal);
  if (signal.aborted) return;
  const ep = pool.pickAvoiding(t.trail?.avoid, affinity);
  if (!ep) throw new ApiError(503, "no_healthy_worker", `no healthy ${pool.role} worker: ${pool.describeDown()}`);
  ep.outstanding++;
  const abort = new AbortController();
  const onAbort = () => abort.abort();
  // The prefill timeout covers the call until the first event, not the whole generation.
  let prefillTimedOut = false;
  const prefillTimer = setTimeout(() => {
    prefillTimedOut = true;
    abort.abort(new DOMException(`no first token within ${t.prefillTimeoutMs} ms`, "TimeoutError"));
  }, t.prefillTimeoutMs);
  signal.addEventListener("abort", onAbort);
  const span = tracer.startSpan("solo.generate", { kind: SpanKind.CLIENT, attributes: { "airm.request_id": requestId } });
  notePick(span, pool, ep, t.trail?.avoid);
  try {
    let answer: WorkerEventStream;
    try {
      answer = await context.with(trace.setSpan(context.active(), span), () =>
        ep.client.generate({ requestId, input: req.input, echo: req.echo, ...workerFields(req) }, { headers: traceHeaders(), signal: abort.signal }),
      );
    } catch (err) {
      if (signal.aborted) return;
      if (isWorkerFault(err)) pool.callFailed(ep, (err as Error).message);
      if (err instanceof ApiError) throw err;
      if (prefillTimedOut) throw new ApiError(504, "prefill_timeout", `solo worker ${ep.url} gave no first token within ${t.prefillTimeoutMs} ms`);
      if (nothingListens(err)) pool.markDown(ep, `unreachable: ${causeOf(err)}`);
      throw new ApiError(502, "worker_unreachable", `solo worker ${ep.url} unreachable: ${causeOf(err)}`);
    }
    try {
      for await (const ev of relayEvents(answer, {
        who: `solo worker ${ep.url}`,
        idleMs: t.decodeIdleTimeoutMs,
        // until the first token the prefill timeout governs (it fires first and names itself)
        firstIdleMs: t.prefillTimeoutMs + t.decodeIdleTimeoutMs,
        kv: null,
        choices: req.n,
        onEvent: () => pool.alive(ep),
      })) {
        if (ev.type === "first") {
          clearTimeout(prefillTimer);
          pool.callSucceeded(ep);
        }
        yield ev;
      }
    } catch (err) {
      if (signal.aborted) throw err;
      const e = prefillTimedOut ? new ApiError(504, "prefill_timeout", `solo worker ${ep.url} gave no first token within ${t.prefillTimeoutMs} ms`) : err;
      if (isWorkerFault(e)) pool.callFailed(ep, (e as Error).message);
      throw e;
    }
  } catch (err) {
    blame(t.trail, pool.role, ep);
    span.setStatus({ code: SpanStatusCode.ERROR, message: (err as Error).message });
    throw err;
  } finally {
    clearTimeout(prefillTimer);
    signal.removeEventListener("abort", onAbort);
    abort.abort();
    ep.outstanding--;
    span.end();
  }
}
