// Parses and checks OpenAI /v1/completions and /v1/chat/completions bodies into one
// GenerationRequest (request-common.ts): the dispatcher to each endpoint's parser
// (completions/request.ts, chat/request.ts) and the checks across their fields, and the
// generation the orchestrator runs for one prompt of it. Whether a grammar builds is the grammar
// checker's check, made by the serving path (serving.ts).

import { ApiError, type PromptInput } from "@airm/internal-api";
import type { Generation } from "../orchestrator/generation.ts";
import { parseChat } from "./chat/request.ts";
import { parseCompletion } from "./completions/request.ts";
import type { GenerationRequest, ParseOptions } from "./request-common.ts";

/**
 * The generation the orchestrator runs for one prompt of the request, in the workers' terms: the
 * constraint's grammar, the candidates best_of asks for, and the log-probabilities the workers
 * report (the request's, or the chosen tokens' alone when best_of must rank candidates).
 */
export function generationOf(req: GenerationRequest, input: PromptInput): Generation {
  return {
    input,
    maxTokens: req.maxTokens,
    sampling: req.sampling,
    logprobs: req.logprobs ?? (req.bestOf > req.n ? 0 : null),
    echo: req.echo,
    constraint: req.constraint?.spec,
    ignoreEos: req.ignoreEos,
    minTokens: req.minTokens,
    n: req.bestOf,
    ...(req.cacheSalt ? { cacheSalt: req.cacheSalt } : {}),
    ...(req.lora ? { lora: req.lora } : {}),
  };
}

/** Checks a /v1/completions or /v1/chat/completions body. Throws ApiError (4xx). */
export function parseGenerationRequest(kind: "completion" | "chat", body: unknown, o: ParseOptions): GenerationRequest {
  if (typeof body !== "object" || body === null || Array.isArray(body)) {
    throw new ApiError(400, "invalid_request", "the request body must be a JSON object");
  }
  const req = kind === "completion" ? parseCompletion(body as Record<string, unknown>, o) : parseChat(body as Record<string, unknown>, o);
  if (req.ignoreEos && req.constraint) {
    throw new ApiError(400, "invalid_request", `ignore_eos cannot go with ${req.constraint.param.split(/[.[]/)[0]}: the grammar ends at its end-of-sequence token`, "ignore_eos");
  }
  if (req.maxTokens !== null && req.minTokens > req.maxTokens) {
    throw new ApiError(400, "invalid_request", `min_tokens (${req.minTokens}) must not exceed max_tokens (${req.maxTokens})`, "min_tokens");
  }
  return req;
}
