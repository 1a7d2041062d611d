// A small generation loop over LlamaModel: prefill, sample, decode until a stop id or maxTokens.
// Used by tests, benches and simple callers; the serving engines drive prefill/decode themselves.
import { ConfigError, ContextOverflowError } from "@airm/rm-core";
import { sample, type SamplingParams } from "../sampling/sample.ts";
import type { LoraHandle } from "../lora/lora-registry.ts";
import type { KVCache } from "./kv-cache.ts";
import type { LlamaModel } from "./llama-model.ts";

export interface GenerateOptions {
  /** Upper bound of new tokens (>= 1). */
  maxTokens: number;
  sampling?: SamplingParams;
  /** Generation stops after producing one of these ids (the id is not returned). */
  stopTokenIds?: number[];
  /** Context of the cache; default prompt length + maxTokens. */
  S?: number;
  /** Prefill in chunks of this many tokens (same bits as whole-prompt prefill). */
  chunkSize?: number;
  /** The LoRA adapter to generate with (from model.loadLora); none: the base model. */
  lora?: LoraHandle;
}

export interface GenerateResult {
  /** New token ids, without the stop id. */
  tokens: number[];
  finishReason: "stop" | "length";
}

/**
 * Generates up to `maxTokens` ids after `prompt`. Throws ContextOverflowError when
 * prompt + maxTokens exceeds S, ConfigError for an empty prompt or maxTokens < 1.
 */
export function generate(model: LlamaModel, prompt: number[], opts: GenerateOptions): GenerateResult {
  if (!Number.isInteger(opts.maxTokens) || opts.maxTokens < 1) throw new ConfigError("max_tokens", `must be an integer >= 1, got ${opts.maxTokens}`);
  if (prompt.length === 0) throw new ConfigError("prompt", "the prompt is empty; pass at least one token");
  const S = opts.S ?? prompt.length + opts.maxTokens;
  if (prompt.length + opts.maxTokens > S) throw new ContextOverflowError(prompt.length + opts.maxTokens, S);
  const cache = model.newCache(S);
  try {
    const logits = opts.chunkSize ? model.prefillChunk(prompt, cache, opts.chunkSize, { lora: opts.lora }) : model.prefill(prompt, cache, { lora: opts.lora });
    return continueGeneration(model, cache, logits, opts);
  } finally {
    model.freeCache(cache);
  }
}

/**
 * Continues a sequence whose cache holds `cache.n` positions and whose next-token logits are
 * `logits` (from prefill, or from a decode step in another process). The token sampled at
 * position cache.n is the first returned id.
 */
export function continueGeneration(
  model: LlamaModel,
  cache: KVCache,
  logits: Float32Array,
  opts: Pick<GenerateOptions, "maxTokens" | "sampling" | "stopTokenIds" | "lora">,
): GenerateResult {
  return continueFromToken(model, cache, sample(logits, opts.sampling ?? {}, cache.n), opts);
}

/**
 * Continues from a token already chosen for position cache.n (e.g. the first token a prefill
 * process returned with the KV): that token is the first returned id (unless it is a stop id),
 * then decode steps follow until a stop id or maxTokens.
 */
export function continueFromToken(
  model: LlamaModel,
  cache: KVCache,
  token: number,
  opts: Pick<GenerateOptions, "maxTokens" | "sampling" | "stopTokenIds" | "lora">,
): GenerateResult {
  const stop = new Set(opts.stopTokenIds ?? []);
  const sampling = opts.sampling ?? {};
  const out: number[] = [];
  let next = token;
  for (;;) {
    if (stop.has(next)) return { tokens: out, finishReason: "stop" };
    out.push(next);
    if (out.length >= opts.maxTokens) return { tokens: out, finishReason: "length" };
    const [l] = model.decode([{ cache, token: next, lora: opts.lora }]);
    next = sample(l, sampling, cache.n);
  }
}
