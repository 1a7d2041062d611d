// The /v1/completions request: its schema (the common fields, a prompt of text or token ids or a
// batch of either, echo, logprobs, best_of) and its parse into a GenerationRequest, one prompt per
// generation. The dispatcher, parseGenerationRequest (../parse.ts), calls it.

import { ApiError, type PromptInput } from "@airm/internal-api";
import { z } from "zod";
import { constraintOf } from "../structured.ts";
import { cacheSaltOf, common, commonRequestOf, fromZod, type GenerationRequest, int, MAX_COMPLETION_LOGPROBS, type ParseOptions, screen } from "../request-common.ts";

const tokenIds = z.array(int.min(0)).min(1);

const completionSchema = z
  .object({
    ...common,
    prompt: z.union([z.string(), z.array(z.string()), tokenIds, z.array(tokenIds)]),
    echo: z.boolean().nullish(),
    logprobs: int.nullish(),
    best_of: int.min(1).nullish(),
  })
  .strict();

/** Most prompts in one completions request (each runs as its own generation). */
export const MAX_BATCH_PROMPTS = 64;

/** The prompts of a completions request: a string, token ids, or a batch of either. */
function completionInputs(p: z.infer<typeof completionSchema>["prompt"]): PromptInput[] {
  let inputs: PromptInput[];
  if (typeof p === "string") inputs = [{ prompt: p }];
  else if (p.length === 0) throw new ApiError(400, "invalid_request", "prompt is empty", "prompt");
  else if (typeof p[0] === "number") inputs = [{ promptTokenIds: p as number[] }];
  else inputs = (p as (string | number[])[]).map((x) => (typeof x === "string" ? { prompt: x } : { promptTokenIds: x }));
  if (inputs.length > MAX_BATCH_PROMPTS) throw new ApiError(400, "invalid_request", `a batch of ${inputs.length} prompts is more than ${MAX_BATCH_PROMPTS}; split it`, "prompt");
  inputs.forEach((input, i) => {
    if ("prompt" in input && input.prompt.length === 0) throw new ApiError(400, "invalid_request", inputs.length > 1 ? `prompt[${i}] is empty` : "prompt is empty", "prompt");
  });
  return inputs;
}

/** Checks a /v1/completions body (an object). Throws ApiError (4xx). */
export function parseCompletion(body: Record<string, unknown>, o: ParseOptions): GenerationRequest {
  const { rest, ignored } = screen("completion", body);
  const r = completionSchema.safeParse(rest);
  if (!r.success) throw fromZod(r.error);
  const b = r.data;
  if (b.logprobs != null && (b.logprobs < 0 || b.logprobs > MAX_COMPLETION_LOGPROBS)) {
    throw new ApiError(400, "invalid_request", `logprobs must be between 0 and ${MAX_COMPLETION_LOGPROBS}, got ${b.logprobs}`, "logprobs");
  }
  const prompts = completionInputs(b.prompt);
  return {
    kind: "completion",
    input: prompts[0],
    prompts,
    ...commonRequestOf(b, { value: b.max_tokens, param: "max_tokens", fallback: 16 }, o),
    logprobs: b.logprobs ?? null,
    echo: b.echo ?? false,
    constraint: constraintOf(b),
    toolMode: { kind: "none" },
    ...cacheSaltOf(b.cache_salt),
    ignored,
  };
}
