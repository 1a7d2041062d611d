// Runs one generation against the workers and turns it into a stream of events: PD (prefill and
// decode called at once, so decode prefetches the KV while prefill computes) or solo. Owns
// timeouts, endpoint choice, terminal releases and the error a client sees for a worker fault.
// Knows nothing about the OpenAI wire format (gateway-app.ts) or stop strings.

import { randomBytes } from "node:crypto";
import { context, propagation, SpanStatusCode, trace, type Span } from "@opentelemetry/api";
import { ApiError, apiErrorFromBody } from "./openai-errors.ts";
import type { GenerationRequest } from "./openai-requests.ts";
import { EndpointPool, type Endpoint } from "./endpoint-pool.ts";
import { readNdjson, StreamIdleError } from "./ndjson-stream.ts";

export type GenEvent =
  | { type: "first"; token: number; text: string; promptTokens: number; eos: boolean; maxTokens: number }
  | { type: "token"; index: number; token: number; text: string }
  | { type: "done"; finishReason: "stop" | "length"; completionTokens: number; kvTransferMs: number | null; transport: string | null };

export interface OrchestratorOptions {
  prefill?: EndpointPool;
  decode?: EndpointPool;
  solo?: EndpointPool;
  prefillTimeoutMs: number;
  decodeIdleTimeoutMs: number;
  kvTimeoutMs: number;
}

const tracer = trace.getTracer("@airm/gateway");

/** A fresh request id: `cmpl-` + 24 hex digits (a valid rm-core request id). */
export function newRequestId(): string {
  return `cmpl-${randomBytes(12).toString("hex")}`;
}

function causeOf(err: unknown): string {
  const e = err as Error & { cause?: { code?: string; message?: string } };
  if (e?.name === "TimeoutError") return "timed out";
  if (e?.cause) return e.cause.code ?? e.cause.message ?? String(e.cause);
  return e?.message ?? String(err);
}

const ended = new WeakSet<Span>();
/** Ends a span once (the PD path ends some early and all of them in its cleanup). */
function endSpan(span: Span): void {
  if (ended.has(span)) return;
  ended.add(span);
  span.end();
}

function traceHeaders(): Record<string, string> {
  const h: Record<string, string> = { "content-type": "application/json" };
  propagation.inject(context.active(), h);
  return h;
}

function workerBody(req: GenerationRequest, requestId: string): Record<string, unknown> {
  return { request_id: requestId, ...req.input, max_tokens: req.maxTokens, sampling: req.sampling };
}

/** Sends a release for `requestId` to a worker; never throws, never waits long. */
async function release(ep: Endpoint, requestId: string, reason: string): Promise<void> {
  try {
    await fetch(`${ep.url}/internal/release`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({ request_id: requestId, reason }),
      signal: AbortSignal.timeout(5000),
    });
  } catch {
    // The worker is gone: its lease TTL (or the other side's release) frees the blobs.
  }
}

async function readJson(r: Response): Promise<unknown> {
  const text = await r.text();
  try {
    return JSON.parse(text);
  } catch {
    return { error: { message: text.slice(0, 500) } };
  }
}

/** The "first" event from a worker's first-token fields (/internal/prefill body or solo "first" event). */
function firstEvent(b: Record<string, unknown>): GenEvent {
  return {
    type: "first",
    token: b.first_token as number,
    text: b.first_text as string,
    promptTokens: b.prompt_tokens as number,
    eos: b.eos as boolean,
    maxTokens: b.max_tokens as number,
  };
}

function eventError(ev: Record<string, unknown>, who: string): ApiError {
  const status = typeof ev.status === "number" ? ev.status : 502;
  return new ApiError(
    status,
    typeof ev.code === "string" ? ev.code : "worker_error",
    `${who}: ${typeof ev.message === "string" ? ev.message : "failed"}`,
    typeof ev.param === "string" ? ev.param : null,
  );
}

export class Orchestrator {
  constructor(private readonly o: OrchestratorOptions) {}

  /** True when the gateway runs against a solo worker instead of a prefill/decode pair. */
  get isSolo(): boolean {
    return this.o.solo !== undefined;
  }

  /**
   * The events of one generation. Abandoning the generator (return()) or aborting `signal` ends
   * the request on the workers. Throws ApiError for worker faults (5xx) and rejected input (4xx).
   */
  run(req: GenerationRequest, requestId: string, signal: AbortSignal): AsyncGenerator<GenEvent> {
    return this.o.solo ? this.runSolo(req, requestId, signal) : this.runPd(req, requestId, signal);
  }

  private pickOrFail(pool: EndpointPool): Endpoint {
    const ep = pool.pick();
    if (!ep) throw new ApiError(503, "no_healthy_worker", `no healthy ${pool.role} worker: ${pool.describeDown()}`);
    return ep;
  }

  private async *runSolo(req: GenerationRequest, requestId: string, signal: AbortSignal): AsyncGenerator<GenEvent> {
    const pool = this.o.solo!;
    const ep = this.pickOrFail(pool);
    ep.outstanding++;
    const abort = new AbortController();
    const onAbort = () => abort.abort();
    signal.addEventListener("abort", onAbort);
    const span = tracer.startSpan("solo.generate", { attributes: { "airm.request_id": requestId, "airm.worker": ep.url } });
    try {
      let r: Response;
      try {
        r = await context.with(trace.setSpan(context.active(), span), () =>
          fetch(`${ep.url}/internal/generate`, {
            method: "POST",
            headers: traceHeaders(),
            body: JSON.stringify(workerBody(req, requestId)),
            signal: AbortSignal.any([abort.signal, AbortSignal.timeout(this.o.prefillTimeoutMs)]),
          }),
        );
      } catch (err) {
        if (signal.aborted) return;
        pool.markDown(ep, `unreachable: ${causeOf(err)}`);
        throw new ApiError(502, "worker_unreachable", `solo worker ${ep.url} unreachable: ${causeOf(err)}`);
      }
      if (!r.ok) throw apiErrorFromBody(r.status, await readJson(r), `solo worker ${ep.url} answered ${r.status}`);
      yield* this.relayStream(r, `solo worker ${ep.url}`, null, null);
    } catch (err) {
      span.setStatus({ code: SpanStatusCode.ERROR, message: (err as Error).message });
      throw err;
    } finally {
      signal.removeEventListener("abort", onAbort);
      abort.abort();
      ep.outstanding--;
      span.end();
    }
  }

  /** Relays a worker NDJSON stream (decode or generate) as GenEvents. */
  private async *relayStream(
    r: Response,
    who: string,
    kv: { pushMs: number; transport: string | null; kvSpan?: Span } | null,
    onReady: ((loadMs: number) => void) | null,
  ): AsyncGenerator<GenEvent> {
    let tokens = 0;
    let loadMs: number | null = null;
    try {
      for await (const ev of readNdjson(r.body!, this.o.decodeIdleTimeoutMs)) {
        switch (ev.type) {
          case "first":
            yield firstEvent(ev);
            break;
          case "ready":
            loadMs = typeof ev.kv_load_ms === "number" ? ev.kv_load_ms : null;
            onReady?.(loadMs ?? 0);
            break;
          case "token":
            tokens++;
            yield { type: "token", index: ev.index as number, token: ev.token as number, text: ev.text as string };
            break;
          case "done":
            yield {
              type: "done",
              finishReason: ev.finish_reason === "stop" ? "stop" : "length",
              completionTokens: ev.completion_tokens as number,
              kvTransferMs: kv && loadMs !== null ? kv.pushMs + loadMs : null,
              transport: kv?.transport ?? null,
            };
            return;
          case "error":
            throw eventError(ev, who);
        }
      }
    } catch (err) {
      if (err instanceof ApiError) throw err;
      if (err instanceof StreamIdleError) {
        throw new ApiError(504, "worker_timeout", `${who} sent nothing for ${err.idleMs} ms after ${tokens} tokens; the request was abandoned`);
      }
      throw new ApiError(502, "worker_stream_broken", `${who} broke the stream after ${tokens} tokens: ${causeOf(err)}`);
    }
    throw new ApiError(502, "worker_stream_broken", `${who} closed the stream after ${tokens} tokens without finishing (did it crash?)`);
  }

  private async *runPd(req: GenerationRequest, requestId: string, signal: AbortSignal): AsyncGenerator<GenEvent> {
    let pre = this.pickOrFail(this.o.prefill!);
    const dec = this.pickOrFail(this.o.decode!);
    pre.outstanding++;
    dec.outstanding++;
    const decodeAbort = new AbortController();
    const prefillAbort = new AbortController();
    const onAbort = () => {
      decodeAbort.abort();
      prefillAbort.abort();
    };
    signal.addEventListener("abort", onAbort);
    const parent = context.active();
    const prefillSpan = tracer.startSpan("prefill", { attributes: { "airm.request_id": requestId, "airm.worker": pre.url } }, parent);
    const kvSpan = tracer.startSpan("kv", { attributes: { "airm.request_id": requestId } }, parent);
    const decodeSpan = tracer.startSpan("decode", { attributes: { "airm.request_id": requestId, "airm.worker": dec.url } }, parent);
    let finished = false;
    let reason = "aborted";
    // Decode first: it waits for the blobs while prefill computes them (prefetch).
    const decodeCall = context.with(trace.setSpan(parent, decodeSpan), () =>
      fetch(`${dec.url}/internal/decode`, {
        method: "POST",
        headers: traceHeaders(),
        body: JSON.stringify({ request_id: requestId, max_tokens: req.maxTokens, sampling: req.sampling, kv_timeout_ms: this.o.kvTimeoutMs }),
        signal: decodeAbort.signal,
      }),
    );
    decodeCall.catch(() => {});
    try {
      let pr: Response | undefined;
      // A prefill endpoint that refuses the connection is marked down and the next healthy one is
      // tried (the request id, and so the decode worker's wait, stay the same).
      const tried = new Set<Endpoint>();
      for (;;) {
        tried.add(pre);
        try {
          pr = await context.with(trace.setSpan(parent, prefillSpan), () =>
            fetch(`${pre.url}/internal/prefill`, {
              method: "POST",
              headers: traceHeaders(),
              body: JSON.stringify(workerBody(req, requestId)),
              signal: AbortSignal.any([prefillAbort.signal, AbortSignal.timeout(this.o.prefillTimeoutMs)]),
            }),
          );
          break;
        } catch (err) {
          reason = "prefill_failed";
          if (signal.aborted) return;
          const timedOut = (err as Error).name === "TimeoutError";
          if (!timedOut) this.o.prefill!.markDown(pre, `unreachable: ${causeOf(err)}`);
          const next = timedOut ? undefined : this.o.prefill!.pick(tried);
          if (!next) {
            throw new ApiError(timedOut ? 504 : 502, "prefill_unreachable", `prefill worker ${pre.url} did not answer: ${causeOf(err)}`);
          }
          pre.outstanding--;
          pre = next;
          pre.outstanding++;
          reason = "aborted";
        }
      }
      const pbody = (await readJson(pr)) as Record<string, unknown>;
      if (!pr.ok) {
        reason = "prefill_failed";
        throw apiErrorFromBody(pr.status, pbody, `prefill worker ${pre.url} answered ${pr.status}`);
      }
      prefillSpan.setAttributes({ "airm.prompt_tokens": pbody.prompt_tokens as number, "airm.prefill_ms": pbody.prefill_ms as number });
      endSpan(prefillSpan);
      yield firstEvent(pbody);
      let dr: Response;
      try {
        dr = await decodeCall;
      } catch (err) {
        reason = "decode_rejected";
        if (signal.aborted) return;
        this.o.decode!.markDown(dec, `unreachable: ${causeOf(err)}`);
        throw new ApiError(502, "decode_unreachable", `decode worker ${dec.url} did not answer: ${causeOf(err)}`);
      }
      if (!dr.ok) {
        reason = "decode_rejected";
        throw apiErrorFromBody(dr.status, await readJson(dr), `decode worker ${dec.url} answered ${dr.status}`);
      }
      const pushMs = typeof pbody.kv_push_ms === "number" ? pbody.kv_push_ms : 0;
      const transport = (pre.health?.transport as string | undefined) ?? null;
      for await (const ev of this.relayStream(dr, `decode worker ${dec.url}`, { pushMs, transport }, (loadMs) => {
        kvSpan.setAttributes({ "airm.kv_push_ms": pushMs, "airm.kv_load_ms": loadMs, "airm.kv_transport": transport ?? "" });
        endSpan(kvSpan);
      })) {
        if (ev.type === "done") {
          finished = true;
          reason = "done";
        }
        yield ev;
      }
    } catch (err) {
      decodeSpan.setStatus({ code: SpanStatusCode.ERROR, message: (err as Error).message });
      throw err;
    } finally {
      signal.removeEventListener("abort", onAbort);
      if (!finished) {
        if (reason === "aborted" && signal.aborted) reason = "client_gone";
        decodeAbort.abort();
        prefillAbort.abort();
        void release(dec, requestId, reason);
      }
      void release(pre, requestId, reason);
      pre.outstanding--;
      dec.outstanding--;
      endSpan(prefillSpan);
      endSpan(kvSpan);
      endSpan(decodeSpan);
    }
  }
}
