// What a chat answer to a tool request looks like, for the tools bench's report: tool calls the
// server parsed, calls the model wrote as text the parser did not take (a bare JSON
// {"name", "arguments"} object, or one in a ```json fence), or plain text. The text-written calls
// can be read back for a diagnostic score; the servers' parsers are what BFCL scores.

export interface AnswerLike {
  ok: boolean;
  toolCalls: { name: string; arguments: string }[] | null;
  content: string | null;
}

/** The JSON values of a text made only of JSON values and whitespace, or null. */
function jsonValues(text: string): unknown[] | null {
  const out: unknown[] = [];
  let i = 0;
  while (i < text.length) {
    while (i < text.length && /\s/.test(text[i])) i++;
    if (i >= text.length) break;
    if (text[i] !== "{" && text[i] !== "[") return null;
    let depth = 0;
    let inString = false;
    let j = i;
    for (; j < text.length; j++) {
      const ch = text[j];
      if (inString) {
        if (ch === "\\") j++;
        else if (ch === '"') inString = false;
      } else if (ch === '"') inString = true;
      else if (ch === "{" || ch === "[") depth++;
      else if (ch === "}" || ch === "]") {
        depth--;
        if (depth === 0) break;
      }
    }
    if (j >= text.length) return null;
    try {
      out.push(JSON.parse(text.slice(i, j + 1)));
    } catch {
      return null;
    }
    i = j + 1;
  }
  return out;
}

const FENCE = /```(?:json)?[ \t]*\n?([\s\S]*?)```/g;

/** Whether the content was fenced, and the text inside the fences (null when text stands outside them). */
function unfenced(content: string): { fenced: boolean; text: string } | null {
  if (!content.includes("```")) return { fenced: false, text: content };
  if (content.replace(FENCE, "").trim()) return null;
  return { fenced: true, text: [...content.matchAll(FENCE)].map((m) => m[1]).join("\n") };
}

/** Calls written as text: the whole content is {name, arguments|parameters} objects (or arrays of them), bare or fenced. */
export function textCalls(content: string | null): { name: string; arguments: string }[] | null {
  if (!content?.trim()) return null;
  const u = unfenced(content);
  const values = u ? jsonValues(u.text) : null;
  if (!values?.length) return null;
  const calls: { name: string; arguments: string }[] = [];
  for (const v of values.flatMap((x) => (Array.isArray(x) ? x : [x]))) {
    if (typeof v !== "object" || v === null) return null;
    const o = v as Record<string, unknown>;
    const a = o.arguments ?? o.parameters;
    if (typeof o.name !== "string" || a === undefined) return null;
    calls.push({ name: o.name, arguments: typeof a === "string" ? a : JSON.stringify(a) });
  }
  return calls;
}

/** "tool_calls", "text: JSON call" / "text: ```json call", "text", "empty" or "error". */
export function answerShape(a: AnswerLike): string {
  if (!a.ok) return "error";
  if (a.toolCalls?.length) return "tool_calls";
  if (!a.content?.trim()) return "empty";
  if (textCalls(a.content)) return unfenced(a.content)?.fenced ? "text: ```json call" : "text: JSON call";
  return "text";
}
