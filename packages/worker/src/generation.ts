// What the prefill, decode and generate routes share: turning a prompt input into token ids,
// resolving max_tokens and the variant, the first-token fields, and the decode loop that emits
// token and done events. Knows the engine and the event types; not HTTP.

import { ApiError, type Echo, type FirstToken, type LogprobEntry, type PromptInput, type TokenLogprobsEntry, type WorkerEvent } from "@airm/internal-api";
import {
  ContextOverflowError,
  IncrementalDetokenizer,
  blocksFor,
  choiceSeed,
  isAirmError,
  type PrefillResult,
  type SamplingParams,
  type TokenConstraint,
  type TokenLogprobs,
} from "@airm/rm-core";
import type { GrammarMatcher } from "@airm/grammar";
import type { DecodeBatcher } from "./decode-batcher.ts";
import { EosBan } from "./eos-ban.ts";
import type { EngineStream, ServingEngine } from "./serving-engine.ts";

/**
 * Token ids of a prompt input: a text prompt with the tokenizer's special tokens (BOS...), chat
 * messages rendered with the template and its generation prompt and no added special tokens (the
 * template writes them); `o` overrides either. Throws ApiError 400 for ids outside the
 * vocabulary, a model without chat template, an empty prompt.
 */
export function tokenize(engine: ServingEngine, input: PromptInput, o: { addSpecialTokens?: boolean; addGenerationPrompt?: boolean } = {}): number[] {
  let ids: number[];
  if ("promptTokenIds" in input) {
    const bad = input.promptTokenIds.find((t) => t >= engine.model.vocabSize);
    if (bad !== undefined) throw new ApiError(400, "invalid_request", `token id ${bad} is outside the vocabulary (size ${engine.model.vocabSize})`, "prompt");
    ids = input.promptTokenIds;
  } else if ("messages" in input) {
    if (!engine.tokenizer.renderChat) throw new ApiError(400, "invalid_request", `model ${engine.model.id} has no chat template; use /v1/completions`, "messages");
    const text = engine.tokenizer.renderChat(input.messages, { addGenerationPrompt: o.addGenerationPrompt ?? true, ...(input.tools ? { tools: input.tools } : {}) });
    ids = engine.tokenizer.encode(text, { addSpecialTokens: o.addSpecialTokens ?? false });
  } else {
    ids = engine.tokenizer.encode(input.prompt, { addSpecialTokens: o.addSpecialTokens ?? true });
  }
  if (ids.length === 0) throw new ApiError(400, "invalid_request", "the prompt is empty after tokenization", "prompt");
  return ids;
}

/**
 * Resolves max_tokens (null: the rest of max_model_len) and the context bucket S of the compiled
 * variant the request fits. Throws ContextOverflowError (a 400 naming the limit) when prompt +
 * max_tokens exceeds max_model_len, or when the request's `n` choices could never fit the whole KV
 * cache at once.
 */
export function planRequest(engine: ServingEngine, promptTokens: number, maxTokens: number | null, n = 1): { maxTokens: number; seqLen: number } {
  const kv = engine.kvCache();
  const m = maxTokens ?? kv.maxModelLen - promptTokens;
  if (m < 1) throw new ContextOverflowError(promptTokens + 1, kv.maxModelLen, `the prompt alone has ${promptTokens} tokens`);
  const variant = engine.pickVariant(promptTokens, m);
  // Every choice holds the blocks of its completion; the prompt's full blocks are shared.
  const whole = blocksFor(promptTokens + m, kv.blockSize);
  const need = whole + (n - 1) * (whole - Math.floor(promptTokens / kv.blockSize));
  if (need > kv.totalBlocks) {
    throw new ContextOverflowError(
      promptTokens + m,
      kv.totalBlocks * kv.blockSize,
      `${n > 1 ? `${n} choices need ${need} blocks; ` : ""}${kv.totalBlocks} blocks of ${kv.blockSize} positions; raise --kv-cache-memory`,
      "the KV cache",
    );
  }
  return { maxTokens: m, seqLen: variant.seqLen };
}

/** What a prefill runs: the prompt, a migrated request's delivered tokens after it, and the plan for the rest. */
export interface ResumedPlan {
  /** The prompt's ids. */
  prompt: number[];
  /** The completion tokens the client already has (empty unless the request resumes). */
  resumed: number[];
  /** What the prefill computes: the prompt, then the resumed tokens. */
  tokens: number[];
  /** The whole completion's max_tokens (the resumed tokens included). */
  maxTokens: number;
  seqLen: number;
}

/** Throws 400 naming resume when it holds an id outside the vocabulary or leaves max_tokens (null: the context's rest) nothing to generate. */
export function checkResume(engine: ServingEngine, resumed: readonly number[], maxTokens: number | null): void {
  const bad = resumed.find((t) => t >= engine.model.vocabSize);
  if (bad !== undefined) throw new ApiError(400, "invalid_request", `resume holds token id ${bad}, outside the vocabulary (size ${engine.model.vocabSize})`, "resume");
  if (maxTokens !== null && resumed.length >= maxTokens) {
    throw new ApiError(400, "invalid_request", `resume holds ${resumed.length} tokens: max_tokens ${maxTokens} leaves none to generate`, "resume");
  }
}

/**
 * Plans a prefill of `prompt` and the request's `resume` tokens: max_tokens counts the whole
 * completion, so the resumed tokens are part of it and at least one must be left (else 400).
 */
export function resumedPlan(engine: ServingEngine, prompt: number[], b: { maxTokens: number | null; resume?: number[]; n?: number }): ResumedPlan {
  const resumed = b.resume ?? [];
  checkResume(engine, resumed, b.maxTokens);
  const rest = b.maxTokens === null ? null : b.maxTokens - resumed.length;
  const tokens = resumed.length ? [...prompt, ...resumed] : prompt;
  const plan = planRequest(engine, tokens.length, rest, b.n ?? 1);
  return { prompt, resumed, tokens, maxTokens: plan.maxTokens + resumed.length, seqLen: plan.seqLen };
}

export function isEos(engine: ServingEngine, token: number): boolean {
  return engine.tokenizer.eosTokenIds.includes(token) || engine.model.eosTokenIds.includes(token);
}

/** Throws ApiError 400 naming n when a request asks for more choices than the worker runs at once (they could never all run). */
export function checkChoices(slots: number, n: number): void {
  if (n > slots) throw new ApiError(400, "invalid_request", `n=${n} choices exceed the ${slots} requests this worker runs at once (max_num_seqs); ask for at most ${slots}`, "n");
}

/** Throws ApiError 400 naming logit_bias when it names an id outside the model's vocabulary (before any stream opens). */
export function checkLogitBias(engine: ServingEngine, sampling: SamplingParams): void {
  const bad = sampling.logitBias?.find(([id]) => id >= engine.model.vocabSize);
  if (bad) throw new ApiError(400, "invalid_request", `logit_bias names token ${bad[0]}, outside this model's vocabulary [0, ${engine.model.vocabSize})`, "logit_bias");
}

/**
 * What restricts the completion token at `index` (0: the first): the request's grammar matcher,
 * with the end-of-sequence ids banned while index < minTokens. Undefined when nothing does.
 */
export function stepConstraint(engine: ServingEngine, matcher: TokenConstraint | undefined, minTokens: number, index: () => number): TokenConstraint | undefined {
  if (minTokens <= 0) return matcher;
  const eos = [...new Set([...engine.tokenizer.eosTokenIds, ...engine.model.eosTokenIds])];
  return new EosBan(engine.model.vocabSize, eos, matcher, () => index() < minTokens);
}

/** The completion's detokenizer (special tokens skipped). */
export function completionText(engine: ServingEngine): IncrementalDetokenizer {
  return new IncrementalDetokenizer(engine.tokenizer, { skipSpecialTokens: true });
}

/** The completion's detokenizer after `tokens` (a resumed request's delivered tokens, their text already sent). */
export function primedText(engine: ServingEngine, tokens: readonly number[]): IncrementalDetokenizer {
  const text = completionText(engine);
  for (const t of tokens) text.push(t);
  return text;
}

/** The output counts of a resumed request's delivered tokens (what the penalties read). */
function counts(tokens: readonly number[]): Map<number, number> {
  const m = new Map<number, number>();
  for (const t of tokens) m.set(t, (m.get(t) ?? 0) + 1);
  return m;
}

/** What the contract calls impossible: -Infinity does not survive JSON, so -9999 as vLLM does. */
const IMPOSSIBLE = -9999;

/** One token as a logprob entry: its own text and bytes, and its log-probability. */
function entry(engine: ServingEngine, token: number, logprob: number): LogprobEntry {
  const text = engine.tokenizer.decode([token]);
  const bytes = engine.tokenizer.tokenBytes ? engine.tokenizer.tokenBytes(token) : new TextEncoder().encode(text);
  return { token, text, bytes: [...bytes], logprob: Math.max(IMPOSSIBLE, logprob) };
}

/** A chosen token's log-probabilities in the contract's form (texts and bytes added). */
export function logprobsEntry(engine: ServingEngine, lp: TokenLogprobs): TokenLogprobsEntry {
  return { ...entry(engine, lp.token, lp.logprob), top: lp.top.map((t) => entry(engine, t.token, t.logprob)) };
}

/** The prompt for echo: its text and tokens, scored when the prefill computed prompt log-probabilities. */
export function echoOf(engine: ServingEngine, tokens: number[], scored: TokenLogprobs[] | undefined): Echo {
  return {
    text: engine.tokenizer.decode(tokens),
    tokens: tokens.map((t, i) => {
      const lp = i > 0 ? scored?.[i - 1] : undefined;
      return lp ? logprobsEntry(engine, lp) : { ...entry(engine, t, 0), logprob: null, top: [] };
    }),
  };
}

/** What the request asked the prefill to compute besides the first token. */
export function prefillExtras(b: { logprobs: number | null; echo: boolean; cacheSalt?: string; lora?: string }): {
  logprobs?: number;
  promptLogprobs?: boolean;
  cacheSalt?: string;
  lora?: string;
} {
  const salt = { ...(b.cacheSalt === undefined ? {} : { cacheSalt: b.cacheSalt }), ...(b.lora === undefined ? {} : { lora: b.lora }) };
  if (b.logprobs === null) return salt;
  return b.echo ? { ...salt, logprobs: b.logprobs, promptLogprobs: true } : { ...salt, logprobs: b.logprobs };
}

/** The first-token fields of the prefill answer and the solo `first` event. */
export function firstToken(
  engine: ServingEngine,
  res: Pick<PrefillResult, "firstToken" | "firstLogprobs" | "promptLogprobs" | "cachedTokens" | "others">,
  prompt: { tokens: number[]; echo: boolean },
  seqLen: number,
  maxTokens: number,
  prefillMs: number,
  resumed: readonly number[] = [],
): FirstToken {
  const token = res.firstToken;
  const eos = isEos(engine, token);
  const first: FirstToken = {
    token,
    text: eos ? "" : primedText(engine, resumed).push(token),
    eos,
    promptTokens: prompt.tokens.length,
    seqLen,
    maxTokens,
    prefillMs: round(prefillMs),
    cachedTokens: res.cachedTokens ?? 0,
  };
  if (res.firstLogprobs) first.logprobs = logprobsEntry(engine, res.firstLogprobs);
  if (prompt.echo) first.echo = echoOf(engine, prompt.tokens, res.promptLogprobs);
  if (res.others?.length) {
    first.others = res.others.map((o) => {
      const end = isEos(engine, o.token);
      return { token: o.token, text: end ? "" : completionText(engine).push(o.token), eos: end, ...(o.logprobs ? { logprobs: logprobsEntry(engine, o.logprobs) } : {}) };
    });
  }
  return first;
}

/** Every choice's first token of a prefill result (choice 0 first). */
export function firstTokens(res: Pick<PrefillResult, "firstToken" | "others">): number[] {
  return [res.firstToken, ...(res.others ?? []).map((o) => o.token)];
}

export interface DecodeLoop {
  engine: ServingEngine;
  batcher: DecodeBatcher;
  stream: EngineStream;
  first: number;
  /** The choice this loop decodes (its events say so when it is not 0). */
  choice: number;
  /** The prompt's ids (repetition_penalty reads them). */
  prompt: ReadonlySet<number>;
  /**
   * The tokens whose KV the stream held when the loop started (the prompt, and a migrated
   * request's delivered tokens): with the tokens fed since, what a preempted stream is recomputed from.
   */
  positions: readonly number[];
  /** Waits for blocks for a preempted stream, then recomputes its KV from `tokens` (see ServingEngine.recompute). */
  recompute(stream: EngineStream, tokens: number[]): Promise<void>;
  maxTokens: number;
  sampling: SamplingParams;
  /** Alternatives per token when the request asked for log-probabilities, else null. */
  logprobs: number | null;
  /** The request's grammar matcher (structured outputs), already past the first token. */
  matcher?: GrammarMatcher;
  /** An end-of-sequence token does not end the completion. */
  ignoreEos: boolean;
  /** End-of-sequence tokens are banned before this many completion tokens. */
  minTokens: number;
  /**
   * A migrated request's completion tokens before `first` (empty otherwise): the count, the
   * event indices, the penalties and the text continue from them.
   */
  resumed?: readonly number[];
  /** Writes one event; resolves when the client took it (backpressure). */
  write(ev: WorkerEvent): Promise<void>;
  /** Told, at each step, how many streams shared the engine call (the decode batch size). */
  onBatch?(size: number): void;
  /** Told of each token a step generated (vllm:generation_tokens_total), whether or not it ends the stream. */
  onToken?(): void;
  /** True once the client left or the request was ended from outside. */
  aborted(): boolean;
}

/**
 * Decodes from `stream` until max_tokens, an end-of-sequence token or abort; writes token events
 * and a final done event. Returns the finish reason ("aborted" when stopped early) and the time.
 */
export async function decodeLoop(d: DecodeLoop): Promise<{ finish: "stop" | "length" | "aborted"; decodeMs: number }> {
  const resumed = d.resumed ?? [];
  const text = primedText(d.engine, resumed);
  text.push(d.first);
  let count = resumed.length + 1;
  let cur = d.first;
  const ends = (t: number) => !d.ignoreEos && isEos(d.engine, t);
  let finish: "stop" | "length" = ends(d.first) ? "stop" : "length";
  const constraint = stepConstraint(d.engine, d.matcher, d.minTokens, () => count);
  const output = counts([...resumed, d.first]);
  const history = { output, prompt: d.prompt };
  const choice = d.choice ? { choice: d.choice } : {};
  // Tokens appended to the stream by the steps so far (a recompute after preemption needs them).
  const fed: number[] = [];
  const t0 = performance.now();
  while (finish !== "stop" && count < d.maxTokens) {
    if (d.aborted()) return { finish: "aborted", decodeMs: performance.now() - t0 };
    let next: Awaited<ReturnType<DecodeBatcher["step"]>>;
    try {
      next = await d.batcher.step(
        {
          stream: d.stream,
          token: cur,
          sampling: d.sampling,
          history,
          ...(d.logprobs === null ? {} : { logprobs: d.logprobs }),
          ...(constraint ? { constraint } : {}),
        },
        d.onBatch,
      );
    } catch (e) {
      if (!isAirmError(e, "PREEMPTED")) throw e;
      // The engine took the stream's blocks for older streams: once blocks come back its KV is
      // recomputed from its tokens (the same bits), and the same step runs again.
      await d.recompute(d.stream, [...d.positions, ...fed]);
      continue;
    }
    fed.push(cur);
    count++;
    d.onToken?.();
    output.set(next.token, (output.get(next.token) ?? 0) + 1);
    if (ends(next.token)) {
      finish = "stop";
      break;
    }
    // The grammar thread starts on the next mask now, while this token is written and the next step runs.
    d.matcher?.advance(next.token);
    const ev: WorkerEvent = { type: "token", ...choice, index: count - 1, token: next.token, text: text.push(next.token) };
    if (next.logprobs) ev.logprobs = logprobsEntry(d.engine, next.logprobs);
    await d.write(ev);
    cur = next.token;
  }
  const decodeMs = performance.now() - t0;
  if (d.aborted()) return { finish: "aborted", decodeMs };
  await d.write({ type: "done", ...choice, finishReason: finish, completionTokens: count, text: text.flush(), decodeMs: round(decodeMs) });
  return { finish, decodeMs };
}

/** A request's choices to decode: one stream, first token and (with a constraint) matcher each. */
export interface Choices extends Omit<DecodeLoop, "stream" | "first" | "choice" | "matcher" | "prompt" | "positions"> {
  streams: EngineStream[];
  firsts: number[];
  matchers: (GrammarMatcher | undefined)[];
  /** The prompt's ids. */
  prompt: number[];
  /** The tokens whose KV the streams held at the start (the prompt, and resumed tokens). */
  positions: readonly number[];
}

/**
 * Decodes every choice at once (their steps share the batch): choice i samples with
 * choiceSeed(seed, i). The first failure stops the others and is thrown. Returns "aborted" when
 * any stopped early, and the longest decode time.
 */
export async function decodeChoices(c: Choices): Promise<{ finish: "done" | "aborted"; decodeMs: number }> {
  let failed = false;
  const prompt = new Set(c.prompt);
  const runs = await Promise.allSettled(
    c.streams.map((stream, i) =>
      decodeLoop({
        ...c,
        stream,
        first: c.firsts[i],
        choice: i,
        prompt,
        matcher: c.matchers[i],
        sampling: i === 0 ? c.sampling : { ...c.sampling, seed: choiceSeed(c.sampling.seed, i) },
        aborted: () => failed || c.aborted(),
      }).catch((e) => {
        failed = true;
        throw e;
      }),
    ),
  );
  const failure = runs.find((r) => r.status === "rejected");
  if (failure) throw (failure as PromiseRejectedResult).reason;
  const done = runs.map((r) => (r as PromiseFulfilledResult<{ finish: string; decodeMs: number }>).value);
  return { finish: done.some((r) => r.finish === "aborted") ? "aborted" : "done", decodeMs: Math.max(...done.map((r) => r.decodeMs)) };
}

export function round(x: number): number {
  return Math.round(x * 1000) / 1000;
}
