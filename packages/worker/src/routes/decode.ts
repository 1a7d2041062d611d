// POST /internal/decode (decode role): opens the request's lease, pulls and checks its KV (the
// pulls wait while prefill still pushes), imports it, and streams token events until done. The
// lease ends on every terminal event: done, error, the client leaving, a release from outside.

import { ApiError, DecodeRequestSchema, ROUTES } from "@airm/internal-api";
import { blobBytes, blockLayerBytes, KVIntegrityError, type KVManifest, type KVReservation, type PrefixHold } from "@airm/rm-core";
import { trace, type Span } from "@opentelemetry/api";
import type { Context, Hono } from "hono";
import type { z } from "zod";
import { checkResume, decodeChoices, isEos, planRequest, round } from "../generation.ts";
import { pullKV, type PulledKV } from "../kv-handoff.ts";
import type { LeaseEnd } from "../kv-leases.ts";
import { loraOf, manifestLora } from "../lora.ts";
import type { HandoffServing, WorkerRuntime } from "../runtime.ts";
import type { EngineStream, ServingEngine } from "../serving-engine.ts";
import { batchTrace, callerContext, eventStream, parseBody, tracer, type EventSink } from "./http.ts";
import { admitStage, failStage, finishStage, prepareStage } from "./stages.ts";

export function decodeRoutes(app: Hono, rt: WorkerRuntime): void {
  app.post(ROUTES.decode, async (c) => {
    const serving = rt.handoff();
    const b = await parseBody(c, DecodeRequestSchema);
    prepareStage(rt, "decode", serving.engine, b.sampling, b.n);
    loraOf(serving.engine, b.lora);
    // A constraint that cannot build is a 400 before the stream opens (it compiles during the KV wait).
    if (b.constraint) await rt.checkConstraint(b.constraint);
    const rid = b.requestId;
    const stopped = new AbortController();
    let endedFromOutside = false;
    // No TTL here: the KV wait has its own timeout, and a long generation must not be cut.
    const opened = rt.leases.open(
      rid,
      (reason) => {
        endedFromOutside = true;
        stopped.abort(new Error(`request ${rid} ended: ${reason}`));
      },
      false,
    );
    if (!opened) throw new ApiError(409, "duplicate_request", `request ${rid} is already in flight on this worker`, "requestId");
    const onClientGone = () => stopped.abort(new Error("the client disconnected"));
    c.req.raw.signal.addEventListener("abort", onClientGone, { once: true });
    // A draining worker's hand-back stops the request like a release, with its own error event.
    const onHandBack = () => stopped.abort(rt.handBack.signal.reason);
    rt.handBack.signal.addEventListener("abort", onHandBack, { once: true });
    const span = tracer.startSpan("worker.decode", { attributes: { "airm.request_id": rid, "airm.n": b.n, "airm.kv_transport": serving.transport.name } }, callerContext(c));
    return eventStream(
      c,
      async (sink) => {
        let reason: LeaseEnd = "done";
        try {
          reason = await serveDecode(rt, serving, b, c, sink, stopped.signal, span);
        } finally {
          c.req.raw.signal.removeEventListener("abort", onClientGone);
          rt.handBack.signal.removeEventListener("abort", onHandBack);
          // A lease ended from outside (release, TTL) has already released the blobs.
          if (!endedFromOutside) await rt.endLease(rid, reason);
          span.end();
        }
      },
      (e) => rt.log.error({ request_id: rid, err: e.message }, "decode stream failed"),
    );
  });
}

/**
 * The blocks this worker held for the request at its kv-hold, when the manifest says they did not
 * cross; they must be the ones the prefill side named (count and block hash), else
 * KVIntegrityError. A hold the manifest does not use is given back.
 */
function heldFor(rt: WorkerRuntime, rid: string, m: KVManifest): PrefixHold | undefined {
  const hold = rt.holds.take(rid);
  if (!m.held) {
    hold?.release();
    return undefined;
  }
  const bs = m.blockSize;
  if (!hold || hold.n !== m.held.blocks * bs || hold.hash !== m.held.hash) {
    hold?.release();
    const have = hold ? `${hold.n / bs} block(s) ending in ${hold.hash}` : "none";
    throw new KVIntegrityError("held", `the KV leaves out ${m.held.blocks} block(s) ending in ${m.held.hash} for this worker to supply; it holds ${have}`);
  }
  return hold;
}

/**
 * Imports the pulled KV as a stream, beside the blocks this worker held for the request (checked
 * against the manifest), with the prompt's token ids and cache_salt so the stream's blocks stay in
 * the prefix cache after it; counts the bytes that crossed and those held instead.
 */
function importStream(
  rt: WorkerRuntime,
  engine: ServingEngine,
  pulled: PulledKV,
  reservation: KVReservation,
  rid: string,
  b: Pick<DecodeBody, "cacheSalt" | "lora">,
): EngineStream {
  const m = pulled.manifest;
  const ids = m.promptTokens?.length === m.n ? { tokens: m.promptTokens } : {};
  const kept = heldFor(rt, rid, m);
  let stream: EngineStream;
  try {
    const named = { ...(b.cacheSalt === undefined ? {} : { cacheSalt: b.cacheSalt }), ...(b.lora === undefined ? {} : { lora: b.lora }) };
    stream = engine.importKV(pulled.kv, reservation, { ...ids, ...named, ...(kept ? { held: kept } : {}) });
  } finally {
    kept?.release();
  }
  if (m.held) rt.kvSkippedBytes += 2 * m.layers * m.held.blocks * blockLayerBytes(m, m.blockSize, m.dtype);
  for (let l = 0; l < m.layers; l++) rt.kvPulledBytes += 2 * blobBytes(m, l);
  rt.kvPulls++;
  return stream;
}

type DecodeBody = z.output<typeof DecodeRequestSchema>;

/** The request's KV, pulled and checked: the manifest against the request's resume and choices, and the plan it fits. */
interface ArrivedKV {
  pulled: PulledKV;
  resumed: number[];
  promptLen: number;
  /** What is left to generate, counting the resumed tokens, and the sequence length it needs. */
  maxTokens: number;
  seqLen: number;
  /** Each choice's first token (prefill drew them). */
  firsts: number[];
}

/**
 * Stage 1, receive: pulls the request's KV (each pull waits while prefill still pushes) and checks
 * it against the request: the resumed tokens the KV ends with, the choices, and that what is
 * left to generate fits max_model_len and the cache.
 */
async function receiveKV(rt: WorkerRuntime, s: HandoffServing, b: DecodeBody, c: Context, span: Span, stopped: AbortSignal): Promise<ArrivedKV> {
  const { engine, transport } = s;
  const rid = b.requestId;
  const pullSpan = tracer.startSpan("kv.pull", { attributes: { "airm.request_id": rid, "airm.kv_transport": transport.name } }, trace.setSpan(callerContext(c), span));
  const expect = { ...engine.kvCache(), lora: manifestLora(loraOf(engine, b.lora)) ?? null };
  const pulled = await raceAbort(pullKV(transport, rid, engine.model, expect, b.kvTimeoutMs ?? rt.kvTimeoutMs), stopped).finally(() => pullSpan.end());
  if (pulled.transfer) pullSpan.setAttributes({ "airm.kv_bytes": pulled.transfer.bytes, "airm.kv_moving_ms": round(pulled.transfer.movingMs) });
  const m = pulled.manifest;
  // A resumed request's KV ends with its delivered tokens: the prompt is what comes before them.
  const resumed = b.resume ?? [];
  const promptLen = m.n - resumed.length;
  const held = m.promptTokens?.slice(promptLen) ?? [];
  if (resumed.length && (promptLen < 1 || held.length !== resumed.length || held.some((t, i) => t !== resumed[i]))) {
    throw new KVIntegrityError("resume", `the KV's last ${resumed.length} positions do not hold the request's resume tokens`);
  }
  checkResume(engine, resumed, b.maxTokens);
  // The KV holds the prompt and the resumed tokens: what is left to generate must fit max_model_len and the cache.
  const plan = planRequest(engine, m.n, b.maxTokens === null ? null : b.maxTokens - resumed.length, b.n);
  const firsts = m.firstTokens ?? [m.firstToken as number];
  if (firsts.length !== b.n) throw new KVIntegrityError("firstTokens", `the KV manifest carries ${firsts.length} choice(s), the request asks for ${b.n}`);
  return { pulled, resumed, promptLen, maxTokens: plan.maxTokens + resumed.length, seqLen: plan.seqLen, firsts };
}

/**
 * Stage 3, import: the KV becomes the first choice's stream (beside the blocks this worker held),
 * the others fork from it, and the client hears `ready`.
 */
async function importKV(
  rt: WorkerRuntime,
  s: HandoffServing,
  b: DecodeBody,
  kv: ArrivedKV,
  reservation: KVReservation,
  streams: EngineStream[],
  sink: EventSink,
  span: Span,
  t0: number,
): Promise<void> {
  const { engine } = s;
  const { pulled, promptLen, resumed } = kv;
  const m = pulled.manifest;
  const rid = b.requestId;
  // Into the caller's list as each is made: whatever happens next, the caller releases them.
  streams.push(importStream(rt, engine, pulled, reservation, rid, b));
  for (let i = 1; i < b.n; i++) streams.push(engine.fork(streams[0]));
  const kvLoadMs = performance.now() - pulled.arrivedAt;
  if (pulled.transfer) rt.noteKvTransfer(pulled.transfer.bytes, pulled.transfer.movingMs, m.n);
  rt.metrics.kvLoadMs.observe(kvLoadMs);
  await sink.write({ type: "ready", promptTokens: promptLen, seqLen: kv.seqLen, kvLoadMs: round(kvLoadMs), kvWaitMs: round(pulled.arrivedAt - t0) });
  span.setAttributes({
    "airm.prompt_tokens": promptLen,
    "airm.resumed_tokens": resumed.length,
    "airm.kv_wait_ms": round(pulled.arrivedAt - t0),
    "airm.kv_load_ms": round(kvLoadMs),
    ...(pulled.transfer ? { "airm.kv_bytes": pulled.transfer.bytes } : {}),
  });
}

/**
 * Runs one decode request on an open stream through its stages (receive the KV, admit, import,
 * decode, finish); returns how its lease should end.
 */
async function serveDecode(rt: WorkerRuntime, s: HandoffServing, b: DecodeBody, c: Context, sink: EventSink, stopped: AbortSignal, span: Span): Promise<LeaseEnd> {
  const { engine } = s;
  const rid = b.requestId;
  const aborted = () => sink.gone || stopped.aborted;
  const streams: EngineStream[] = [];
  let freeSlot: (() => void) | undefined;
  const t0 = performance.now();
  // The grammar compiles while the KV is on its way; each choice's matcher then takes its first token.
  const openings = b.constraint ? Array.from({ length: b.n }, () => rt.matcher(b.constraint!, b.resume ?? [])) : [];
  for (const o of openings) o.catch(() => {});
  rt.kvWaiting++;
  let waiting = true;
  try {
    const kv = await receiveKV(rt, s, b, c, span, stopped);
    const m = kv.pulled.manifest;
    rt.kvWaiting--;
    waiting = false;
    // The pulled KV is this worker's own copy (pullKV): the transport's is freed now, before the
    // wait for blocks, whatever the producer's lease does meanwhile (the lease here stays open
    // until a terminal event).
    await s.transport.release(rid).catch((err) => rt.log.warn({ request_id: rid, err: (err as Error).message }, "early KV release failed"));
    // Stage 2, admit: once the KV's blocks (and the next position's, and a block per other
    // choice) are set aside; the n choices share the prompt's blocks.
    const admitted = await admitStage(rt, span, { positions: m.n + 1, extra: b.n - 1, signal: stopped, lora: b.lora });
    freeSlot = admitted.release;
    if (aborted()) return "client_gone";
    const matchers = await Promise.all(openings);
    matchers.forEach((matcher, i) => {
      if (!isEos(engine, kv.firsts[i])) matcher.advance(kv.firsts[i]);
    });
    await importKV(rt, s, b, kv, admitted.reservation, streams, sink, span, t0);
    // Stage 4, decode.
    const batches = batchTrace(span);
    const { finish, decodeMs } = await decodeChoices({
      engine,
      batcher: s.batcher,
      streams,
      firsts: kv.firsts,
      prompt: m.promptTokens?.slice(0, kv.promptLen) ?? [],
      positions: m.promptTokens ?? [],
      recompute: (stream, tokens) => rt.recompute(stream, tokens, stopped),
      resumed: kv.resumed,
      maxTokens: kv.maxTokens,
      sampling: b.sampling,
      logprobs: b.logprobs,
      matchers,
      ignoreEos: b.ignoreEos,
      minTokens: b.minTokens,
      write: sink.write,
      onBatch: batches.onBatch,
      onToken: rt.noteGenerated,
      aborted,
    });
    batches.finish();
    return finishStage(rt, "decode", span, sink, finish, decodeMs);
  } catch (err) {
    // Stopped from outside (the caller left, or a release ended the lease, e.g. its prefill
    // failed): nothing failed here, so it is not counted or logged as this worker's error (it was
    // counted as engine_error, a 500 that never happened).
    if (stopped.aborted && err === stopped.reason && !(err instanceof ApiError)) {
      rt.metrics.requests.inc({ route: "decode", outcome: "client_gone" });
      return "client_gone";
    }
    await failStage(rt, "decode", span, sink, err, rid);
    return aborted() || c.req.raw.signal.aborted ? "client_gone" : "decode_rejected";
  } finally {
    for (const o of openings) {
      void o.then(
        (m) => m.close(),
        () => {},
      );
    }
    if (waiting) rt.kvWaiting--;
    for (const st of streams) engine.release(st);
    freeSlot?.();
  }
}

/** Rejects with the signal's reason as soon as it aborts. */
function raceAbort<T>(p: Promise<T>, signal: AbortSignal): Promise<T> {
  if (signal.aborted) return Promise.reject(signal.reason);
  return new Promise<T>((resolve, reject) => {
    const onAbort = () => reject(signal.reason);
    signal.addEventListener("abort", onAbort, { once: true });
    p.then(resolve, reject).finally(() => signal.removeEventListener("abort", onAbort));
  });
}
