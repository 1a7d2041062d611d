// The stages a worker request passes, shared by the routes (prefill, decode, generate):
// prepare (the worker admits one more request, and this engine can run what it asks), admit (the
// engine sets its blocks and a running slot aside), then each route's own compute (prefill, or
// receive and import the KV) and decode loop, and for the streamed routes finish (how the decode
// loop ended, a drain's hand-back turned into the stream's error) or fail (the error as the
// stream's last event, logged and counted).
import { toApiError } from "@airm/internal-api";
import type { SamplingParams } from "@airm/rm-core";
import { SpanStatusCode, type Span } from "@opentelemetry/api";
import type { Admitted } from "../admission.ts";
import { checkChoices, checkLogitBias, round } from "../generation.ts";
import type { WorkerRuntime } from "../runtime.ts";
import type { ServingEngine } from "../serving-engine.ts";
import type { EventSink } from "./http.ts";

/**
 * Prepare: throws 503 while the worker drains and 429 when its queue is full (rt.admit), 400 when
 * the request's logit_bias names a token outside the vocabulary or its `choices` exceed the
 * requests this worker runs at once (routes that run the choices here pass them).
 */
export function prepareStage(rt: WorkerRuntime, route: string, engine: ServingEngine, sampling: SamplingParams, choices?: number): void {
  rt.admit(route);
  checkLogitBias(engine, sampling);
  if (choices !== undefined) checkChoices(rt.admission.maxRunning, choices);
}

/**
 * Admit: waits until the engine sets aside the blocks of `need` and a running slot; the wait goes
 * on the span. A request on a LoRA adapter counts as waiting on it, then running on it until its
 * slot is released (vllm:lora_requests_info).
 */
export async function admitStage(rt: WorkerRuntime, span: Span, need: { positions: number; extra?: number; signal?: AbortSignal; lora?: string }): Promise<Admitted> {
  const queued = performance.now();
  const leaveWaiting = need.lora === undefined ? () => {} : rt.loraUse.enter(need.lora, "waiting");
  let admitted: Admitted;
  try {
    admitted = await rt.admission.acquire(need);
  } finally {
    leaveWaiting();
  }
  span.setAttribute("airm.queue_wait_ms", round(performance.now() - queued));
  if (need.lora === undefined) return admitted;
  const leaveRunning = rt.loraUse.enter(need.lora, "running");
  return {
    reservation: admitted.reservation,
    release() {
      leaveRunning();
      admitted.release();
    },
  };
}

/**
 * Records how the decode loop of `route` ended; throws the hand-back when a draining worker
 * stopped it (the stream then ends with worker_draining and a gateway moves the request).
 */
export function finishStage(rt: WorkerRuntime, route: string, span: Span, sink: EventSink, finish: string, decodeMs: number): "done" | "client_gone" {
  span.setAttributes({ "airm.decode_ms": round(decodeMs), "airm.finish": finish });
  if (finish === "aborted" && rt.handBack.signal.aborted && !sink.gone) throw rt.handBack.signal.reason;
  if (finish !== "aborted") rt.metrics.decodeMs.observe(decodeMs);
  rt.metrics.requests.inc({ route, outcome: finish === "aborted" ? "client_gone" : "ok" });
  return finish === "aborted" ? "client_gone" : "done";
}

/** Ends the stream of `route` with `err` as an error event (the status and code a client sees), logged and counted. */
export async function failStage(rt: WorkerRuntime, route: string, span: Span, sink: EventSink, err: unknown, requestId: string): Promise<void> {
  const e = toApiError(err);
  rt.log.warn({ request_id: requestId, code: e.code, err: e.message }, `${route} failed`);
  rt.metrics.requests.inc({ route, outcome: e.code });
  span.setStatus({ code: SpanStatusCode.ERROR, message: e.message });
  await sink.write({ type: "error", status: e.status, code: e.code, param: e.param, message: e.message });
}
