// The OpenAI Responses API (POST /v1/responses), stateless: a request is turned into the chat
// request it means (instructions and input items as messages, function tools, text.format as a
// response format) and runs as one; its answer comes back as a Response object, or as the
// documented event stream (response.created ... response.completed) that the official client's
// responses.create and responses.stream read. Nothing is stored: previous_response_id and
// store: true are refused by name.

import { randomBytes } from "node:crypto";
import { ApiError } from "@airm/internal-api";
import type { Context } from "hono";
import { streamSSE } from "hono/streaming";
import { z } from "zod";
import { type AnswerContext, streamFailed } from "../answers.ts";
import { type AnswerPiece, type ToolCall, ToolCallReader } from "../chat/tool-calls.ts";
import { collectChoices, type Outcome } from "../completion.ts";
import { parseGenerationRequest } from "../parse.ts";
import type { GenerationRequest, ParseOptions } from "../request-common.ts";

const hex = (n: number) => randomBytes(n).toString("hex");

/** Fields of the Responses API that change what is generated or kept, refused unless neutral. */
const REFUSED: Record<string, [string, (v: unknown) => boolean]> = {
  previous_response_id: ["previous_response_id (no state is kept: send the conversation in input)", () => false],
  store: ["store: true (no state is kept)", (v) => v === false],
  background: ["background responses", (v) => v === false],
  conversation: ["conversations (no state is kept)", () => false],
  prompt: ["stored prompts", () => false],
  include: ["include (no extra outputs: logprobs, reasoning, search results)", (v) => Array.isArray(v) && v.length === 0],
  reasoning: ["reasoning (no reasoning model)", () => false],
  truncation: ["truncation other than disabled", (v) => v === "disabled"],
  top_logprobs: ["top_logprobs on responses", (v) => v === 0],
  service_tier: ["service tiers other than auto/default", (v) => v === "auto" || v === "default"],
  context_management: ["context management", () => false],
  moderation: ["moderation", () => false],
  prompt_cache_options: ["prompt cache options", () => false],
  prompt_cache_retention: ["prompt cache retention", () => false],
};

const textPart = z.object({ type: z.enum(["input_text", "output_text"]), text: z.string() }).loose();
const inputItem = z.union([
  z
    .object({
      type: z.literal("message").optional(),
      role: z.enum(["user", "assistant", "system", "developer"]),
      content: z.union([z.string(), z.array(textPart)]),
      id: z.string().optional(),
      status: z.string().optional(),
      phase: z.string().nullish(),
    })
    .strict(),
  z.object({ type: z.literal("function_call"), call_id: z.string(), name: z.string(), arguments: z.string(), id: z.string().optional(), status: z.string().optional() }).loose(),
  z
    .object({
      type: z.literal("function_call_output"),
      call_id: z.string(),
      output: z.union([z.string(), z.array(textPart)]),
      id: z.string().nullish(),
      status: z.string().nullish(),
    })
    .loose(),
]);

const functionTool = z
  .object({
    type: z.literal("function"),
    name: z.string(),
    parameters: z.record(z.string(), z.unknown()).nullish(),
    strict: z.boolean().nullish(),
    description: z.string().nullish(),
  })
  .strict();

const responsesSchema = z
  .object({
    model: z.string().min(1).nullish(),
    input: z.union([z.string().min(1), z.array(inputItem).min(1)]),
    instructions: z.string().nullish(),
    max_output_tokens: z.number().int().nullish(),
    temperature: z.number().nullish(),
    top_p: z.number().nullish(),
    text: z
      .object({ format: z.record(z.string(), z.unknown()).nullish(), verbosity: z.null().optional() })
      .strict()
      .nullish(),
    tools: z.array(functionTool).nullish(),
    tool_choice: z.union([z.enum(["none", "auto", "required"]), z.object({ type: z.literal("function"), name: z.string() }).strict()]).nullish(),
    parallel_tool_calls: z.boolean().nullish(),
    stream: z.boolean().nullish(),
    stream_options: z.object({ include_obfuscation: z.boolean().nullish() }).strict().nullish(),
    metadata: z.record(z.string(), z.string()).nullish(),
    user: z.string().nullish(),
    safety_identifier: z.string().nullish(),
    prompt_cache_key: z.string().nullish(),
  })
  .strict();
type ResponsesBody = z.infer<typeof responsesSchema>;

/** A Responses request as the chat request it means, and what its Response echoes. */
export interface ResponsesRequest {
  req: GenerationRequest;
  body: ResponsesBody;
}

/** The Responses field a chat-level error points at. */
function renamed(param: string | null): string | null {
  if (!param) return param;
  return param
    .replace(/^tools\[(\d+)\]\.function\./, "tools[$1].")
    .replace(/^response_format\.json_schema\./, "text.format.")
    .replace(/^response_format/, "text.format")
    .replace(/^max_completion_tokens/, "max_output_tokens")
    .replace(/^messages/, "input");
}

/** Input items as chat messages (function calls as assistant tool calls, their outputs as tool turns). */
function messagesOf(b: ResponsesBody): Record<string, unknown>[] {
  const text = (c: string | z.infer<typeof textPart>[]) => (typeof c === "string" ? c : c.map((p) => p.text).join(""));
  const out: Record<string, unknown>[] = [];
  if (b.instructions) out.push({ role: "system", content: b.instructions });
  if (typeof b.input === "string") return [...out, { role: "user", content: b.input }];
  for (const item of b.input) {
    if (item.type === "function_call") {
      const call = { id: item.call_id, type: "function", function: { name: item.name, arguments: item.arguments } };
      const last = out.at(-1);
      if (last?.role === "assistant" && Array.isArray(last.tool_calls)) (last.tool_calls as unknown[]).push(call);
      else out.push({ role: "assistant", content: null, tool_calls: [call] });
    } else if (item.type === "function_call_output") out.push({ role: "tool", tool_call_id: item.call_id, content: text(item.output) });
    else out.push({ role: item.role, content: text(item.content) });
  }
  return out;
}

/** Checks a Responses body and turns it into a chat request. Throws ApiError 400 naming the field (Responses names). */
export function parseResponsesRequest(body: unknown, o: ParseOptions): ResponsesRequest {
  if (typeof body !== "object" || body === null || Array.isArray(body)) throw new ApiError(400, "invalid_request", "the request body must be a JSON object");
  const rest: Record<string, unknown> = {};
  const ignored: string[] = [];
  for (const [k, v] of Object.entries(body)) {
    const refused = REFUSED[k];
    if (refused) {
      if (v != null && !refused[1](v)) throw new ApiError(400, "unsupported_parameter", `${refused[0]} is not supported by this server`, k);
    } else if (k in responsesSchema.shape) rest[k] = v;
    else ignored.push(k); // a field the API does not define: ignored, as vLLM does (the route logs it)
  }
  const r = responsesSchema.safeParse(rest);
  if (!r.success) {
    const issue = r.error.issues[0];
    const param = issue.path.reduce<string>((p, k) => (typeof k === "number" ? `${p}[${k}]` : p ? `${p}.${String(k)}` : String(k)), "");
    const what = issue.code === "unrecognized_keys" ? `unrecognized field(s) ${issue.keys.join(", ")}` : issue.message;
    throw new ApiError(400, "invalid_request", `invalid '${param || "body"}': ${what}`, param || null);
  }
  const b = r.data;
  const format = b.text?.format;
  const chat: Record<string, unknown> = {
    model: b.model,
    messages: messagesOf(b),
    max_completion_tokens: b.max_output_tokens,
    temperature: b.temperature,
    top_p: b.top_p,
    stream: b.stream,
    parallel_tool_calls: b.parallel_tool_calls,
    ...(format ? { response_format: format.type === "json_schema" ? { type: "json_schema", json_schema: { ...format, type: undefined } } : format } : {}),
    ...(b.tools?.length ? { tools: b.tools.map(({ type: _t, ...f }) => ({ type: "function", function: f })) } : {}),
    ...(b.tool_choice ? { tool_choice: typeof b.tool_choice === "string" ? b.tool_choice : { type: "function", function: { name: b.tool_choice.name } } } : {}),
  };
  const clean = Object.fromEntries(Object.entries(chat).filter(([, v]) => v !== undefined && v !== null));
  if (clean.response_format && typeof clean.response_format === "object" && "json_schema" in clean.response_format) {
    const js = (clean.response_format as { json_schema: Record<string, unknown> }).json_schema;
    delete js.type;
  }
  try {
    const req = parseGenerationRequest("chat", clean, o);
    return { req: { ...req, ignored: [...req.ignored, ...ignored] }, body: b };
  } catch (e) {
    if (e instanceof ApiError)
      throw new ApiError(
        e.status,
        e.code,
        e.message.replace(/'?(response_format|max_completion_tokens|messages)\b/g, (m) => renamed(m) ?? m),
        renamed(e.param),
      );
    throw e;
  }
}

/** One output item as it is built (a message's text, or a function call). */
type Item = { kind: "message"; id: string; text: string } | { kind: "call"; id: string; call: ToolCall };

function itemJson(item: Item, status: "in_progress" | "completed" | "incomplete"): Record<string, unknown> {
  if (item.kind === "message") {
    return { id: item.id, type: "message", role: "assistant", status, content: status === "in_progress" ? [] : [{ type: "output_text", text: item.text, annotations: [] }] };
  }
  return { id: item.id, type: "function_call", call_id: item.call.id, name: item.call.name, arguments: status === "in_progress" ? "" : item.call.arguments, status };
}

/** The Response object of a request, with its output items and (when done) usage. */
function responseJson(a: AnswerContext, b: ResponsesBody, items: Item[], end: { out: Outcome; finish: string } | null): Record<string, unknown> {
  const incomplete = end?.finish === "length";
  const status = end === null ? "in_progress" : incomplete ? "incomplete" : "completed";
  const u = end?.out.usage;
  return {
    id: a.id,
    object: "response",
    created_at: a.created,
    status,
    model: a.req.model,
    output: items.map((i) => itemJson(i, end === null ? "in_progress" : incomplete ? "incomplete" : "completed")),
    error: null,
    incomplete_details: incomplete ? { reason: "max_output_tokens" } : null,
    instructions: b.instructions ?? null,
    metadata: b.metadata ?? null,
    max_output_tokens: b.max_output_tokens ?? null,
    parallel_tool_calls: b.parallel_tool_calls ?? true,
    // what the request ran with: its own values, else the model's defaults, else 1
    temperature: a.req.sampling.temperature ?? 1,
    top_p: a.req.sampling.topP ?? 1,
    tool_choice: b.tool_choice ?? (b.tools?.length ? "auto" : "none"),
    tools: b.tools ?? [],
    text: { format: b.text?.format ?? { type: "text" } },
    truncation: "disabled",
    store: false,
    ...(b.user ? { user: b.user } : {}),
    usage: u
      ? {
          input_tokens: u.prompt_tokens,
          input_tokens_details: { cached_tokens: u.prompt_tokens_details.cached_tokens, cache_write_tokens: 0 },
          output_tokens: u.completion_tokens,
          output_tokens_details: { reasoning_tokens: 0 },
          total_tokens: u.total_tokens,
        }
      : null,
  };
}

/** The items of a finished answer: its text as a message (when there is any), then its calls. */
function itemsOf(text: string, reader: ToolCallReader): Item[] {
  const items: Item[] = [];
  const content = reader.messageContent();
  if (content) items.push({ kind: "message", id: `msg_${hex(16)}`, text: content });
  for (const call of reader.calls) items.push({ kind: "call", id: `fc_${hex(16)}`, call });
  return text === "" && items.length === 0 ? [{ kind: "message", id: `msg_${hex(16)}`, text: "" }] : items;
}

/** The whole Response as one JSON body. */
export async function responsesJson(c: Context, a: AnswerContext, b: ResponsesBody): Promise<Response> {
  const out = await collectChoices({ runs: a.runs, req: a.req, timing: a.timing });
  a.timing.record(a.metrics, out);
  const ch = out.choices[0];
  const reader = new ToolCallReader(a.req.toolMode, () => `call_${hex(12)}`);
  reader.push(ch.text);
  const { finishReason } = reader.finish(ch.finishReason);
  return c.json(responseJson(a, b, itemsOf(ch.text, reader), { out, finish: finishReason }));
}

/** The Response as the documented event stream; a failure after the first event is response.failed. */
export function responsesSse(c: Context, a: AnswerContext, b: ResponsesBody): Response {
  return streamSSE(c, async (s) => {
    let seq = 0;
    const send = (type: string, data: Record<string, unknown>) => s.writeSSE({ event: type, data: JSON.stringify({ type, sequence_number: seq++, ...data }) });
    s.onAbort(() => {
      a.clientGone.abort();
      a.timing.endSpan("the client left before the end of the stream");
      for (const r of a.runs) void r.gen.return(undefined).catch(() => {});
    });
    const items: Item[] = [];
    let open: Item | null = null;
    const reader = new ToolCallReader(a.req.toolMode, () => `call_${hex(12)}`);
    /** Closes the item being written (its done events). */
    const close = async () => {
      if (!open) return;
      const at = items.indexOf(open);
      if (open.kind === "message") {
        const part = { type: "output_text", text: open.text, annotations: [] };
        await send("response.output_text.done", { item_id: open.id, output_index: at, content_index: 0, text: open.text, logprobs: [] });
        await send("response.content_part.done", { item_id: open.id, output_index: at, content_index: 0, part });
      } else await send("response.function_call_arguments.done", { item_id: open.id, output_index: at, name: open.call.name, arguments: open.call.arguments });
      await send("response.output_item.done", { output_index: at, item: itemJson(open, "completed") });
      open = null;
    };
    const piece = async (p: AnswerPiece) => {
      if ("content" in p) {
        if (open?.kind !== "message") {
          await close();
          open = { kind: "message", id: `msg_${hex(16)}`, text: "" };
          items.push(open);
          await send("response.output_item.added", { output_index: items.length - 1, item: itemJson(open, "in_progress") });
          await send("response.content_part.added", {
            item_id: open.id,
            output_index: items.length - 1,
            content_index: 0,
            part: { type: "output_text", text: "", annotations: [] },
          });
        }
        open.text += p.content;
        await send("response.output_text.delta", { item_id: open.id, output_index: items.length - 1, content_index: 0, delta: p.content, logprobs: [] });
      } else if ("callStart" in p) {
        await close();
        open = { kind: "call", id: `fc_${hex(16)}`, call: reader.calls[p.callStart.index] };
        items.push(open);
        await send("response.output_item.added", { output_index: items.length - 1, item: itemJson(open, "in_progress") });
      } else if (open?.kind === "call") {
        await send("response.function_call_arguments.delta", { item_id: open.id, output_index: items.length - 1, delta: p.callArgs.fragment });
      }
    };
    try {
      await send("response.created", { response: responseJson(a, b, [], null) });
      await send("response.in_progress", { response: responseJson(a, b, [], null) });
      const out = await collectChoices({
        runs: a.runs,
        req: a.req,
        timing: a.timing,
        onText: async (_i, delta) => {
          for (const p of reader.push(delta)) await piece(p);
        },
      });
      const end = reader.finish(out.choices[0].finishReason);
      for (const p of end.pieces) await piece(p);
      if (items.length === 0) await piece({ content: "" });
      await close();
      const final = responseJson(a, b, items, { out, finish: end.finishReason });
      await send(final.status === "incomplete" ? "response.incomplete" : "response.completed", { response: final });
      a.timing.record(a.metrics, out);
    } catch (err) {
      const e = await streamFailed(a, s, err);
      if (e) {
        const failed = { ...responseJson(a, b, items, null), status: "failed", error: { code: e.status >= 500 ? "server_error" : "invalid_prompt", message: e.message } };
        await send("response.failed", { response: failed });
      }
    }
  });
}
