// POST /internal/prefill (prefill role): tokenizes, opens the request's KV lease, prefills while
// pushing each layer's K and V as it is computed, pushes the manifest, and answers the first
// token. Any failure releases the request's blobs before the error answer.

import { ApiError, PrefillRequestSchema, ROUTES, type PrefillResponse } from "@airm/internal-api";
import { blockHashes, blockHashRoot, type KVManifest, type LoraInfo } from "@airm/rm-core";
import type { GrammarMatcher } from "@airm/grammar";
import { SpanStatusCode, trace, type Span } from "@opentelemetry/api";
import type { Context, Hono } from "hono";
import type { z } from "zod";
import { firstToken, firstTokens, prefillExtras, resumedPlan, round, stepConstraint, tokenize, type ResumedPlan } from "../generation.ts";
import { KVPusher, pushShape, pushedBytes } from "../kv-handoff.ts";
import type { LeaseEnd } from "../kv-leases.ts";
import { loraOf, manifestLora, requestSalt } from "../lora.ts";
import type { WorkerRuntime } from "../runtime.ts";
import type { ServingEngine } from "../serving-engine.ts";
import { callerContext, parseBody, tracer } from "./http.ts";
import { admitStage, prepareStage } from "./stages.ts";

export function prefillRoutes(app: Hono, rt: WorkerRuntime): void {
  app.post(ROUTES.prefill, async (c) => {
    const span = tracer.startSpan("worker.prefill", {}, callerContext(c));
    try {
      const { engine } = rt.ready();
      const b = await parseBody(c, PrefillRequestSchema);
      prepareStage(rt, "prefill", engine, b.sampling);
      const prompt = tokenize(engine, b.input);
      const plan = resumedPlan(engine, prompt, b);
      const rid = b.requestId;
      span.setAttributes({ "airm.request_id": rid, "airm.n": b.n, "airm.prompt_tokens": plan.tokens.length, "airm.resumed_tokens": plan.resumed.length });
      // The grammar is compiled (or found cached) before the request takes a slot or a lease; a
      // resumed request's matcher replays its delivered tokens.
      const matcher = b.constraint ? await rt.matcher(b.constraint, plan.resumed) : undefined;
      try {
        return await prefillWith(c, rt, b, plan, matcher, span);
      } finally {
        matcher?.close();
      }
    } catch (err) {
      span.setStatus({ code: SpanStatusCode.ERROR, message: (err as Error).message });
      throw err;
    } finally {
      span.end();
    }
  });
}

/**
 * The blocks the decode worker said it holds (the request's `skip`), once this side's block hash
 * of the prompt names the same last block: they need not cross. Throws 409 kv_mismatch when the
 * names differ (the two workers tokenized or salted the prompt differently), 400 when the skip
 * leaves no position to send or the model keeps sliding-window layers apart.
 */
function checkSkip(engine: ServingEngine, tokens: number[], b: z.output<typeof PrefillRequestSchema>, lora: LoraInfo | null): KVManifest["held"] | undefined {
  if (!b.skip) return undefined;
  const bs = engine.kvCache().blockSize;
  if (b.skip.blocks * bs >= tokens.length) {
    throw new ApiError(400, "invalid_request", `skip.blocks=${b.skip.blocks} (x ${bs} positions) leaves none of the ${tokens.length} prompt positions to send`, "skip.blocks");
  }
  if (engine.model.slidingWindow) throw new ApiError(400, "invalid_request", "skip cannot go with a model whose sliding-window layers keep their own blocks", "skip");
  const root = blockHashRoot(
    { modelFingerprint: engine.model.modelFingerprint, numericsFingerprint: engine.model.numericsFingerprint, blockSize: bs },
    requestSalt(b.cacheSalt, lora),
  );
  const mine = blockHashes(root, tokens, bs, b.skip.blocks);
  if (mine[mine.length - 1] !== b.skip.hash) {
    throw new ApiError(
      409,
      "kv_mismatch",
      `the decode worker holds ${b.skip.blocks} block(s) ending in ${b.skip.hash}; this prompt's block ${b.skip.blocks - 1} hashes to ${mine[mine.length - 1]}`,
      "skip.hash",
    );
  }
  return { blocks: b.skip.blocks, hash: b.skip.hash };
}

/** Prefills under the request's lease and slot, pushing the KV; answers the first token. */
async function prefillWith(
  c: Context,
  rt: WorkerRuntime,
  b: z.output<typeof PrefillRequestSchema>,
  plan: ResumedPlan,
  matcher: GrammarMatcher | undefined,
  span: Span,
): Promise<Response> {
  const { engine, transport } = rt.handoff();
  const { prompt, resumed, tokens, maxTokens, seqLen } = plan;
  const lora = loraOf(engine, b.lora);
  const rid = b.requestId;
  // A release (the client left, its deadline passed) or the TTL can end the lease while prefill
  // still computes: pushes stop, and what was pushed after the release is released again below.
  let endedAs: LeaseEnd | null = null;
  // The TTL starts once the blobs are pushed (they wait for the decode from then on).
  if (!rt.leases.open(rid, (reason) => (endedAs = reason), false)) throw new ApiError(409, "duplicate_request", `request ${rid} is already in flight on this worker`, "requestId");
  let freeSlot: (() => void) | undefined;
  try {
    // Admitted once the prompt's KV blocks are set aside (they are free again once it is pushed).
    const admitted = await admitStage(rt, span, { positions: tokens.length, lora: b.lora });
    freeSlot = admitted.release;
    const shape = pushShape(engine.model, tokens.length, engine.kvCache().blockSize, checkSkip(engine, tokens, b, lora));
    const pusher = new KVPusher(transport, rid, rt.kvTimeoutMs, () => endedAs !== null, shape);
    const t0 = performance.now();
    const constraint = stepConstraint(engine, matcher, b.minTokens, () => resumed.length);
    const res = await engine.prefill(tokens, {
      reservation: admitted.reservation,
      sampling: b.sampling,
      onLayer: pusher.onLayer,
      constraint,
      choices: b.n,
      completionTokens: resumed.length,
      ...prefillExtras(b),
    });
    const computed = performance.now();
    freeSlot();
    const kv = res.kv!;
    const kvBytes = pushedBytes(shape, engine.model.layers);
    const pushSpan = tracer.startSpan(
      "kv.push",
      { attributes: { "airm.request_id": rid, "airm.kv_transport": transport.name, "airm.kv_bytes": kvBytes } },
      trace.setSpan(callerContext(c), span),
    );
    await pusher.finish(engine.model, kv, firstTokens(res), tokens, manifestLora(lora)).finally(() => pushSpan.end());
    rt.leases.arm(rid);
    rt.metrics.kvPushedBytes.inc(kvBytes);
    const pushMs = performance.now() - computed;
    const prefillMs = res.computeMs ?? computed - t0;
    rt.notePrefill(tokens.length, res.cachedTokens ?? 0, prefillMs, firstTokens(res).length);
    rt.metrics.kvPushMs.observe(pushMs);
    rt.metrics.requests.inc({ route: "prefill", outcome: "ok" });
    const answer: PrefillResponse = {
      requestId: rid,
      first: firstToken(engine, res, { tokens: prompt, echo: b.echo }, seqLen, maxTokens, prefillMs, resumed),
      transport: transport.name,
      kvPushMs: round(pushMs),
      kvBytes,
    };
    span.setAttributes({
      "airm.prefill_ms": round(prefillMs),
      "airm.cached_tokens": res.cachedTokens ?? 0,
      "airm.kv_transport": transport.name,
      "airm.kv_bytes": kvBytes,
      "airm.kv_push_ms": round(pushMs),
    });
    return c.json(answer);
  } catch (err) {
    freeSlot?.();
    if (endedAs !== null) {
      // Ended from outside: its earlier blobs went with the lease; drop any pushed after it.
      await transport.release(rid).catch(() => {});
      rt.metrics.requests.inc({ route: "prefill", outcome: endedAs });
      throw new ApiError(409, "request_ended", `request ${rid} ended (${endedAs}) while it was being prefilled`, "requestId");
    }
    rt.metrics.requests.inc({ route: "prefill", outcome: "error" });
    await rt.endLease(rid, "prefill_failed");
    throw err;
  }
}
