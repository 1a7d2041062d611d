// What the prefill, decode and generate routes share: turning a prompt input into token ids,
// resolving max_tokens and the variant, the first-token fields, and the decode loop that emits
// token and done events. Knows the engine and the event types; not HTTP.

import { ApiError, type FirstToken, type PromptInput, type WorkerEvent } from "@airm/internal-api";
import { ContextOverflowError, IncrementalDetokenizer, type SamplingParams } from "@airm/rm-core";
import type { DecodeBatcher } from "./decode-batcher.ts";
import type { EngineStream, ServingEngine } from "./serving-engine.ts";

/** Token ids of a prompt input. Throws ApiError 400 for ids outside the vocabulary, a model without chat template, an empty prompt. */
export function tokenize(engine: ServingEngine, input: PromptInput): number[] {
  let ids: number[];
  if ("promptTokenIds" in input) {
    const bad = input.promptTokenIds.find((t) => t >= engine.model.vocabSize);
    if (bad !== undefined) throw new ApiError(400, "invalid_request", `token id ${bad} is outside the vocabulary (size ${engine.model.vocabSize})`, "prompt");
    ids = input.promptTokenIds;
  } else if ("messages" in input) {
    if (!engine.tokenizer.renderChat) throw new ApiError(400, "invalid_request", `model ${engine.model.id} has no chat template; use /v1/completions`, "messages");
    ids = engine.tokenizer.encode(engine.tokenizer.renderChat(input.messages, { addGenerationPrompt: true }), { addSpecialTokens: false });
  } else {
    ids = engine.tokenizer.encode(input.prompt, { addSpecialTokens: true });
  }
  if (ids.length === 0) throw new ApiError(400, "invalid_request", "the prompt is empty after tokenization", "prompt");
  return ids;
}

/**
 * Resolves max_tokens (null: the rest of the largest context) and the context S to run at.
 * Throws ContextOverflowError when it does not fit, ApiError 400 for a seqLen not compiled here.
 */
export function planRequest(engine: ServingEngine, promptTokens: number, maxTokens: number | null, seqLen?: number): { maxTokens: number; seqLen: number } {
  const compiled = engine.variants();
  const maxS = Math.max(...compiled.map((v) => v.seqLen));
  const m = maxTokens ?? maxS - promptTokens;
  if (m < 1) throw new ContextOverflowError(promptTokens + 1, maxS, `the prompt alone has ${promptTokens} tokens`);
  const variant = engine.pickVariant(promptTokens, m);
  if (seqLen === undefined || seqLen === variant.seqLen) return { maxTokens: m, seqLen: variant.seqLen };
  if (!compiled.some((v) => v.seqLen === seqLen)) {
    throw new ApiError(400, "invalid_request", `seqLen ${seqLen} is not compiled here (${compiled.map((v) => v.seqLen).join(", ")})`, "seqLen");
  }
  if (promptTokens + m > seqLen) throw new ContextOverflowError(promptTokens + m, seqLen, "seqLen pinned by the request");
  return { maxTokens: m, seqLen };
}

export function isEos(engine: ServingEngine, token: number): boolean {
  return engine.tokenizer.eosTokenIds.includes(token) || engine.model.eosTokenIds.includes(token);
}

/** The completion's detokenizer (special tokens skipped). */
export function completionText(engine: ServingEngine): IncrementalDetokenizer {
  return new IncrementalDetokenizer(engine.tokenizer, { skipSpecialTokens: true });
}

/** The first-token fields of the prefill answer and the solo `first` event. */
export function firstToken(engine: ServingEngine, token: number, promptTokens: number, seqLen: number, maxTokens: number, prefillMs: number): FirstToken {
  const eos = isEos(engine, token);
  return { token, text: eos ? "" : completionText(engine).push(token), eos, promptTokens, seqLen, maxTokens, prefillMs: round(prefillMs) };
}

export interface DecodeLoop {
  engine: ServingEngine;
  batcher: DecodeBatcher;
  stream: EngineStream;
  first: number;
  maxTokens: number;
  sampling: SamplingParams;
  /** Writes one event; resolves when the client took it (backpressure). */
  write(ev: WorkerEvent): Promise<void>;
  /** True once the client left or the request was ended from outside. */
  aborted(): boolean;
}

/**
 * Decodes from `stream` until max_tokens, an end-of-sequence token or abort; writes token events
 * and a final done event. Returns the finish reason ("aborted" when stopped early) and the time.
 */
export async function decodeLoop(d: DecodeLoop): Promise<{ finish: "stop" | "length" | "aborted"; decodeMs: number }> {
  const text = completionText(d.engine);
  text.push(d.first);
  let count = 1;
  let cur = d.first;
  let finish: "stop" | "length" = isEos(d.engine, d.first) ? "stop" : "length";
  const t0 = performance.now();
  while (finish !== "stop" && count < d.maxTokens) {
    if (d.aborted()) return { finish: "aborted", decodeMs: performance.now() - t0 };
    const next = await d.batcher.step(d.stream, cur, d.sampling);
    count++;
    if (isEos(d.engine, next)) {
      finish = "stop";
      break;
    }
    await d.write({ type: "token", index: count - 1, token: next, text: text.push(next) });
    cur = next;
  }
  const decodeMs = performance.now() - t0;
  if (d.aborted()) return { finish: "aborted", decodeMs };
  await d.write({ type: "done", finishReason: finish, completionTokens: count, text: text.flush(), decodeMs: round(decodeMs) });
  return { finish, decodeMs };
}

export function round(x: number): number {
  return Math.round(x * 1000) / 1000;
}
