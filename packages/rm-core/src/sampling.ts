// The one sampling type, from the OpenAI edge (which converts its snake_case once) through the
// internal API to the engine and the sampler. A zod schema, so the worker checks what crosses.

import { z } from "zod";

export const SamplingSchema = z
  .object({
    temperature: z.number().min(0).max(2).optional().describe("0 or unset: greedy (argmax, ties to the lowest id)"),
    topP: z.number().gt(0).max(1).optional().describe("nucleus mass in (0, 1]"),
    topK: z.number().int().min(1).optional().describe("keep the k most likely ids"),
    seed: z.number().int().min(0).max(0xffff_ffff).optional().describe("seed of the counter-based draw keyed by (seed, position)"),
  })
  .strict();

/** How the next token is chosen. */
export type SamplingParams = z.infer<typeof SamplingSchema>;

/** One candidate and its log-probability (natural log) under the model's distribution. */
export interface TopLogprob {
  token: number;
  logprob: number;
}

/**
 * The log-probability of a chosen token and of the most likely ones, from the raw logits the
 * sampler saw (before temperature, top-k or top-p), as OpenAI and vLLM report them.
 */
export interface TokenLogprobs {
  token: number;
  logprob: number;
  /** The `n` most likely ids, best first (ties: lower id first); empty when 0 were asked for. */
  top: TopLogprob[];
}

/** The most alternatives a request may ask for per position (OpenAI's top_logprobs limit). */
export const MAX_TOP_LOGPROBS = 20;
