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
