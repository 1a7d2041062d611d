// One generation on a prefill and a decode worker. Decode is called first (it waits for the KV
// while prefill computes it: prefetch), then prefill; a prefill endpoint that refuses the
// connection is marked down and the next one gets the same request. The first token comes from
// the prefill answer, the rest from decode's stream. Every terminal event releases the request
// on the workers that hold it.

import { ApiError, type KvHoldResponse, type PrefillResponse, type WorkerEventStream } from "@airm/internal-api";
import { context, SpanKind, SpanStatusCode, trace, type Context, type Span } from "@opentelemetry/api";
import type { Endpoint, EndpointPool } from "../endpoint-pool.ts";
import type { Affinity, PrefixRouter } from "../prefix-router.ts";
import type { EndReason, GenEvent } from "./gen-events.ts";
import { causeOf, nothingListens } from "../net-errors.ts";
import { blame, type MigrationTrail } from "./migration.ts";
import { type Generation, workerFields } from "./generation.ts";
import { onNextEndpoints } from "./retry.ts";
import { isDeadline, isWorkerFault, notePick, relayEvents, releaseOn, timeoutSignal, traceHeaders } from "./worker-calls.ts";

const tracer = trace.getTracer("@airm/gateway");

export interface PdOptions {
  prefill: EndpointPool;
  decode: EndpointPool;
  prefillTimeoutMs: number;
  decodeIdleTimeoutMs: number;
  kvTimeoutMs: number;
  /** The prefill endpoint an endpoint picker named for this request (x-prefiller-host-port); else the pool picks. */
  prefillAt?: Endpoint;
  /** A migrating generation's record: endpoints to avoid when another is healthy, and whom this attempt blames. */
  trail?: MigrationTrail;
  /** Prefix-aware routing (AIRM_ROUTING=prefix): where the prompt's blocks are. */
  router?: PrefixRouter;
  /** The prompt's affinity when the caller worked it out already (undefined: ask the router). */
  affinity?: Affinity | null;
  /** How long to wait for a healthy worker of a role (a restarting one) before 503 (default 0). */
  workerWaitMs?: number;
}

/** The pool's pick, away from `avoid` when another endpoint is healthy. */
function pickOrFail(pool: EndpointPool, avoid?: Set<Endpoint>, affinity?: Affinity | null): Endpoint {
  const ep = pool.pickAvoiding(avoid, affinity);
  if (!ep) throw new ApiError(503, "no_healthy_worker", `no healthy ${pool.role} worker: ${pool.describeDown()}`);
  return ep;
}

/** Ends a span once (the PD path ends some early and all of them in its cleanup). */
function endOnce(span: Span, ended: Set<Span>): void {
  if (ended.has(span)) return;
  ended.add(span);
  span.end();
}

/** One PD request's state: its endpoints, spans and how it ended. */
class PdRequest {
  pre: Endpoint;
  dec: Endpoint;
  reason: EndReason = "aborted";
  finished = false;
  readonly decodeAbort = new AbortController();
  readonly prefillAbort = new AbortController();
  readonly parent: Context = context.active();
  readonly spans: { prefill: Span; kv: Span; decode: Span };
  readonly ended = new Set<Span>();

  constructor(
    readonly o: PdOptions,
    readonly req: Generation,
    readonly requestId: string,
    affinity: Affinity | null = null,
  ) {
    this.pre = o.prefillAt ?? pickOrFail(o.prefill, o.trail?.avoid, affinity);
    this.dec = pickOrFail(o.decode, o.trail?.avoid, affinity);
    this.pre.outstanding++;
    this.dec.outstanding++;
    const attrs = { "airm.request_id": requestId };
    this.spans = {
      prefill: tracer.startSpan("prefill", { kind: SpanKind.CLIENT, attributes: attrs }, this.parent),
      kv: tracer.startSpan("kv", { attributes: attrs }, this.parent),
      decode: tracer.startSpan("decode", { kind: SpanKind.CLIENT, attributes: attrs }, this.parent),
    };
    notePick(this.spans.prefill, o.prefill, this.pre, o.trail?.avoid, o.prefillAt ? "named by the endpoint picker (x-prefiller-host-port)" : undefined);
    notePick(this.spans.decode, o.decode, this.dec, o.trail?.avoid, affinity ? prefixWhy(affinity, this.dec) : undefined);
    if (affinity) this.spans.decode.setAttribute("airm.prefix_blocks_matched", affinity.matched(this.dec));
  }

  /**
   * Starts the decode call (it waits for the KV). Its KV wait runs from now, while the prompt may
   * still queue for a prefill worker, so it gets the prefill's own bound on top of the KV slack:
   * the gateway's prefill timeout is what ends a prefill that takes too long (and then releases
   * the decode), not a decode that stopped waiting first.
   */
  startDecode(): Promise<WorkerEventStream> {
    const { req, requestId } = this;
    const kvTimeoutMs = this.o.prefillTimeoutMs + this.o.kvTimeoutMs;
    const call = context.with(trace.setSpan(this.parent, this.spans.decode), () =>
      this.dec.client.decode({ requestId, kvTimeoutMs, ...workerFields(req) }, { headers: traceHeaders(), signal: this.decodeAbort.signal }),
    );
    call.catch(() => {});
    return call;
  }

  /**
   * Asks the decode worker which of the prompt's first blocks its prefix cache holds (it keeps
   * them for this request): the prefill worker then sends only the rest. A decode worker that
   * cannot say (an older one, or an error) holds nothing: every block crosses, as before.
   */
  async hold(signal: AbortSignal, promptTokenIds?: number[]): Promise<KvHoldResponse["held"]> {
    const { req } = this;
    const limit = timeoutSignal(this.o.prefillTimeoutMs);
    try {
      const answer = await this.dec.client.kvHold(
        {
          requestId: this.requestId,
          // The prompt's token ids when prefix routing asked for them already (the same
          // tokenization the worker would do): the decode worker does not tokenize it again.
          input: promptTokenIds ? { promptTokenIds } : req.input,
          ...(req.cacheSalt ? { cacheSalt: req.cacheSalt } : {}),
          ...(req.lora ? { lora: req.lora } : {}),
          ...(req.resume ? { resume: req.resume } : {}),
        },
        { headers: traceHeaders(), signal: AbortSignal.any([signal, limit.signal]) },
      );
      if (answer.held) this.spans.kv.setAttributes({ "airm.kv_held_blocks": answer.held.blocks, "airm.kv_held_positions": answer.held.positions });
      return answer.held;
    } catch (err) {
      this.spans.kv.addEvent("airm.kv_hold_failed", { "airm.reason": causeOf(err) });
      return null;
    } finally {
      limit.clear();
    }
  }

  /** Runs prefill, trying the next healthy endpoint when one refuses the connection or is full. Null when the client left. */
  prefill(signal: AbortSignal, held: KvHoldResponse["held"] = null): Promise<PrefillResponse | null> {
    const pool = this.o.prefill;
    return onNextEndpoints({
      pool,
      first: this.pre,
      span: this.spans.prefill,
      call: async (ep) => {
        const limit = timeoutSignal(this.o.prefillTimeoutMs);
        try {
          const answer = await context.with(trace.setSpan(this.parent, this.spans.prefill), () =>
            ep.client.prefill(
              {
                requestId: this.requestId,
                input: this.req.input,
                echo: this.req.echo,
                ...workerFields(this.req),
                ...(held ? { skip: { blocks: held.blocks, hash: held.hash } } : {}),
              },
              { headers: traceHeaders(), signal: AbortSignal.any([this.prefillAbort.signal, limit.signal]) },
            ),
          );
          pool.alive(ep);
          pool.callSucceeded(ep);
          return answer;
        } finally {
          limit.clear();
        }
      },
      failed: (err, ep) => {
        if (signal.aborted) return { stop: true }; // the client left or the deadline passed: cleanup says which
        this.reason = "prefill_failed";
        if (isWorkerFault(err)) pool.callFailed(ep, (err as Error).message);
        // Retried on another prefill worker only when nothing came back yet (no token can repeat:
        // the first one comes from this answer): a worker that is full (429) or not reachable.
        const full = err instanceof ApiError && err.status === 429;
        if (err instanceof ApiError && !full) return { fail: err };
        const timedOut = (err as Error).name === "TimeoutError";
        if (timedOut) return { fail: new ApiError(504, "prefill_unreachable", `prefill worker ${ep.url} did not answer: ${causeOf(err)}`) };
        if (!full && nothingListens(err)) pool.markDown(ep, `unreachable: ${causeOf(err)}`);
        return { retry: full ? "full (429)" : causeOf(err) };
      },
      exhausted: (err, ep) => (err instanceof ApiError ? err : new ApiError(502, "prefill_unreachable", `prefill worker ${ep.url} did not answer: ${causeOf(err)}`)),
      waitMs: this.o.workerWaitMs,
      signal,
      moved: (ep) => {
        this.pre = ep;
        this.reason = "aborted";
      },
    });
  }

  /**
   * Awaits the decode call's acceptance. A decode worker that cannot be reached (it died, and the
   * probes have not seen it yet) took nothing of the request, so the next healthy one gets the
   * same call: the KV waits in the transport. Null when the client left.
   */
  decodeBody(first: Promise<WorkerEventStream>, signal: AbortSignal): Promise<WorkerEventStream | null> {
    const pool = this.o.decode;
    return onNextEndpoints({
      pool,
      first: this.dec,
      span: this.spans.decode,
      // The first call started before prefill (prefetch); a retry starts its own.
      call: (_ep, attempt) => (attempt === 0 ? first : this.startDecode()),
      failed: (err, ep) => {
        if (signal.aborted) return { stop: true };
        this.reason = "decode_rejected";
        if (isWorkerFault(err)) pool.callFailed(ep, (err as Error).message);
        if (err instanceof ApiError) return { fail: err };
        if (nothingListens(err)) pool.markDown(ep, `unreachable: ${causeOf(err)}`);
        return { retry: causeOf(err) };
      },
      exhausted: (err, ep) => new ApiError(502, "decode_unreachable", `decode worker ${ep.url} did not answer: ${causeOf(err)}`),
      waitMs: this.o.workerWaitMs,
      signal,
      moved: (ep) => {
        this.dec = ep;
        this.reason = "aborted";
      },
    });
  }

  /** Releases what the workers hold (unless decode finished), frees the endpoints, ends the spans. */
  cleanup(signal: AbortSignal): void {
    if (!this.finished) {
      if (this.reason === "aborted" && signal.aborted) this.reason = isDeadline(signal) ? "deadline" : "client_gone";
      this.decodeAbort.abort();
      this.prefillAbort.abort();
      void releaseOn(this.dec.client, this.requestId, this.reason);
    }
    void releaseOn(this.pre.client, this.requestId, this.reason);
    this.pre.outstanding--;
    this.dec.outstanding--;
    for (const s of Object.values(this.spans)) endOnce(s, this.ended);
  }
}

/** Why a prefix-routed pick went where it did (a span attribute). */
function prefixWhy(a: Affinity, e: Endpoint): string {
  return `prefix routing: holds ${a.matched(e)} of the prompt's ${a.blocks} blocks, ${e.outstanding} requests outstanding`;
}

export async function* runPd(o: PdOptions, req: Generation, requestId: string, signal: AbortSignal): AsyncGenerator<GenEvent> {
  const affinity = o.affinity !== undefined ? o.affinity : o.router ? await o.router.affinity(req, [o.prefill, o.decode], o.decode, signal) : null;
  // A role with no healthy worker (one restarting): wait for it, up to workerWaitMs.
  for (const pool of o.prefillAt ? [o.decode] : [o.prefill, o.decode]) await pool.untilHealthy(o.workerWaitMs ?? 0, signal);
  if (signal.aborted) return;
  const r = new PdRequest(o, req, requestId, affinity);
  const onAbort = () => {
    r.decodeAbort.abort();
    r.prefillAbort.abort();
  };
  signal.addEventListener("abort", onAbort);
  try {
    const held = await r.hold(signal, affinity?.promptTokens);
    const decodeCall = r.startDecode();
    const answer = await r.prefill(signal, held);
    if (!answer) return;
    // The positions decode held came from a cache too: cached_tokens counts the larger reuse.
    if (held && held.positions > (answer.first.cachedTokens ?? 0)) answer.first.cachedTokens = held.positions;
    r.spans.prefill.setAttributes({
      "airm.prompt_tokens": answer.first.promptTokens,
      "airm.prefill_ms": answer.first.prefillMs,
      "airm.cached_tokens": answer.first.cachedTokens ?? 0,
    });
    endOnce(r.spans.prefill, r.ended);
    yield { type: "first", first: answer.first };
    const body = await r.decodeBody(decodeCall, signal);
    if (!body) return;
    const kv = { pushMs: answer.kvPushMs, transport: answer.transport };
    const onReady = (loadMs: number) => {
      r.spans.kv.setAttributes({
        "airm.kv_push_ms": kv.pushMs,
        "airm.kv_load_ms": loadMs,
        "airm.kv_transport": kv.transport,
        ...(answer.kvBytes !== undefined ? { "airm.kv_bytes": answer.kvBytes } : {}),
      });
      endOnce(r.spans.kv, r.ended);
    };
    let answered = false;
    const onEvent = () => {
      o.decode.alive(r.dec);
      if (!answered) o.decode.callSucceeded(r.dec);
      answered = true;
    };
    let dones = 0;
    for await (const ev of relayEvents(body, { who: `decode worker ${r.dec.url}`, idleMs: o.decodeIdleTimeoutMs, kv, onReady, onEvent, choices: req.n })) {
      if (ev.type === "done" && ++dones === req.n) {
        r.finished = true;
        r.reason = "done";
      }
      yield ev;
    }
  } catch (err) {
    if (err instanceof ApiError) {
      // The KV that never arrived was the prefill worker's (it died after answering); anything else is the decode worker's.
      const prefillSide = r.reason === "prefill_failed" || (err.code.startsWith("kv_") && err.code !== "kv_integrity_error");
      if (prefillSide) blame(o.trail, "prefill", r.pre);
      else blame(o.trail, "decode", r.dec);
    }
    r.spans.decode.setStatus({ code: SpanStatusCode.ERROR, message: (err as Error).message });
    if (r.reason !== "prefill_failed" && r.reason !== "decode_rejected" && !signal.aborted && isWorkerFault(err)) o.decode.callFailed(r.dec, (err as Error).message);
    throw err;
  } finally {
    signal.removeEventListener("abort", onAbort);
    r.cleanup(signal);
  }
}
