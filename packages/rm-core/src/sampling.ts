// The one sampling type, from the OpenAI edge (which converts its snake_case once) through the
// internal API to the engine and the sampler. A zod schema, so the worker checks what crosses.

import { z } from "zod";

export const SamplingSchema = z
  .object({
    temperature: z.number().min(0).max(2).optional().describe("0 or unset: greedy (argmax, ties to the lowest id)"),
    topP: z.number().gt(0).max(1).optional().describe("nucleus mass in (0, 1]"),
    topK: z.number().int().min(1).optional().describe("keep the k most likely ids"),
    minP: z
      .number()
      .min(0)
      .max(1)
      .optional()
      .describe("keep the ids whose probability (after temperature) is at least this times the most likely id's (vLLM's min_p; 0 or unset: off)"),
    seed: z.number().int().min(0).max(0xffff_ffff).optional().describe("seed of the counter-based draw keyed by (seed, position)"),
    logitBias: z
      .array(z.tuple([z.number().int().min(0), z.number().min(-100).max(100)]))
      .optional()
      .describe("[token id, bias] pairs added to the logits before temperature, min-p, top-k and top-p (OpenAI logit_bias)"),
    presencePenalty: z.number().min(-2).max(2).optional().describe("subtracted from the logit of every id the completion has produced (OpenAI)"),
    frequencyPenalty: z.number().min(-2).max(2).optional().describe("subtracted from an id's logit once per time the completion has produced it (OpenAI)"),
    repetitionPenalty: z
      .number()
      .gt(0)
      .max(10)
      .optional()
      .describe("ids of the prompt or the completion: a positive logit divided by it, a negative one multiplied (vLLM; 1 is none)"),
  })
  .strict();

/** How the next token is chosen. */
export type SamplingParams = z.infer<typeof SamplingSchema>;

/**
 * A model's own sampling defaults, as vLLM's `--generation-config auto` reads them (a Hugging Face
 * folder's generation_config.json, a GGUF's `general.sampling.*` keys): what a request that leaves
 * a field out gets, in the ranges of the request fields they stand for.
 */
export const SamplingDefaultsSchema = z
  .object({
    temperature: z.number().min(0).max(2).optional().describe("temperature (0: greedy)"),
    topP: z.number().gt(0).max(1).optional().describe("top_p"),
    topK: z.number().int().min(-1).optional().describe("top_k (-1 or 0: off)"),
    minP: z.number().min(0).max(1).optional().describe("min_p"),
    repetitionPenalty: z.number().gt(0).max(10).optional().describe("repetition_penalty"),
  })
  .strict();

export type SamplingDefaults = z.infer<typeof SamplingDefaultsSchema>;

/** Each default's request field name, in the order they are shown. */
export const SAMPLING_DEFAULT_FIELDS: Record<keyof SamplingDefaults, string> = {
  temperature: "temperature",
  topP: "top_p",
  topK: "top_k",
  minP: "min_p",
  repetitionPenalty: "repetition_penalty",
};

/** `temperature=0.7 top_p=0.8 top_k=20` (request field names), or `none` when there are none. */
export function describeSamplingDefaults(d: SamplingDefaults | undefined): string {
  const parts: string[] = [];
  for (const [k, name] of Object.entries(SAMPLING_DEFAULT_FIELDS) as [keyof SamplingDefaults, string][]) {
    const v = d?.[k];
    if (v !== undefined) parts.push(`${name}=${v}`);
  }
  return parts.length ? parts.join(" ") : "none";
}

/** One candidate and its log-probability (natural log) under the model's distribution. */
export interface TopLogprob {
  token: number;
  logprob: number;
}

/**
 * The log-probability of a chosen token and of the most likely ones, from the model's logits
 * after a structured-output mask (when the request has one) and before logit_bias, temperature,
 * min-p, top-k and top-p: what vLLM reports (its default logprobs mode, with the grammar's bitmask
 * applied ahead of the sampler).
 */
export interface TokenLogprobs {
  token: number;
  logprob: number;
  /** The `n` most likely ids, best first (ties: lower id first); empty when 0 were asked for. */
  top: TopLogprob[];
}

/** The most alternatives a request may ask for per position (OpenAI's top_logprobs limit). */
export const MAX_TOP_LOGPROBS = 20;

/**
 * The seed of choice `index` of a request with several (`n`, `best_of`): choice 0 draws with the
 * request's seed, choice i with seed + i (mod 2^32). So `n: 3, seed: s` gives the answers of three
 * single requests with seeds s, s + 1 and s + 2.
 */
export function choiceSeed(seed: number | undefined, index: number): number {
  return ((seed ?? 0) + index) >>> 0;
}

/** What penalties read: how often each id came out in the completion so far, and the prompt's ids. */
export interface TokenHistory {
  output: ReadonlyMap<number, number>;
  prompt: ReadonlySet<number>;
}
