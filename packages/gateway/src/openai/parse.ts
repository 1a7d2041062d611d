// Parses and checks OpenAI /v1/completions and /v1/chat/completions bodies into one
// GenerationRequest, converting the OpenAI names (snake_case) to the internal contract's types
// here, once. Knows the wire schema and the limits a gateway can check without a tokenizer; the
// prompt + max_tokens against the compiled context is the prefill worker's check.

import { ApiError, type PromptInput } from "@airm/internal-api";
import type { SamplingParams } from "@airm/rm-core";
import { z } from "zod";

export interface GenerationRequest {
  kind: "completion" | "chat";
  /** The model named by the request; null when it named none (the gateway then serves its only model). */
  model: string | null;
  input: PromptInput;
  /** null: fill the rest of the compiled context. */
  maxTokens: number | null;
  /** Always carries a seed (the client's or a random one), so prefill and decode draw one sequence. */
  sampling: SamplingParams & { seed: number };
  stop: string[];
  stream: boolean;
  includeUsage: boolean;
  /** Log-probabilities: how many alternatives per token (chat top_logprobs, completions logprobs); null: none. */
  logprobs: number | null;
  /** completions only: the prompt (text and, with logprobs, its scored tokens) comes before the completion. */
  echo: boolean;
  /** The request's own deadline in seconds (`timeout`, an extension of the OpenAI body); null: the server's maximum. */
  timeoutS: number | null;
}

/** OpenAI's limits: completions `logprobs` 0-5, chat `top_logprobs` 0-20. */
export const MAX_COMPLETION_LOGPROBS = 5;
export const MAX_CHAT_TOP_LOGPROBS = 20;

/** Hard ceiling on max_tokens when no worker has told us its context yet. */
export const MAX_TOKENS_CEILING = 1_000_000;

const int = z.number().int();
const tokenIds = z.array(int.min(0)).min(1);

const common = {
  model: z.string().min(1).nullish(),
  max_tokens: int.nullish(),
  temperature: z.number().min(0).max(2).nullish(),
  top_p: z.number().gt(0).max(1).nullish(),
  top_k: int.min(-1).nullish(),
  seed: int.nullish(),
  n: int.nullish(),
  best_of: int.nullish(),
  stop: z.union([z.string(), z.array(z.string()).max(4)]).nullish(),
  stream: z.boolean().nullish(),
  stream_options: z.object({ include_usage: z.boolean().nullish() }).loose().nullish(),
  presence_penalty: z.number().nullish(),
  frequency_penalty: z.number().nullish(),
  user: z.string().nullish(),
  timeout: z.number().positive().nullish(),
};

const completionSchema = z
  .object({
    ...common,
    prompt: z.union([z.string(), z.array(z.string()), tokenIds, z.array(tokenIds)]),
    echo: z.boolean().nullish(),
    suffix: z.string().nullish(),
    logprobs: int.nullish(),
  })
  .loose();

const contentPart = z.object({ type: z.literal("text"), text: z.string() }).loose();
const messageSchema = z
  .object({
    role: z.enum(["system", "developer", "user", "assistant", "tool"]),
    content: z.union([z.string(), z.array(contentPart), z.null()]),
  })
  .loose();

const chatSchema = z
  .object({
    ...common,
    messages: z.array(messageSchema).min(1),
    max_completion_tokens: int.nullish(),
    logprobs: z.boolean().nullish(),
    top_logprobs: int.nullish(),
    echo: z.boolean().nullish(),
  })
  .loose();

function fromZod(err: z.ZodError): ApiError {
  const issue = err.issues[0];
  const param = issue.path.length ? issue.path.map(String).join(".") : null;
  let message = issue.message;
  if (issue.code === "invalid_type" && issue.input === undefined) message = `'${param}' is a required property`;
  else if (param) message = `invalid '${param}': ${message}`;
  return new ApiError(400, "invalid_request", message, param);
}

function unsupported(param: string, what: string): ApiError {
  return new ApiError(400, "unsupported_parameter", `${what} is not supported by this server`, param);
}

function checkCommon(b: z.infer<typeof completionSchema> | z.infer<typeof chatSchema>): void {
  if (b.n != null && b.n !== 1) throw unsupported("n", `n=${b.n} (several choices per request)`);
  if (b.best_of != null && b.best_of !== 1) throw unsupported("best_of", `best_of=${b.best_of}`);
  if (b.presence_penalty) throw unsupported("presence_penalty", "a non-zero presence_penalty");
  if (b.frequency_penalty) throw unsupported("frequency_penalty", "a non-zero frequency_penalty");
  const stops = b.stop == null ? [] : typeof b.stop === "string" ? [b.stop] : b.stop;
  if (stops.some((s) => s.length === 0)) throw new ApiError(400, "invalid_request", "stop strings must not be empty", "stop");
}

function maxTokensOf(value: number | null | undefined, param: string, fallback: number | null, maxContext: number | undefined): number | null {
  const v = value ?? fallback;
  if (v === null) return null;
  if (v <= 0) throw new ApiError(400, "invalid_request", `${param} must be at least 1, got ${v}`, param);
  const limit = maxContext ?? MAX_TOKENS_CEILING;
  if (v >= limit) {
    throw new ApiError(400, "context_overflow", `${param}=${v} leaves no room for a prompt in the compiled context of ${limit} tokens; ask for at most ${limit - 1}`, param);
  }
  return v;
}

function samplingOf(b: { temperature?: number | null; top_p?: number | null; top_k?: number | null; seed?: number | null }): SamplingParams & { seed: number } {
  const s: SamplingParams & { seed: number } = {
    temperature: b.temperature ?? 1,
    seed: (b.seed ?? Math.floor(Math.random() * 2 ** 31)) >>> 0,
  };
  if (b.top_p != null) s.topP = b.top_p;
  if (b.top_k != null && b.top_k > 0) s.topK = b.top_k;
  return s;
}

/**
 * Checks a /v1/completions or /v1/chat/completions body. `maxContext` is the largest compiled
 * context the workers reported (undefined when none answered yet). Throws ApiError (4xx).
 */
export function parseGenerationRequest(kind: "completion" | "chat", body: unknown, maxContext?: number): GenerationRequest {
  if (typeof body !== "object" || body === null || Array.isArray(body)) {
    throw new ApiError(400, "invalid_request", "the request body must be a JSON object");
  }
  if (kind === "completion") {
    const r = completionSchema.safeParse(body);
    if (!r.success) throw fromZod(r.error);
    const b = r.data;
    checkCommon(b);
    if (b.suffix) throw unsupported("suffix", "suffix");
    if (b.logprobs != null && (b.logprobs < 0 || b.logprobs > MAX_COMPLETION_LOGPROBS)) {
      throw new ApiError(400, "invalid_request", `logprobs must be between 0 and ${MAX_COMPLETION_LOGPROBS}, got ${b.logprobs}`, "logprobs");
    }
    let input: PromptInput;
    const p = b.prompt;
    if (typeof p === "string") input = { prompt: p };
    else if (p.length === 0) throw new ApiError(400, "invalid_request", "prompt is empty", "prompt");
    else if (typeof p[0] === "string") {
      if (p.length > 1) throw unsupported("prompt", `a batch of ${p.length} prompts in one request`);
      input = { prompt: p[0] as string };
    } else if (typeof p[0] === "number") input = { promptTokenIds: p as number[] };
    else {
      if (p.length > 1) throw unsupported("prompt", `a batch of ${p.length} prompts in one request`);
      input = { promptTokenIds: p[0] as number[] };
    }
    if ("prompt" in input && input.prompt.length === 0) throw new ApiError(400, "invalid_request", "prompt is empty", "prompt");
    return {
      kind,
      model: b.model ?? null,
      input,
      maxTokens: maxTokensOf(b.max_tokens, "max_tokens", 16, maxContext),
      sampling: samplingOf(b),
      stop: b.stop == null ? [] : typeof b.stop === "string" ? [b.stop] : b.stop,
      stream: b.stream ?? false,
      includeUsage: b.stream_options?.include_usage ?? false,
      logprobs: b.logprobs ?? null,
      echo: b.echo ?? false,
      timeoutS: b.timeout ?? null,
    };
  }
  const r = chatSchema.safeParse(body);
  if (!r.success) throw fromZod(r.error);
  const b = r.data;
  checkCommon(b);
  if (b.echo) throw unsupported("echo", "echo on chat completions (it is a completions parameter)");
  if (b.top_logprobs != null) {
    if (b.top_logprobs < 0 || b.top_logprobs > MAX_CHAT_TOP_LOGPROBS) {
      throw new ApiError(400, "invalid_request", `top_logprobs must be between 0 and ${MAX_CHAT_TOP_LOGPROBS}, got ${b.top_logprobs}`, "top_logprobs");
    }
    if (b.logprobs !== true) throw new ApiError(400, "invalid_request", "top_logprobs needs logprobs set to true", "top_logprobs");
  }
  const messages = b.messages.map((m) => ({
    role: m.role,
    content: m.content == null ? "" : typeof m.content === "string" ? m.content : m.content.map((part) => part.text).join(""),
  }));
  if (messages.every((m) => m.content.length === 0)) throw new ApiError(400, "invalid_request", "every message is empty", "messages");
  const param = b.max_completion_tokens != null ? "max_completion_tokens" : "max_tokens";
  return {
    kind,
    model: b.model ?? null,
    input: { messages },
    maxTokens: maxTokensOf(b.max_completion_tokens ?? b.max_tokens, param, null, maxContext),
    sampling: samplingOf(b),
    stop: b.stop == null ? [] : typeof b.stop === "string" ? [b.stop] : b.stop,
    stream: b.stream ?? false,
    includeUsage: b.stream_options?.include_usage ?? false,
    logprobs: b.logprobs === true ? (b.top_logprobs ?? 0) : null,
    echo: false,
    timeoutS: b.timeout ?? null,
  };
}
