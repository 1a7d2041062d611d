// Reads tool calls out of a chat answer's text as it streams, by tool mode: named (the whole text
// is the chosen function's arguments), required (a JSON array of {name, parameters}, which the
// grammar guarantees), auto with the hermes parser (`<tool_call>{"name", "arguments"}</tool_call>`
// blocks among text) or llama3_json (a JSON object, or several separated by `;`, as the whole
// answer). The same reader makes the JSON answer and the SSE stream, so the deltas reassemble to
// the non-streaming message. Knows the formats; nothing of HTTP.

import { randomBytes } from "node:crypto";
import type { ToolMode } from "./tools.ts";

/** One piece of the answer as it can be sent: text, a call's start, or a fragment of its arguments. */
export type AnswerPiece = { content: string } | { callStart: { index: number; id: string; name: string } } | { callArgs: { index: number; fragment: string } };

export interface ToolCall {
  id: string;
  name: string;
  /** A JSON object's text. */
  arguments: string;
}

/** A fresh tool call id, as vLLM makes them. */
export function toolCallId(): string {
  return `chatcmpl-tool-${randomBytes(16).toString("hex")}`;
}

const OPEN = "<tool_call>";
const CLOSE = "</tool_call>";

/** The length of the longest suffix of `text` that begins `tag` (text to hold back in case the tag is coming). */
function partialTagAt(text: string, tag: string): number {
  for (let n = Math.min(tag.length - 1, text.length); n > 0; n--) if (tag.startsWith(text.slice(text.length - n))) return n;
  return 0;
}

/** A call from the text of a {name, arguments|parameters} object, or null when it is not one. */
function callOf(raw: string): { name: string; arguments: string } | null {
  let v: unknown;
  try {
    v = JSON.parse(raw);
  } catch {
    return null;
  }
  if (typeof v !== "object" || v === null || Array.isArray(v)) return null;
  const o = v as Record<string, unknown>;
  const args = o.arguments ?? o.parameters;
  if (typeof o.name !== "string" || o.name.length === 0 || args === undefined) return null;
  return { name: o.name, arguments: typeof args === "string" ? args : JSON.stringify(args) };
}

/**
 * Top-level JSON objects in a text that arrives in pieces (brackets, commas, semicolons and
 * whitespace between them are skipped): `push` returns the objects' texts completed by `text`.
 */
class ObjectScanner {
  private depth = 0;
  private inString = false;
  private escaped = false;
  private current = "";

  push(text: string): string[] {
    const done: string[] = [];
    for (const ch of text) {
      if (this.depth > 0) this.current += ch;
      if (this.inString) {
        if (this.escaped) this.escaped = false;
        else if (ch === "\\") this.escaped = true;
        else if (ch === '"') this.inString = false;
        continue;
      }
      if (ch === '"' && this.depth > 0) this.inString = true;
      else if (ch === "{") {
        if (this.depth === 0) this.current = "{";
        this.depth++;
      } else if (ch === "}" && this.depth > 0) {
        this.depth--;
        if (this.depth === 0) done.push(this.current);
      }
    }
    return done;
  }
}

/** Turns an answer's text into pieces by tool mode; `finish` says the final finish reason. */
export class ToolCallReader {
  readonly calls: ToolCall[] = [];
  private content = "";
  /** Text held back: a possible start of `<tool_call>`, whitespace that may stand between calls, or a block. */
  private held = "";
  private inBlock = false;
  private readonly scanner = new ObjectScanner();
  /** llama3_json: the answer began with `{`, so all of it is read at the end. */
  private whole: boolean | null = null;

  /** `newId` names each call (chat: `chatcmpl-tool-...`; the Responses API: `call_...`). */
  constructor(
    private readonly mode: ToolMode,
    private readonly newId: () => string = toolCallId,
  ) {}

  /** The pieces `text` (the next delta of the answer) completes. */
  push(text: string): AnswerPiece[] {
    switch (this.mode.kind) {
      case "none":
        return this.text(text);
      case "named":
        return this.named(text);
      case "required":
        return this.scanner.push(text).flatMap((t) => this.addCall(callOf(t), t));
      case "auto":
        return this.mode.parser === "hermes" ? this.hermes(text) : this.llama3(text);
    }
  }

  /** What is left at the end, and the finish reason the answer gives ("tool_calls" when auto or required produced calls). */
  finish(finishReason: "stop" | "length"): { pieces: AnswerPiece[]; finishReason: "stop" | "length" | "tool_calls" } {
    const pieces: AnswerPiece[] = [];
    if (this.mode.kind === "named" && this.calls.length === 0) pieces.push(...this.named(""));
    if (this.mode.kind === "auto" && this.mode.parser === "hermes") {
      // What is left: an unclosed block, or trailing text (whitespace only counts when no call was made).
      if (this.inBlock) pieces.push(...this.block(this.held, true));
      else if (this.calls.length === 0 || this.held.trim()) pieces.push(...this.text(this.held));
      this.held = "";
    }
    if (this.mode.kind === "auto" && this.mode.parser === "llama3_json") pieces.push(...this.llama3End());
    const called = this.calls.length > 0 && (this.mode.kind === "auto" || this.mode.kind === "required");
    return { pieces, finishReason: called && finishReason === "stop" ? "tool_calls" : finishReason };
  }

  /** The message's content: null when the answer is tool calls and no text. */
  messageContent(): string | null {
    return this.calls.length > 0 && this.content.length === 0 ? null : this.content;
  }

  private text(t: string): AnswerPiece[] {
    if (!t) return [];
    this.content += t;
    return [{ content: t }];
  }

  private addCall(call: { name: string; arguments: string } | null, raw: string): AnswerPiece[] {
    if (!call) return this.text(raw);
    if (this.mode.kind === "auto" && !this.mode.parallel && this.calls.length > 0) return [];
    const index = this.calls.length;
    const c = { id: this.newId(), ...call };
    this.calls.push(c);
    return [{ callStart: { index, id: c.id, name: c.name } }, { callArgs: { index, fragment: c.arguments } }];
  }

  private named(t: string): AnswerPiece[] {
    const out: AnswerPiece[] = [];
    if (this.calls.length === 0) {
      const c = { id: this.newId(), name: (this.mode as { name: string }).name, arguments: "" };
      this.calls.push(c);
      out.push({ callStart: { index: 0, id: c.id, name: c.name } });
    }
    if (t) {
      this.calls[0].arguments += t;
      out.push({ callArgs: { index: 0, fragment: t } });
    }
    return out;
  }

  /** Hermes: text until `<tool_call>`, a block until `</tool_call>`; whitespace just before a block is not content. */
  private hermes(t: string): AnswerPiece[] {
    this.held += t;
    const out: AnswerPiece[] = [];
    for (;;) {
      if (this.inBlock) {
        const end = this.held.indexOf(CLOSE);
        if (end < 0) return out;
        out.push(...this.block(this.held.slice(0, end), false));
        this.held = this.held.slice(end + CLOSE.length);
        this.inBlock = false;
        continue;
      }
      const start = this.held.indexOf(OPEN);
      if (start >= 0) {
        out.push(...this.text(this.held.slice(0, start).trimEnd()));
        this.held = this.held.slice(start + OPEN.length);
        this.inBlock = true;
        continue;
      }
      // Text goes out up to its last non-space: whitespace before a call separates, it is not content.
      const body = this.held.slice(0, this.held.length - partialTagAt(this.held, OPEN));
      const cut = body.trimEnd().length;
      out.push(...this.text(this.held.slice(0, cut)));
      this.held = this.held.slice(cut);
      return out;
    }
  }

  /** One hermes block's inside: a call when it parses, else its text as content (tags included). */
  private block(inside: string, unclosed: boolean): AnswerPiece[] {
    return this.addCall(callOf(inside), `${OPEN}${inside}${unclosed ? "" : CLOSE}`);
  }

  /** llama3_json: an answer that begins with `{` is read whole at the end; any other streams as text. */
  private llama3(t: string): AnswerPiece[] {
    if (this.whole === null) {
      this.held += t;
      const lead = this.held.trimStart();
      if (lead.length === 0) return [];
      this.whole = lead.startsWith("{");
      if (this.whole) return [];
      const text = this.held;
      this.held = "";
      return this.text(text);
    }
    if (this.whole) {
      this.held += t;
      return [];
    }
    return this.text(t);
  }

  private llama3End(): AnswerPiece[] {
    if (!this.whole) {
      const rest = this.held;
      this.held = "";
      return this.text(rest);
    }
    const objects = new ObjectScanner().push(this.held);
    const calls = objects.map(callOf);
    const rest = this.held.replace(/\{[\s\S]*\}/, "").replace(/[;\s]/g, "");
    if (calls.length === 0 || calls.some((c) => c === null) || rest.length > 0) return this.text(this.held);
    return calls.flatMap((c, i) => this.addCall(c, objects[i]));
  }
}
