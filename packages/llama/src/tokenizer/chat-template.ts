// Renders chat messages with a checkpoint's Jinja chat template through @huggingface/jinja.
// Knows the variables templates expect (messages, bos_token, eos_token, add_generation_prompt);
// tokenising the result is the caller's business.

import { Template } from "@huggingface/jinja";
import type { ChatMessage } from "../checkpoint-types.ts";
import { ModelLoadError } from "../checkpoint/model-load-error.ts";

export type ChatRenderer = (messages: ChatMessage[], options?: { addGenerationPrompt?: boolean }) => string;

/**
 * Compiles `source` once and returns a renderer. `file` names where the template came from; a
 * template that does not parse is a ModelLoadError. Rendering errors propagate as thrown by jinja.
 */
export function compileChatTemplate(source: string, vars: { bosToken: string; eosToken: string }, file: string): ChatRenderer {
  let template: Template;
  try {
    template = new Template(source);
  } catch (cause) {
    throw new ModelLoadError(file, `chat template does not parse: ${(cause as Error).message}`, { item: "chat_template", cause });
  }
  return (messages, options) =>
    template.render({
      messages: messages.map((m) => ({ role: m.role, content: m.content })),
      bos_token: vars.bosToken,
      eos_token: vars.eosToken,
      add_generation_prompt: options?.addGenerationPrompt ?? false,
    });
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
