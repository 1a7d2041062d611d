// The /v1/chat/completions request: its schema (the common fields, messages, max_completion_tokens,
// logprobs and top_logprobs, tools and tool_choice), the messages as the internal API carries
// them, and its parse into a GenerationRequest (tools and a response format checked against each
// other). The dispatcher, parseGenerationRequest (../parse.ts), calls it; the tokenizer route
// reads messages with the same schema.

import { ApiError, type ChatMessage, type PromptInput } from "@airm/internal-api";
import { z } from "zod";
import { constraintOf } from "../structured.ts";
import { cacheSaltOf, common, commonRequestOf, fromZod, type GenerationRequest, int, MAX_CHAT_TOP_LOGPROBS, type ParseOptions, screen } from "../request-common.ts";
import { toolsOf } from "./tools.ts";

const contentPart = z.object({ type: z.string(), text: z.string().optional() }).loose();
const toolCallSchema = z.object({ id: z.string(), type: z.literal("function"), function: z.object({ name: z.string().min(1), arguments: z.string() }).strict() }).strict();
export const messageSchema = z
  .object({
    role: z.enum(["system", "developer", "user", "assistant", "tool"]),
    content: z.union([z.string(), z.array(contentPart), z.null()]).optional(),
    name: z.string().nullish(),
    tool_calls: z.array(toolCallSchema).nullish(),
    tool_call_id: z.string().nullish(),
    refusal: z.string().nullish(),
  })
  .strict();

const chatSchema = z
  .object({
    ...common,
    messages: z.array(messageSchema).min(1),
    max_completion_tokens: int.nullish(),
    logprobs: z.boolean().nullish(),
    top_logprobs: int.nullish(),
    tools: z.unknown().optional(),
    tool_choice: z.unknown().optional(),
    parallel_tool_calls: z.boolean().nullish(),
  })
  .strict();

/** The chat messages as the internal API carries them (text content; tool calls and the calls tool turns answer). */
export function messagesOf(messages: z.infer<typeof messageSchema>[]): ChatMessage[] {
  return messages.map((m, i) => {
    let content = "";
    if (typeof m.content === "string") content = m.content;
    else if (Array.isArray(m.content)) {
      content = m.content
        .map((part, j) => {
          if (part.type !== "text" || typeof part.text !== "string") {
            throw new ApiError(
              400,
              "unsupported_parameter",
              `messages[${i}].content[${j}] is a '${part.type}' part; this server reads text parts only`,
              `messages[${i}].content[${j}].type`,
            );
          }
          return part.text;
        })
        .join("");
    }
    if (m.tool_calls?.length && m.role !== "assistant")
      throw new ApiError(400, "invalid_request", `messages[${i}]: only assistant messages carry tool_calls`, `messages[${i}].tool_calls`);
    if (m.role === "tool" && !m.tool_call_id) throw new ApiError(400, "invalid_request", `messages[${i}]: a tool message needs tool_call_id`, `messages[${i}].tool_call_id`);
    const out: ChatMessage = { role: m.role, content };
    if (m.tool_calls?.length) out.toolCalls = m.tool_calls.map((c) => ({ id: c.id, name: c.function.name, arguments: c.function.arguments }));
    if (m.tool_call_id) out.toolCallId = m.tool_call_id;
    if (m.name) out.name = m.name;
    return out;
  });
}

/** Checks a /v1/chat/completions body (an object). Throws ApiError (4xx). */
export function parseChat(body: Record<string, unknown>, o: ParseOptions): GenerationRequest {
  const { rest, ignored } = screen("chat", body);
  const r = chatSchema.safeParse(rest);
  if (!r.success) throw fromZod(r.error);
  const b = r.data;
  if (b.top_logprobs != null) {
    if (b.top_logprobs < 0 || b.top_logprobs > MAX_CHAT_TOP_LOGPROBS) {
      throw new ApiError(400, "invalid_request", `top_logprobs must be between 0 and ${MAX_CHAT_TOP_LOGPROBS}, got ${b.top_logprobs}`, "top_logprobs");
    }
    if (b.logprobs !== true) throw new ApiError(400, "invalid_request", "top_logprobs needs logprobs set to true", "top_logprobs");
  }
  const messages = messagesOf(b.messages);
  if (messages.every((m) => m.content.length === 0 && !m.toolCalls?.length)) throw new ApiError(400, "invalid_request", "every message is empty", "messages");
  const tools = toolsOf(b, o.tools);
  const format = constraintOf(b);
  if (format && tools.constraint) {
    throw new ApiError(400, "invalid_request", `the output can keep to tool_choice "${tools.mode.kind}" or to ${format.param.split(".")[0]}, not both`, format.param.split(".")[0]);
  }
  if (format && tools.mode.kind === "auto") {
    throw new ApiError(
      400,
      "invalid_request",
      `${format.param.split(".")[0]} constrains the output, so tool calls cannot be written: set tool_choice to "none", "required" or a named tool, or drop it`,
      "tool_choice",
    );
  }
  const param = b.max_completion_tokens != null ? "max_completion_tokens" : "max_tokens";
  const input: PromptInput = tools.tools ? { messages, tools: tools.tools } : { messages };
  return {
    kind: "chat",
    input,
    prompts: [input],
    ...commonRequestOf(b, { value: b.max_completion_tokens ?? b.max_tokens, param, fallback: null }, o),
    logprobs: b.logprobs === true ? (b.top_logprobs ?? 0) : null,
    echo: false,
    constraint: format ?? tools.constraint,
    toolMode: tools.mode,
    ...cacheSaltOf(b.cache_salt),
    ignored,
  };
}
