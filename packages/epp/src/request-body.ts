// What the picker reads from an OpenAI request body: the model and the prompt text (from
// `prompt` for completions, `messages` for chat). Pure. A body that is not a JSON object with a
// string `model` is refused with a 400, as GIE v1.5.0 refuses it.

export interface InferenceRequest {
  model: string;
  /** The text prefix affinity hashes: the prompt, or the messages as "role: text" lines. */
  prompt: string;
  /** What a tokenizer needs for precise prefix routing: the body's own prompt, or messages and tools, and its cache_salt. */
  tokenize: { model: string; prompt?: unknown; messages?: unknown; tools?: unknown; cacheSalt?: string };
}

/** The body cannot be routed: answered with HTTP 400 and an OpenAI error naming `param`. */
export class BadRequestBody extends Error {
  readonly status = 400;
  constructor(
    message: string,
    readonly param: string | null,
  ) {
    super(message);
    this.name = "BadRequestBody";
  }
}

function textOf(content: unknown): string {
  if (typeof content === "string") return content;
  if (Array.isArray(content)) return content.map((p) => (typeof p === "string" ? p : typeof p?.text === "string" ? p.text : "")).join("");
  return "";
}

function promptText(prompt: unknown): string {
  if (typeof prompt === "string") return prompt;
  if (Array.isArray(prompt))
    return prompt
      .map((p) => (typeof p === "string" ? p : Array.isArray(p) ? p.join(",") : String(p)))
      .join(Array.isArray(prompt[0]) ? "\n" : typeof prompt[0] === "number" ? "," : "\n");
  return "";
}

/** Parses a request body (UTF-8 JSON). Throws BadRequestBody when it is not JSON, not an object, or has no string `model`. */
export function parseInferenceBody(body: Buffer): InferenceRequest {
  let json: unknown;
  try {
    json = JSON.parse(body.toString("utf8"));
  } catch (e) {
    throw new BadRequestBody(`request body is not valid JSON: ${(e as Error).message}`, null);
  }
  if (typeof json !== "object" || json === null || Array.isArray(json)) throw new BadRequestBody("request body must be a JSON object", null);
  const o = json as { model?: unknown; prompt?: unknown; messages?: unknown; tools?: unknown; cache_salt?: unknown };
  if (typeof o.model !== "string" || o.model === "") throw new BadRequestBody("model not found in request body", "model");
  const salt = typeof o.cache_salt === "string" && o.cache_salt ? { cacheSalt: o.cache_salt } : {};
  if (o.prompt !== undefined) return { model: o.model, prompt: promptText(o.prompt), tokenize: { model: o.model, prompt: o.prompt, ...salt } };
  if (Array.isArray(o.messages)) {
    const lines = o.messages.map((m) => `${typeof m?.role === "string" ? m.role : ""}: ${textOf(m?.content)}`);
    return { model: o.model, prompt: lines.join("\n"), tokenize: { model: o.model, messages: o.messages, ...(o.tools !== undefined ? { tools: o.tools } : {}), ...salt } };
  }
  return { model: o.model, prompt: "", tokenize: { model: o.model } };
}
