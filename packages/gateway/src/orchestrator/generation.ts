// What the orchestrator runs: one generation in the workers' terms, built once from the parsed
// wire request by the OpenAI layer (openai/parse.ts, generationOf). The orchestrator never sees
// the wire request; workerFields is the one mapping from a generation to a worker call's fields.
import type { DecodeRequest, PrefillRequest, PromptInput } from "@airm/internal-api";
import type { SamplingParams } from "@airm/rm-core";

export interface Generation {
  input: PromptInput;
  /** null: fill the rest of max_model_len. */
  maxTokens: number | null;
  /** Always with a seed, so prefill and decode draw one sequence. */
  sampling: SamplingParams & { seed: number };
  /** Alternatives per token the workers report; 0: the chosen tokens' alone (best_of ranks by them); null: none. */
  logprobs: number | null;
  /** The prompt's tokens and text come back first (completions' echo). */
  echo: boolean;
  /** The grammar every generated token keeps to, if any. */
  constraint: PrefillRequest["constraint"];
  ignoreEos: boolean;
  minTokens: number;
  /** Candidates a worker generates (best_of, else n): the choices its stream carries. */
  n: number;
  /** A moved stream's completion tokens the client already has (migration sets it). */
  resume?: number[];
  /** vLLM's cache_salt: prefix caching shares KV only between requests with the same salt. */
  cacheSalt?: string;
  /** The LoRA adapter (its name) every worker call runs on; unset: the base model. */
  lora?: string;
}

/** The fields a prefill, decode or generate call takes from the generation (decode takes no prompt and no echo). */
export function workerFields(g: Generation): Omit<DecodeRequest, "requestId" | "kvTimeoutMs"> {
  return {
    maxTokens: g.maxTokens,
    sampling: g.sampling,
    logprobs: g.logprobs,
    constraint: g.constraint,
    ignoreEos: g.ignoreEos,
    minTokens: g.minTokens,
    n: g.n,
    ...(g.resume ? { resume: g.resume } : {}),
    ...(g.cacheSalt ? { cacheSalt: g.cacheSalt } : {}),
    ...(g.lora ? { lora: g.lora } : {}),
  };
}
