// POST /internal/generate (solo role): prefill and decode in one process with no transport, the
// reference PD must equal token for token. Answers the same event stream as decode, opened by a
// `first` event instead of `ready`.

import { GenerateRequestSchema, ROUTES, toApiError } from "@airm/internal-api";
import type { Hono } from "hono";
import { checkLogitBias, decodeLoop, firstToken, isEos, planRequest, prefillExtras, stepConstraint, tokenize } from "../generation.ts";
import type { WorkerRuntime } from "../runtime.ts";
import type { EngineStream } from "../serving-engine.ts";
import { callerContext, eventStream, parseBody, tracer } from "./http.ts";

export function generateRoutes(app: Hono, rt: WorkerRuntime): void {
  app.post(ROUTES.generate, async (c) => {
    const { engine, batcher } = rt.ready();
    const b = await parseBody(c, GenerateRequestSchema);
    rt.admit("generate");
    checkLogitBias(engine, b.sampling);
    const tokens = tokenize(engine, b.input);
    const { maxTokens, seqLen } = planRequest(engine, tokens.length, b.maxTokens, b.seqLen);
    // A bad constraint is a 400 before the stream opens.
    const matcher = b.constraint ? await rt.matcher(b.constraint, []) : undefined;
    const span = tracer.startSpan("worker.generate", { attributes: { "airm.request_id": b.requestId } }, callerContext(c));
    return eventStream(
      c,
      async (sink) => {
        let stream: EngineStream | undefined;
        let freeSlot: (() => void) | undefined;
        try {
          freeSlot = await rt.slots.acquire();
          const t0 = performance.now();
          const constraint = stepConstraint(engine, matcher, b.minTokens, () => 0);
          const res = await engine.prefill(tokens, { seqLen, sampling: b.sampling, keepStream: true, constraint, ...prefillExtras(b) });
          if (!isEos(engine, res.firstToken)) matcher?.advance(res.firstToken);
          stream = res.stream ?? engine.importKV(res.kv);
          const prefillMs = res.computeMs ?? performance.now() - t0;
          rt.notePrefill(tokens.length, res.cachedTokens ?? 0, prefillMs);
          await sink.write({ type: "first", ...firstToken(engine, res, { tokens, echo: b.echo }, seqLen, maxTokens, prefillMs) });
          const { finish, decodeMs } = await decodeLoop({
            engine,
            batcher,
            stream,
            first: res.firstToken,
            maxTokens,
            sampling: b.sampling,
            logprobs: b.logprobs,
            matcher,
            ignoreEos: b.ignoreEos,
            minTokens: b.minTokens,
            write: sink.write,
            aborted: () => sink.gone,
          });
          if (finish !== "aborted") rt.metrics.decodeMs.observe(decodeMs);
          rt.metrics.requests.inc({ route: "generate", outcome: finish === "aborted" ? "client_gone" : "ok" });
        } catch (err) {
          const e = toApiError(err);
          rt.log.warn({ code: e.code, err: e.message }, "generate failed");
          rt.metrics.requests.inc({ route: "generate", outcome: e.code });
          await sink.write({ type: "error", status: e.status, code: e.code, param: e.param, message: e.message });
        } finally {
          matcher?.close();
          if (stream) engine.release(stream);
          freeSlot?.();
          span.end();
        }
      },
      (e) => rt.log.error({ err: e.message }, "generate stream failed"),
    );
  });
}
