// POST /internal/generate (solo role): prefill and decode in one process with no transport, the
// reference PD must equal token for token. Answers the same event stream as decode, opened by a
// `first` event instead of `ready`.

import { GenerateRequestSchema, ROUTES } from "@airm/internal-api";
import type { Hono } from "hono";
import { decodeChoices, firstToken, firstTokens, isEos, prefillExtras, resumedPlan, round, stepConstraint, tokenize } from "../generation.ts";
import { loraOf } from "../lora.ts";
import type { WorkerRuntime } from "../runtime.ts";
import type { EngineStream } from "../serving-engine.ts";
import { batchTrace, callerContext, eventStream, parseBody, tracer } from "./http.ts";
import { admitStage, failStage, finishStage, prepareStage } from "./stages.ts";

export function generateRoutes(app: Hono, rt: WorkerRuntime): void {
  app.post(ROUTES.generate, async (c) => {
    const { engine, batcher } = rt.ready();
    const b = await parseBody(c, GenerateRequestSchema);
    prepareStage(rt, "generate", engine, b.sampling, b.n);
    const prompt = tokenize(engine, b.input);
    loraOf(engine, b.lora);
    const { resumed, tokens, maxTokens, seqLen } = resumedPlan(engine, prompt, b);
    // A bad constraint is a 400 before the stream opens; a resumed request's matcher replays its delivered tokens.
    const matchers = b.constraint ? await Promise.all(Array.from({ length: b.n }, () => rt.matcher(b.constraint!, resumed))) : [];
    const span = tracer.startSpan("worker.generate", { attributes: { "airm.request_id": b.requestId, "airm.n": b.n, "airm.prompt_tokens": tokens.length } }, callerContext(c));
    return eventStream(
      c,
      async (sink) => {
        const streams: EngineStream[] = [];
        let freeSlot: (() => void) | undefined;
        const stopped = new AbortController();
        const onHandBack = () => stopped.abort(rt.handBack.signal.reason);
        rt.handBack.signal.addEventListener("abort", onHandBack, { once: true });
        try {
          // Admitted once the prompt's blocks (and the next position's, and a block per other
          // choice) are set aside; one prefill, then a stream per choice sharing the prompt's blocks.
          const admitted = await admitStage(rt, span, { positions: tokens.length + 1, extra: b.n - 1, signal: stopped.signal, lora: b.lora });
          freeSlot = admitted.release;
          const t0 = performance.now();
          const constraint = stepConstraint(engine, matchers[0], b.minTokens, () => resumed.length);
          const res = await engine.prefill(tokens, {
            reservation: admitted.reservation,
            sampling: b.sampling,
            keepStream: true,
            constraint,
            choices: b.n,
            completionTokens: resumed.length,
            ...prefillExtras(b),
          });
          const firsts = firstTokens(res);
          matchers.forEach((m, i) => {
            if (!isEos(engine, firsts[i])) m.advance(firsts[i]);
          });
          streams.push(res.stream!);
          for (let i = 1; i < b.n; i++) streams.push(engine.fork(streams[0]));
          const prefillMs = res.computeMs ?? performance.now() - t0;
          rt.notePrefill(tokens.length, res.cachedTokens ?? 0, prefillMs, firsts.length);
          span.setAttributes({ "airm.prefill_ms": round(prefillMs), "airm.cached_tokens": res.cachedTokens ?? 0 });
          const batches = batchTrace(span);
          await sink.write({ type: "first", ...firstToken(engine, res, { tokens: prompt, echo: b.echo }, seqLen, maxTokens, prefillMs, resumed) });
          const { finish, decodeMs } = await decodeChoices({
            engine,
            batcher,
            streams,
            firsts,
            prompt,
            positions: tokens,
            recompute: (stream, ids) => rt.recompute(stream, ids, stopped.signal),
            resumed,
            maxTokens,
            sampling: b.sampling,
            logprobs: b.logprobs,
            matchers,
            ignoreEos: b.ignoreEos,
            minTokens: b.minTokens,
            write: sink.write,
            onBatch: batches.onBatch,
            onToken: rt.noteGenerated,
            aborted: () => sink.gone || rt.handBack.signal.aborted,
          });
          batches.finish();
          finishStage(rt, "generate", span, sink, finish, decodeMs);
        } catch (err) {
          await failStage(rt, "generate", span, sink, err, b.requestId);
        } finally {
          for (const m of matchers) m.close();
          for (const st of streams) engine.release(st);
          freeSlot?.();
          rt.handBack.signal.removeEventListener("abort", onHandBack);
          span.end();
        }
      },
      (e) => rt.log.error({ err: e.message }, "generate stream failed"),
    );
  });
}
