// What /v1/completions and /v1/chat/completions requests share: the GenerationRequest both become
// (the OpenAI names, snake_case, converted to the internal contract's types here, once), the
// options and limits of parsing, the `common` wire fields, and the helpers both endpoints' parsers
// (chat/request.ts, completions/request.ts) use: the screen of fields (every field OpenAI or vLLM
// defines is served, taken as a label, or refused by name: request-fields.ts; a field neither
// defines is ignored, as vLLM does, and named for a log), sampling, stop strings, max_tokens,
// choices, cache_salt and the 400s zod's errors become. Knows the limits a gateway can check
// without a tokenizer; the prompt + max_tokens against the compiled context is the prefill
// worker's check, whether a grammar builds the grammar checker's.

import { ApiError, type PromptInput } from "@airm/internal-api";
import type { SamplingDefaults, SamplingParams } from "@airm/rm-core";
import { z } from "zod";
import type { ToolMode, ToolSettings } from "./chat/tools.ts";
import { fieldsOf, REQUEST_FIELDS, type Endpoint } from "./request-fields.ts";
import type { Constraint } from "./structured.ts";

export interface GenerationRequest {
  kind: "completion" | "chat";
  /** The model named by the request; null when it named none (the gateway then serves its only model). */
  model: string | null;
  /** The prompt (the first of `prompts`: what one generation runs). */
  input: PromptInput;
  /** Every prompt of the request (a completions batch has several; each runs as its own generation). */
  prompts: PromptInput[];
  /** Choices returned per prompt. */
  n: number;
  /** Candidates generated per prompt (best_of; n when not given): the n with the highest cumulative log-probability are returned. */
  bestOf: number;
  /** null: fill the rest of max_model_len. */
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
  /** vLLM's return_tokens_as_token_ids: log-probabilities name tokens as `token_id:<id>` instead of their text. */
  tokensAsIds: boolean;
  /** The request's own deadline in seconds (`timeout`, an extension of the OpenAI body); null: the server's maximum. */
  timeoutS: number | null;
  /** What the output must keep to (structured outputs, or tool_choice required / named), or null. */
  constraint: Constraint | null;
  /** How tool calls come out of the answer (chat with tools). */
  toolMode: ToolMode;
  /** vLLM's ignore_eos: end-of-sequence tokens do not end the completion. */
  ignoreEos: boolean;
  /** vLLM's min_tokens: no end-of-sequence token before this many completion tokens. */
  minTokens: number;
  /** vLLM's cache_salt: prefix caching shares KV only between requests with the same salt. */
  cacheSalt?: string;
  /** The LoRA adapter `model` names (the gateway sets it when `model` is an adapter's name); unset: the base model. */
  lora?: string;
  /** Top-level fields neither OpenAI nor vLLM defines: ignored, as vLLM does (the route logs them once). */
  ignored: string[];
}

export interface ParseOptions {
  /** max_model_len the workers reported (the smallest; undefined when none answered yet). */
  maxContext?: number;
  /** The served model's vocabulary size, when a worker reported it (logit_bias ids are checked against it). */
  vocabSize?: number;
  /** Most choices (n, best_of) a decode worker runs at once (its batch width), when one reported it. */
  maxChoices?: number;
  /**
   * The sampling defaults of the model a request names (null: it names none), as its workers
   * report them (vLLM's --generation-config auto): a field the request leaves out, or sets to
   * null, takes the model's value; one it gives always wins.
   */
  generationDefaults?: (model: string | null) => SamplingDefaults | undefined;
  tools: ToolSettings;
}

/** OpenAI's limits: completions `logprobs` 0-5, chat `top_logprobs` 0-20. */
export const MAX_COMPLETION_LOGPROBS = 5;
export const MAX_CHAT_TOP_LOGPROBS = 20;

/** Hard ceiling on max_tokens when no worker has told us its context yet. */
export const MAX_TOKENS_CEILING = 1_000_000;

export const int = z.number().int();

/** The fields both endpoints take (each adds its own). */
export const common = {
  model: z.string().min(1).nullish(),
  max_tokens: int.nullish(),
  temperature: z.number().min(0).max(2).nullish(),
  top_p: z.number().gt(0).max(1).nullish(),
  top_k: int.min(-1).nullish(),
  min_p: z.number().nullish(),
  seed: int.nullish(),
  stop: z.union([z.string(), z.array(z.string()).max(4)]).nullish(),
  stream: z.boolean().nullish(),
  stream_options: z
    .object({ include_usage: z.boolean().nullish(), continuous_usage_stats: z.literal(false).nullish() })
    .strict()
    .nullish(),
  logit_bias: z.record(z.string(), z.number()).nullish(),
  ignore_eos: z.boolean().nullish(),
  min_tokens: int.min(0).nullish(),
  cache_salt: z.string().nullish(),
  n: int.min(1).nullish(),
  presence_penalty: z.number().min(-2).max(2).nullish(),
  frequency_penalty: z.number().min(-2).max(2).nullish(),
  repetition_penalty: z.number().gt(0).max(10).nullish(),
  response_format: z.unknown().optional(),
  structured_outputs: z.unknown().optional(),
  timeout: z.number().positive().nullish(),
  return_tokens_as_token_ids: z.boolean().nullish(),
};

/** The `common` fields of a checked body. */
export type CommonFields = z.infer<z.ZodObject<typeof common>>;

export function fromZod(err: z.ZodError): ApiError {
  const issue = err.issues[0];
  const param = issue.path.length ? issue.path.map(String).join(".") : null;
  if (issue.code === "unrecognized_keys") {
    const at = param ? `${param}.` : "";
    return new ApiError(400, "invalid_request", `unrecognized request argument supplied: ${issue.keys.map((k) => at + k).join(", ")}`, at + issue.keys[0]);
  }
  let message = issue.message;
  if (issue.code === "invalid_type" && issue.input === undefined) message = `'${param}' is a required property`;
  else if (param) message = `invalid '${param}': ${message}`;
  return new ApiError(400, "invalid_request", message, param);
}

function unsupported(param: string, what: string): ApiError {
  return new ApiError(400, "unsupported_parameter", `${what} is not supported by this server`, param);
}

/**
 * The body's served fields, and the names of the fields neither OpenAI nor vLLM defines (ignored,
 * as vLLM does: the caller logs them). Labels and refused-but-neutral fields are dropped (see
 * request-fields.ts). Throws 400 for a refused field that holds a value that would change the
 * output, and for a field of the other endpoint.
 */
export function screen(kind: Endpoint, body: Record<string, unknown>): { rest: Record<string, unknown>; ignored: string[] } {
  const fields = fieldsOf(kind);
  const rest: Record<string, unknown> = {};
  const ignored: string[] = [];
  for (const [k, v] of Object.entries(body)) {
    const f = fields.get(k);
    if (!f) {
      const elsewhere = REQUEST_FIELDS.find((x) => x.name === k);
      if (elsewhere)
        throw new ApiError(400, "invalid_request", `'${k}' is a field of ${elsewhere.on.includes("chat") ? "/v1/chat/completions" : "/v1/completions"}, not of this endpoint`, k);
      ignored.push(k);
      continue;
    }
    if (f.status === "served") {
      rest[k] = v;
      continue;
    }
    if (f.status === "label") {
      if (v != null && typeof v !== "string") throw new ApiError(400, "invalid_request", `invalid '${k}': expected a string`, k);
      continue;
    }
    if (v != null && !f.neutral?.(v)) throw unsupported(k, f.note.includes("vLLM in 0.12") ? `${k} (${f.note})` : f.note);
  }
  return { rest, ignored };
}

function maxTokensOf(value: number | null | undefined, param: string, fallback: number | null, maxContext: number | undefined): number | null {
  const v = value ?? fallback;
  if (v === null) return null;
  if (v <= 0) throw new ApiError(400, "invalid_request", `${param} must be at least 1, got ${v}`, param);
  const limit = maxContext ?? MAX_TOKENS_CEILING;
  if (v >= limit) {
    throw new ApiError(400, "context_overflow", `${param}=${v} leaves no room for a prompt within max_model_len of ${limit} tokens; ask for at most ${limit - 1}`, param);
  }
  return v;
}

/** OpenAI's logit_bias (token id strings to biases) as [id, bias] pairs. Throws 400 naming logit_bias. */
function logitBiasOf(raw: Record<string, number> | null | undefined, vocabSize: number | undefined): [number, number][] | undefined {
  if (!raw) return undefined;
  const out: [number, number][] = [];
  for (const [key, bias] of Object.entries(raw)) {
    if (!/^(0|[1-9][0-9]*)$/.test(key))
      throw new ApiError(400, "invalid_request", `logit_bias keys must be token ids (decimal integers); '${key.slice(0, 40)}' is not`, "logit_bias");
    const id = Number(key);
    if (vocabSize !== undefined && id >= vocabSize)
      throw new ApiError(400, "invalid_request", `logit_bias names token ${id}, outside this model's vocabulary [0, ${vocabSize})`, "logit_bias");
    if (!(bias >= -100 && bias <= 100)) throw new ApiError(400, "invalid_request", `logit_bias of token ${id} must be between -100 and 100, got ${bias}`, "logit_bias");
    out.push([id, bias]);
  }
  return out.length ? out : undefined;
}

/** vLLM's check and words for min_p. Throws 400 naming min_p. */
function minPOf(v: number | null | undefined): number | undefined {
  if (v == null) return undefined;
  if (!(v >= 0 && v <= 1)) throw new ApiError(400, "invalid_request", `min_p must be in [0, 1], got ${v}.`, "min_p");
  return v;
}

/**
 * The request's sampling: each field it gives, else the model's default (`d`), else the API's
 * neutral value (temperature 1, top_p 1, top_k and min_p off, repetition_penalty 1), as vLLM's
 * to_sampling_params does.
 */
function samplingOf(b: CommonFields, vocabSize: number | undefined, d: SamplingDefaults = {}): SamplingParams & { seed: number } {
  const s: SamplingParams & { seed: number } = {
    temperature: b.temperature ?? d.temperature ?? 1,
    seed: (b.seed ?? Math.floor(Math.random() * 2 ** 31)) >>> 0,
  };
  const topP = b.top_p ?? d.topP;
  if (topP != null) s.topP = topP;
  const topK = b.top_k ?? d.topK;
  if (topK != null && topK > 0) s.topK = topK;
  const minP = minPOf(b.min_p) ?? d.minP;
  if (minP) s.minP = minP;
  const bias = logitBiasOf(b.logit_bias, vocabSize);
  if (bias) s.logitBias = bias;
  if (b.presence_penalty) s.presencePenalty = b.presence_penalty;
  if (b.frequency_penalty) s.frequencyPenalty = b.frequency_penalty;
  const repetition = b.repetition_penalty ?? d.repetitionPenalty;
  if (repetition != null && repetition !== 1) s.repetitionPenalty = repetition;
  return s;
}

function stopsOf(stop: string | string[] | null | undefined): string[] {
  const stops = stop == null ? [] : typeof stop === "string" ? [stop] : stop;
  if (stops.some((s) => s.length === 0)) throw new ApiError(400, "invalid_request", "stop strings must not be empty", "stop");
  return stops;
}

/** ignore_eos and min_tokens. */
function stoppingOf(b: { ignore_eos?: boolean | null; min_tokens?: number | null; max_tokens?: number | null }): { ignoreEos: boolean; minTokens: number } {
  return { ignoreEos: b.ignore_eos ?? false, minTokens: b.min_tokens ?? 0 };
}

/** Longest cache_salt taken (the workers' limit). */
export const MAX_CACHE_SALT = 256;

/** vLLM's cache_salt: a non-empty string (vLLM refuses an empty one). Throws 400 naming cache_salt. */
export function cacheSaltOf(v: string | null | undefined): { cacheSalt?: string } {
  if (v == null) return {};
  if (v.length === 0) throw new ApiError(400, "invalid_request", "cache_salt must be a non-empty string", "cache_salt");
  if (v.length > MAX_CACHE_SALT) throw new ApiError(400, "invalid_request", `cache_salt is ${v.length} characters; at most ${MAX_CACHE_SALT}`, "cache_salt");
  return { cacheSalt: v };
}

/** n and best_of: n choices returned of best_of candidates. Throws 400 naming the field. */
function choicesOf(b: { n?: number | null; best_of?: number | null; stream?: boolean | null }, max: number | undefined): { n: number; bestOf: number } {
  const n = b.n ?? 1;
  const bestOf = b.best_of ?? n;
  if (bestOf < n) throw new ApiError(400, "invalid_request", `best_of (${bestOf}) must be at least n (${n})`, "best_of");
  if (b.best_of != null && b.best_of > 1 && b.stream)
    throw new ApiError(400, "invalid_request", "best_of cannot be used with stream (the best candidates are known only at the end)", "best_of");
  if (max !== undefined && bestOf > max) {
    const param = b.best_of != null ? "best_of" : "n";
    throw new ApiError(400, "invalid_request", `${param}=${bestOf} choices exceed the decode workers' ${max} slots (their batch width); ask for at most ${max}`, param);
  }
  return { n, bestOf };
}

/**
 * What chat and completions read alike from the common fields, checked in this order (the first
 * bad one is the 400): n and best_of, max_tokens (`maxTokens` names the field the body used and
 * the endpoint's default), the sampling fields, stop.
 */
export function commonRequestOf(
  b: CommonFields & { best_of?: number | null },
  maxTokens: { value: number | null | undefined; param: string; fallback: number | null },
  o: ParseOptions,
): Pick<GenerationRequest, "model" | "n" | "bestOf" | "maxTokens" | "sampling" | "stop" | "stream" | "includeUsage" | "tokensAsIds" | "timeoutS" | "ignoreEos" | "minTokens"> {
  return {
    model: b.model ?? null,
    ...choicesOf(b, o.maxChoices),
    maxTokens: maxTokensOf(maxTokens.value, maxTokens.param, maxTokens.fallback, o.maxContext),
    sampling: samplingOf(b, o.vocabSize, o.generationDefaults?.(b.model ?? null)),
    stop: stopsOf(b.stop),
    stream: b.stream ?? false,
    includeUsage: b.stream_options?.include_usage ?? false,
    tokensAsIds: b.return_tokens_as_token_ids ?? false,
    timeoutS: b.timeout ?? null,
    ...stoppingOf(b),
  };
}
