// The two ways a completion is answered: one JSON body, or an SSE stream of chunks
// (hono/streaming's streamSSE, which tells us when the client has gone). The body shapes are
// OpenAI's text_completion / chat.completion(.chunk) objects, with one choice per index (n, a
// completions batch); best_of keeps the n candidates with the highest cumulative log-probability.

import { ApiError, type TokenLogprobsEntry } from "@airm/internal-api";
import type { Context } from "hono";
import { streamSSE } from "hono/streaming";
import type { GatewayMetrics } from "../gateway-metrics.ts";
import { type ChoiceOutcome, collectChoices, type Outcome, type Run, type Timing } from "./completion.ts";
import { chatLogprobs, completionLogprobs, type ScoredToken } from "./logprobs.ts";
import { type AnswerPiece, ToolCallReader } from "./chat/tool-calls.ts";
import type { GenerationRequest } from "./request-common.ts";

export interface AnswerContext {
  kind: "completion" | "chat";
  /** The OpenAI object id: `cmpl-...` or `chatcmpl-...`. */
  id: string;
  created: number;
  req: GenerationRequest;
  /** One generation per prompt, in prompt order. */
  runs: Run[];
  timing: Timing;
  metrics: GatewayMetrics;
  /** Aborted when the SSE client leaves (its stream was cancelled). */
  clientGone: AbortController;
}

/** The run a choice index belongs to. */
function runOf(a: AnswerContext, index: number): Run {
  return a.runs[Math.floor(index / a.req.bestOf)];
}

/** The prompt an echo repeats: the client's own text, or the prompt tokens decoded when it sent ids. */
function echoText(a: AnswerContext, index: number): string {
  if (!a.req.echo) return "";
  const p = Math.floor(index / a.req.bestOf);
  const input = a.req.prompts[p];
  return "prompt" in input ? input.prompt : (a.runs[p].first.echo?.text ?? "");
}

/** Sum of a choice's log-probabilities (its end-of-sequence token, never reported, excluded). */
function cumulative(c: ChoiceOutcome): number {
  return c.logprobs.reduce((s, e) => s + e.logprob, 0);
}

/**
 * best_of: of each prompt's candidates, the n with the highest cumulative log-probability, best
 * first, indexed anew (prompt p's at p * n ...). Without best_of the choices as they are.
 */
function chosen(a: AnswerContext, out: Outcome): ChoiceOutcome[] {
  if (a.req.bestOf === a.req.n) return out.choices;
  return a.runs.flatMap((_, p) =>
    out.choices
      .filter((c) => Math.floor(c.index / a.req.bestOf) === p)
      .sort((x, y) => cumulative(y) - cumulative(x) || x.index - y.index)
      .slice(0, a.req.n)
      .map((c, i) => ({ ...c, index: p * a.req.n + i, origin: c.index })),
  );
}

/** The whole completion as one JSON body. */
export async function jsonAnswer(c: Context, a: AnswerContext): Promise<Response> {
  const out = await collectChoices({ runs: a.runs, req: a.req, timing: a.timing });
  a.timing.record(a.metrics, out);
  const asked = a.req.logprobs !== null;
  const choices = chosen(a, out).map((ch) => {
    if (a.kind === "chat") {
      const reader = new ToolCallReader(a.req.toolMode);
      reader.push(ch.text);
      const { finishReason } = reader.finish(ch.finishReason);
      const message: Record<string, unknown> = { role: "assistant", content: reader.messageContent() };
      if (reader.calls.length) message.tool_calls = reader.calls.map((t) => ({ id: t.id, type: "function", function: { name: t.name, arguments: t.arguments } }));
      return { index: ch.index, message, logprobs: asked ? chatLogprobs(ch.logprobs, a.req.tokensAsIds) : null, finish_reason: finishReason };
    }
    const origin = (ch as ChoiceOutcome & { origin?: number }).origin ?? ch.index;
    const echo = a.req.echo ? runOf(a, origin).first.echo : undefined;
    const scored: ScoredToken[] = [...(echo?.tokens ?? []), ...ch.logprobs];
    return {
      index: ch.index,
      text: echoText(a, origin) + ch.text,
      logprobs: asked ? completionLogprobs(scored, 0, a.req.tokensAsIds).logprobs : null,
      finish_reason: ch.finishReason,
    };
  });
  return c.json({ id: a.id, object: a.kind === "chat" ? "chat.completion" : "text_completion", created: a.created, model: a.req.model, choices, usage: out.usage });
}

/** Per choice of a streamed answer: its tool-call reader, completions' text offset, log-probabilities not sent yet. */
interface StreamChoice {
  reader: ToolCallReader;
  offset: number;
  carried: ScoredToken[];
}

/** The completion as SSE chunks, then `data: [DONE]`; a failure after the first byte is an error chunk. */
export function sseAnswer(c: Context, a: AnswerContext): Response {
  const object = a.kind === "chat" ? "chat.completion.chunk" : "text_completion";
  const base = { id: a.id, object, created: a.created, model: a.req.model };
  const asked = a.req.logprobs !== null;
  const count = a.runs.length * a.req.bestOf;
  const per: StreamChoice[] = Array.from({ length: count }, () => ({ reader: new ToolCallReader(a.req.toolMode), offset: 0, carried: [] }));
  const logprobsOf = (index: number, entries: ScoredToken[]) => {
    if (!asked || entries.length === 0) return null;
    if (a.kind === "chat") return chatLogprobs(entries as TokenLogprobsEntry[], a.req.tokensAsIds);
    // completions' text_offset runs over the whole answer text, echo included
    const r = completionLogprobs(entries, per[index].offset, a.req.tokensAsIds);
    per[index].offset = r.next;
    return r.logprobs;
  };
  const chunk = (index: number, delta: string | null, finish: string | null, entries: ScoredToken[]) => ({
    ...base,
    choices: [
      a.kind === "chat"
        ? { index, delta: finish && delta === null ? {} : { content: delta }, logprobs: logprobsOf(index, entries), finish_reason: finish }
        : { index, text: delta ?? "", logprobs: logprobsOf(index, entries), finish_reason: finish },
    ],
  });
  /** A chat piece (text, or a tool call's start or arguments) as a chunk. */
  const pieceChunk = (index: number, p: AnswerPiece, entries: ScoredToken[]) => {
    if ("content" in p) return chunk(index, p.content, null, entries);
    const call =
      "callStart" in p
        ? { index: p.callStart.index, id: p.callStart.id, type: "function", function: { name: p.callStart.name, arguments: "" } }
        : { index: p.callArgs.index, function: { arguments: p.callArgs.fragment } };
    return { ...base, choices: [{ index, delta: { tool_calls: [call] }, logprobs: logprobsOf(index, entries), finish_reason: null }] };
  };
  return streamSSE(c, async (s) => {
    const send = (obj: unknown) => s.writeSSE({ data: JSON.stringify(obj) });
    /** Sends the pieces a delta of choice `index` made; log-probabilities ride on the first chunk that goes out. */
    const sendPieces = async (index: number, pieces: AnswerPiece[], entries: ScoredToken[]) => {
      const st = per[index];
      st.carried = [...st.carried, ...entries];
      for (const p of pieces) {
        await send(pieceChunk(index, p, st.carried));
        st.carried = [];
      }
    };
    s.onAbort(() => {
      a.clientGone.abort();
      a.timing.endSpan("the client left before the end of the stream");
      for (const r of a.runs) void r.gen.return(undefined).catch(() => {});
    });
    try {
      const role = a.req.toolMode.kind === "none" ? { role: "assistant", content: "" } : { role: "assistant" };
      for (let index = 0; index < count; index++) {
        if (a.kind === "chat") await send({ ...base, choices: [{ index, delta: role, logprobs: null, finish_reason: null }] });
        const echo = a.kind === "completion" && a.req.echo ? runOf(a, index).first.echo : undefined;
        if (echo) await send(chunk(index, echoText(a, index), null, echo.tokens));
      }
      // A choice's first token is sent at once, even when its text is still "" (an incomplete
      // character), so that clients see the time to first token.
      const sentFirst = new Set<number>();
      const out = await collectChoices({
        runs: a.runs,
        req: a.req,
        timing: a.timing,
        onText: async (index, delta, logprobs) => {
          sentFirst.add(index);
          if (a.kind === "chat") await sendPieces(index, per[index].reader.push(delta), logprobs);
          else await send(chunk(index, delta, null, logprobs));
        },
        afterFirst: async (index) => {
          if (a.kind === "completion" && !sentFirst.has(index)) await send(chunk(index, "", null, []));
          sentFirst.add(index);
        },
      });
      for (const ch of out.choices) {
        if (a.kind === "chat") {
          const end = per[ch.index].reader.finish(ch.finishReason);
          await sendPieces(ch.index, end.pieces, []);
          await send(chunk(ch.index, null, end.finishReason, [...per[ch.index].carried, ...ch.unsent]));
        } else await send(chunk(ch.index, "", ch.finishReason, ch.unsent));
      }
      if (a.req.includeUsage) await send({ ...base, choices: [], usage: out.usage });
      await s.writeSSE({ data: "[DONE]" });
      a.timing.record(a.metrics, out);
    } catch (err) {
      const e = await streamFailed(a, s, err);
      if (e) {
        await send(e.body());
        await s.writeSSE({ data: "[DONE]" });
      }
    }
  });
}

/**
 * After a streamed answer failed: ends every generation and the request's span. Returns the error
 * the client is to see, or null when it has gone (nothing more is written then).
 */
export async function streamFailed(a: AnswerContext, s: { aborted: boolean }, err: unknown): Promise<ApiError | null> {
  for (const r of a.runs) await r.gen.return(undefined).catch(() => {});
  a.timing.endSpan((err as Error).message);
  if (s.aborted || a.clientGone.signal.aborted) return null;
  return err instanceof ApiError ? err : new ApiError(500, "internal_error", (err as Error).message);
}
