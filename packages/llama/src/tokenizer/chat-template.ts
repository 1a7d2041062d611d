// Renders chat messages with a checkpoint's Jinja chat template through @huggingface/jinja.
// Knows the variables templates expect (messages, tools, bos_token, eos_token,
// add_generation_prompt) in Hugging Face's shapes, and a documented rendering of tools for
// templates that have none (SmolLM2's ChatML): the tools in the system turn, calls and results
// in the Hermes format (`<tool_call>`, `<tool_response>`). Tokenising the result is the caller's.

import { Template } from "@huggingface/jinja";
import type { ChatMessage, ChatTool } from "../checkpoint-types.ts";
import { ModelLoadError } from "../checkpoint/model-load-error.ts";

export type ChatRenderer = (messages: ChatMessage[], options?: { addGenerationPrompt?: boolean; tools?: ChatTool[] }) => string;

/** A template renders tools itself when it reads the `tools` variable. */
export function templateHasTools(source: string): boolean {
  return /\btools\b/.test(source);
}

/** A call's arguments as a template reads them: the parsed object (Hugging Face's form), or the text when it is not JSON. */
function argumentsValue(text: string): unknown {
  try {
    return JSON.parse(text);
  } catch {
    return text;
  }
}

/** The Hermes-format text of one tool call. */
function toolCallText(call: { name: string; arguments: string }): string {
  return `<tool_call>\n${JSON.stringify({ name: call.name, arguments: argumentsValue(call.arguments) })}\n</tool_call>`;
}

/** What the system turn says about the tools, for a template without tool support. */
export function toolsPreamble(tools: ChatTool[]): string {
  const lines = tools.map((t) =>
    JSON.stringify({ type: "function", function: { name: t.name, ...(t.description ? { description: t.description } : {}), parameters: t.parameters } }),
  );
  return [
    "You can call functions to answer. Their signatures, one JSON object per line, are inside <tools></tools>:",
    "<tools>",
    ...lines,
    "</tools>",
    "To call a function, answer with one block per call, each holding a JSON object with the function's name and its arguments:",
    "<tool_call>",
    '{"name": <function name>, "arguments": <arguments as a JSON object>}',
    "</tool_call>",
  ].join("\n");
}

/** Messages with tools, calls and results written into plain turns (for a template without tool support). */
function withToolsInText(messages: ChatMessage[], tools: ChatTool[] | undefined): Array<{ role: string; content: string }> {
  const out: Array<{ role: string; content: string }> = [];
  for (const m of messages) {
    if (m.role === "tool") out.push({ role: "user", content: `<tool_response>\n${m.content}\n</tool_response>` });
    else if (m.toolCalls?.length) out.push({ role: m.role, content: [m.content, ...m.toolCalls.map(toolCallText)].filter((x) => x).join("\n") });
    else out.push({ role: m.role, content: m.content });
  }
  if (tools?.length) {
    const preamble = toolsPreamble(tools);
    if (out[0]?.role === "system") out[0] = { role: "system", content: `${out[0].content}\n\n${preamble}` };
    else out.unshift({ role: "system", content: preamble });
  }
  return out;
}

/** Messages in Hugging Face's shape: tool_calls with their function and parsed arguments, tool_call_id on tool turns. */
function hfMessages(messages: ChatMessage[]): Array<Record<string, unknown>> {
  return messages.map((m) => {
    const out: Record<string, unknown> = { role: m.role, content: m.content };
    if (m.toolCalls?.length) out.tool_calls = m.toolCalls.map((c) => ({ id: c.id, type: "function", function: { name: c.name, arguments: argumentsValue(c.arguments) } }));
    if (m.toolCallId !== undefined) out.tool_call_id = m.toolCallId;
    if (m.name !== undefined) out.name = m.name;
    return out;
  });
}

/**
 * Compiles `source` once and returns a renderer. `file` names where the template came from; a
 * template that does not parse is a ModelLoadError. Rendering errors propagate as thrown by jinja.
 * Tools, tool calls and tool turns go to the template when it reads `tools`, else into the text
 * (see withToolsInText).
 */
export function compileChatTemplate(source: string, vars: { bosToken: string; eosToken: string }, file: string): ChatRenderer {
  let template: Template;
  try {
    template = new Template(source);
  } catch (cause) {
    throw new ModelLoadError(file, `chat template does not parse: ${(cause as Error).message}`, { item: "chat_template", cause });
  }
  const native = templateHasTools(source);
  return (messages, options) => {
    const tools = options?.tools?.length ? options.tools : undefined;
    const toolTurns = messages.some((m) => m.role === "tool" || m.toolCalls?.length);
    const base = { bos_token: vars.bosToken, eos_token: vars.eosToken, add_generation_prompt: options?.addGenerationPrompt ?? false };
    if (native) {
      const hfTools = tools?.map((t) => ({ type: "function", function: { name: t.name, ...(t.description ? { description: t.description } : {}), parameters: t.parameters } }));
      return template.render({ ...base, messages: hfMessages(messages), ...(hfTools ? { tools: hfTools } : {}) });
    }
    return template.render({ ...base, messages: tools || toolTurns ? withToolsInText(messages, tools) : messages.map((m) => ({ role: m.role, content: m.content })) });
  };
}

/** The template text from a tokenizer_config.json `chat_template` (string, or list of named templates). */
export function chatTemplateSource(raw: unknown): string | undefined {
  if (typeof raw === "string") return raw;
  if (Array.isArray(raw)) {
    const named = raw as Array<{ name?: unknown; template?: unknown }>;
    const pick = named.find((t) => t.name === "default") ?? named[0];
    if (pick && typeof pick.template === "string") return pick.template;
  }
  return undefined;
}

/** The content of a special-token entry in tokenizer_config.json (string or {content}). */
export function specialTokenContent(raw: unknown): string | undefined {
  if (typeof raw === "string") return raw;
  if (raw && typeof raw === "object" && typeof (raw as { content?: unknown }).content === "string") return (raw as { content: string }).content;
  return undefined;
}
