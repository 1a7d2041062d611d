// The last stages every streamed request shares (decode and generate): finish, which records how
// the decode loop ended and turns a drain's hand-back into the stream's error, and fail, which
// gives the client the error as the stream's last event, logged and counted.
import { toApiError } from "@airm/internal-api";
import { SpanStatusCode, type Span } from "@opentelemetry/api";
import type { WorkerRuntime } from "../runtime.ts";
import { round } from "../generation.ts";
import type { EventSink } from "./http.ts";

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
