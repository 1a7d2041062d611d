// The two ways a completion is answered: one JSON body, or an SSE stream of chunks
// (hono/streaming's streamSSE, which tells us when the client has gone). The body shapes are
// OpenAI's text_completion / chat.completion(.chunk) objects.

import { ApiError, type FirstToken, type TokenLogprobsEntry } from "@airm/internal-api";
import type { Context } from "hono";
import { streamSSE } from "hono/streaming";
import type { GatewayMetrics } from "../gateway-metrics.ts";
import type { GenEvent } from "../orchestrator/index.ts";
import { collectCompletion, type Timing } from "./completion.ts";
import { chatLogprobs, completionLogprobs, type ScoredToken } from "./logprobs.ts";
import type { GenerationRequest } from "./parse.ts";
import { type AnswerPiece, ToolCallReader } from "./tool-calls.ts";

export interface AnswerContext {
  kind: "completion" | "chat";
  /** The OpenAI object id: `cmpl-...` or `chatcmpl-...`. */
  id: string;
  created: number;
  req: GenerationRequest;
  gen: AsyncGenerator<GenEvent>;
  first: FirstToken;
  timing: Timing;
  metrics: GatewayMetrics;
  /** Aborted when the SSE client leaves (its stream was cancelled). */
  clientGone: AbortController;
}

/** The prompt an echo repeats: the client's own text, or the prompt tokens decoded when it sent ids. */
function echoText(a: AnswerContext): string {
  if (!a.req.echo) return "";
  return "prompt" in a.req.input ? a.req.input.prompt : (a.first.echo?.text ?? "");
}

/** The whole completion as one JSON body. */
export async function jsonAnswer(c: Context, a: AnswerContext): Promise<Response> {
  let out: Awaited<ReturnType<typeof collectCompletion>>;
  try {
    out = await collectCompletion({ gen: a.gen, first: a.first, req: a.req, timing: a.timing, onText: () => {} });
  } catch (err) {
    await a.gen.return(undefined).catch(() => {});
    throw err;
  }
  a.timing.record(a.metrics, out);
  const asked = a.req.logprobs !== null;
  let choice: Record<string, unknown>;
  if (a.kind === "chat") {
    const reader = new ToolCallReader(a.req.toolMode);
    reader.push(out.text);
    const { finishReason } = reader.finish(out.finishReason);
    const message: Record<string, unknown> = { role: "assistant", content: reader.messageContent() };
    if (reader.calls.length) message.tool_calls = reader.calls.map((c) => ({ id: c.id, type: "function", function: { name: c.name, arguments: c.arguments } }));
    choice = { index: 0, message, logprobs: asked ? chatLogprobs(out.logprobs) : null, finish_reason: finishReason };
  } else {
    const echo = a.req.echo ? a.first.echo : undefined;
    const scored: ScoredToken[] = [...(echo?.tokens ?? []), ...out.logprobs];
    choice = { index: 0, text: echoText(a) + out.text, logprobs: asked ? completionLogprobs(scored, 0).logprobs : null, finish_reason: out.finishReason };
  }
  return c.json({ id: a.id, object: a.kind === "chat" ? "chat.completion" : "text_completion", created: a.created, model: a.req.model, choices: [choice], usage: out.usage });
}

/** The completion as SSE chunks, then `data: [DONE]`; a failure after the first byte is an error chunk. */
export function sseAnswer(c: Context, a: AnswerContext): Response {
  const object = a.kind === "chat" ? "chat.completion.chunk" : "text_completion";
  const base = { id: a.id, object, created: a.created, model: a.req.model };
  const asked = a.req.logprobs !== null;
  // completions' text_offset runs over the whole answer text, echo included
  let offset = 0;
  const logprobsOf = (entries: ScoredToken[]) => {
    if (!asked || entries.length === 0) return null;
    if (a.kind === "chat") return chatLogprobs(entries as TokenLogprobsEntry[]);
    const r = completionLogprobs(entries, offset);
    offset = r.next;
    return r.logprobs;
  };
  const chunk = (delta: string | null, finish: string | null, entries: ScoredToken[]) => ({
    ...base,
    choices: [
      a.kind === "chat"
        ? { index: 0, delta: finish && delta === null ? {} : { content: delta }, logprobs: logprobsOf(entries), finish_reason: finish }
        : { index: 0, text: delta ?? "", logprobs: logprobsOf(entries), finish_reason: finish },
    ],
  });
  /** A chat piece (text, or a tool call's start or arguments) as a chunk. */
  const pieceChunk = (p: AnswerPiece, entries: ScoredToken[]) => {
    if ("content" in p) return chunk(p.content, null, entries);
    const call =
      "callStart" in p
        ? { index: p.callStart.index, id: p.callStart.id, type: "function", function: { name: p.callStart.name, arguments: "" } }
        : { index: p.callArgs.index, function: { arguments: p.callArgs.fragment } };
    return { ...base, choices: [{ index: 0, delta: { tool_calls: [call] }, logprobs: logprobsOf(entries), finish_reason: null }] };
  };
  return streamSSE(c, async (s) => {
    const send = (obj: unknown) => s.writeSSE({ data: JSON.stringify(obj) });
    // Chat answers go through the tool-call reader: text, and calls as OpenAI's tool_calls deltas.
    const reader = new ToolCallReader(a.req.toolMode);
    let carried: ScoredToken[] = [];
    /** Sends the pieces a delta made; log-probabilities ride on the first chunk that goes out. */
    const sendPieces = async (pieces: AnswerPiece[], entries: ScoredToken[]) => {
      carried = [...carried, ...entries];
      for (const p of pieces) {
        await send(pieceChunk(p, carried));
        carried = [];
      }
    };
    s.onAbort(() => {
      a.clientGone.abort();
      void a.gen.return(undefined).catch(() => {});
    });
    try {
      const role = a.req.toolMode.kind === "none" ? { role: "assistant", content: "" } : { role: "assistant" };
      if (a.kind === "chat") await send({ ...base, choices: [{ index: 0, delta: role, logprobs: null, finish_reason: null }] });
      const echo = a.kind === "completion" && a.req.echo ? a.first.echo : undefined;
      if (echo) await send(chunk(echoText(a), null, echo.tokens));
      // The first token is sent at once, even when its text is still "" (an incomplete character),
      // so that clients see the time to first token.
      let sentFirst = a.kind === "chat";
      const out = await collectCompletion({
        gen: a.gen,
        first: a.first,
        req: a.req,
        timing: a.timing,
        onText: async (delta, logprobs) => {
          sentFirst = true;
          if (a.kind === "chat") await sendPieces(reader.push(delta), logprobs);
          else await send(chunk(delta, null, logprobs));
        },
        afterFirst: async () => {
          if (!sentFirst) await send(chunk("", null, []));
          sentFirst = true;
        },
      });
      if (a.kind === "chat") {
        const end = reader.finish(out.finishReason);
        await sendPieces(end.pieces, []);
        await send(chunk(null, end.finishReason, [...carried, ...out.unsent]));
      } else await send(chunk("", out.finishReason, out.unsent));
      if (a.req.includeUsage) await send({ ...base, choices: [], usage: out.usage });
      await s.writeSSE({ data: "[DONE]" });
      a.timing.record(a.metrics, out);
    } catch (err) {
      await a.gen.return(undefined).catch(() => {});
      if (!s.aborted && !a.clientGone.signal.aborted) {
        const e = err instanceof ApiError ? err : new ApiError(500, "internal_error", (err as Error).message);
        await send(e.body());
        await s.writeSSE({ data: "[DONE]" });
      }
    }
  });
}
