// The gateway <-> worker contract as zod schemas, camelCase on the wire: request bodies of every
// worker route, the prefill answer, the NDJSON events of decode and generate, /health and the
// release answer. The worker builds its answers with these types; the gateway parses with them.

import { GrammarSpecSchema } from "@airm/grammar";
import { MAX_TOP_LOGPROBS, SamplingDefaultsSchema, SamplingSchema, validateRequestId } from "@airm/rm-core";
import { z } from "zod";

export const RequestIdSchema = z
  .string()
  .refine(
    (s) => {
      try {
        validateRequestId(s);
        return true;
      } catch {
        return false;
      }
    },
    { message: "must be a valid request id ([A-Za-z0-9._-], no '/')" },
  )
  .describe("one per client request: `cmpl-` + 24 hex digits from the gateway");

export const ChatToolCallSchema = z
  .object({ id: z.string(), name: z.string().min(1), arguments: z.string().describe("the arguments: a JSON object's text") })
  .strict()
  .describe("a call an assistant turn made");

export const ChatMessageSchema = z
  .object({
    role: z.string(),
    content: z.string(),
    toolCalls: z.array(ChatToolCallSchema).optional().describe("assistant turns: the tool calls it made"),
    toolCallId: z.string().optional().describe("tool turns: the call this result answers"),
    name: z.string().optional().describe("tool turns: the tool's name"),
  })
  .strict();
export type ChatMessage = z.infer<typeof ChatMessageSchema>;

export const ChatToolSchema = z
  .object({
    name: z.string().min(1),
    description: z.string().optional(),
    parameters: z.record(z.string(), z.unknown()).describe("the JSON schema of the arguments (an object schema)"),
  })
  .strict()
  .describe("a function the model may call, rendered into the prompt");
export type ChatTool = z.infer<typeof ChatToolSchema>;

/** Exactly one of a text prompt, token ids, or chat messages (rendered with the model's template). */
export const PromptInputSchema = z.union([
  z.object({ prompt: z.string().min(1).describe("text, encoded with the tokenizer's special tokens") }).strict(),
  z.object({ promptTokenIds: z.array(z.number().int().min(0)).min(1).describe("token ids as they are") }).strict(),
  z
    .object({
      messages: z.array(ChatMessageSchema).min(1).describe("rendered with the chat template and the generation prompt"),
      tools: z.array(ChatToolSchema).optional().describe("functions the template renders into the prompt (its `tools`, or a system turn when it has none)"),
    })
    .strict(),
]);

const constraint = GrammarSpecSchema.optional().describe("structured output: the grammar every generated token must keep to (see GrammarSpec)");
const choices = z
  .number()
  .int()
  .min(1)
  .max(256)
  .default(1)
  .describe("choices (a request's n, or best_of): one prefill, then one decode stream each; choice i samples with seed + i");
const ignoreEos = z.boolean().default(false).describe("an end-of-sequence token does not end the completion (it runs to maxTokens)");
const minTokens = z.number().int().min(0).default(0).describe("end-of-sequence tokens cannot be sampled before this many completion tokens");
export type PromptInput = z.infer<typeof PromptInputSchema>;
const resume = z
  .array(z.number().int().min(0))
  .min(1)
  .optional()
  .describe(
    "a migrated request: the completion tokens its client already has (the first included). Prefill runs the prompt and these and draws completion token resume.length; decode continues the count, the penalties, min_tokens, the grammar and the text from them",
  );

const cacheSalt = z
  .string()
  .min(1)
  .max(256)
  .optional()
  .describe("vLLM's cache_salt: KV blocks are shared by prefix caching only between requests with the same salt (tenants apart)");

const loraName = z.string().min(1).max(256).optional().describe("the loaded LoRA adapter (its name) the request runs on; absent: the base model");

const blockHash = z.string().regex(/^[0-9a-f]{64}$/, "a block hash: 64 lowercase hex digits");
const skip = z
  .object({
    blocks: z.number().int().min(1).describe("the prompt's first blocks the decode worker holds"),
    hash: blockHash.describe("the block hash of the last of them, as the decode worker computed it (the prefill side checks its own)"),
  })
  .strict()
  .optional()
  .describe("the decode worker's kv-hold answer: these blocks do not cross (the manifest's held)");

const maxTokens = z.number().int().min(1).nullable().describe("the whole completion, first token included; null: the rest of max_model_len");
const logprobs = z
  .number()
  .int()
  .min(0)
  .max(MAX_TOP_LOGPROBS)
  .nullable()
  .default(null)
  .describe("log-probabilities of each generated token with this many alternatives; null: none");

/** POST /internal/prefill (prefill role) and POST /internal/generate (solo role). */
export const PrefillRequestSchema = z
  .object({
    requestId: RequestIdSchema,
    input: PromptInputSchema.describe("the prompt: see PromptInput"),
    maxTokens,
    sampling: SamplingSchema.default({}).describe("how tokens are chosen; prefill samples the first, decode the rest"),
    logprobs,
    echo: z.boolean().default(false).describe("return the prompt's tokens and text (`first.echo`), scored when logprobs is set"),
    constraint,
    ignoreEos,
    minTokens,
    n: choices,
    resume,
    cacheSalt,
    lora: loraName,
    skip,
  })
  .strict()
  .refine((b) => !(b.constraint && b.ignoreEos), { message: "ignoreEos cannot go with a constraint: the grammar ends at its end-of-sequence token", path: ["ignoreEos"] })
  .refine((b) => !(b.resume && b.n > 1), { message: "resume continues one choice: it cannot go with n > 1", path: ["resume"] })
  .refine((b) => !(b.resume && b.echo), { message: "resume cannot go with echo: the prompt was answered before", path: ["resume"] });
export type PrefillRequest = z.input<typeof PrefillRequestSchema>;
export const GenerateRequestSchema = PrefillRequestSchema;
export type GenerateRequest = PrefillRequest;

/** POST /internal/decode (decode role). */
export const DecodeRequestSchema = z
  .object({
    requestId: RequestIdSchema,
    maxTokens,
    sampling: SamplingSchema.default({}).describe("the same sampling prefill used (one seed: the token at position p is drawn with (seed, p))"),
    kvTimeoutMs: z.number().int().min(1).optional().describe("how long each KV pull waits for its blob (default: the worker's)"),
    logprobs,
    constraint: constraint.describe("the same constraint prefill used: decode's matcher replays the first token, then continues"),
    ignoreEos,
    minTokens,
    n: choices.describe("the choices prefill drew first tokens for (the KV manifest's firstTokens)"),
    resume: resume.describe("the same resume prefill ran (the KV's last positions hold these tokens)"),
    cacheSalt: cacheSalt.describe("the same cache_salt prefill ran with: the blocks this stream leaves in the prefix cache are kept under it"),
    lora: loraName.describe("the same LoRA adapter prefill ran with: the KV manifest must name it (else kv_integrity_error on field lora)"),
  })
  .strict()
  .refine((b) => !(b.constraint && b.ignoreEos), { message: "ignoreEos cannot go with a constraint: the grammar ends at its end-of-sequence token", path: ["ignoreEos"] })
  .refine((b) => !(b.resume && b.n > 1), { message: "resume continues one choice: it cannot go with n > 1", path: ["resume"] });
export type DecodeRequest = z.input<typeof DecodeRequestSchema>;

/**
 * POST /internal/kv-hold (decode role): which of the prompt's first blocks this worker's prefix
 * cache holds; they are held for the request until its decode imports the rest (or the hold
 * expires), so the prefill side need not send them.
 */
export const KvHoldRequestSchema = z
  .object({
    requestId: RequestIdSchema,
    input: PromptInputSchema.describe("the prompt, as the prefill request will carry it"),
    cacheSalt,
    lora: loraName,
    resume: resume.describe("the same resume the prefill request will carry"),
  })
  .strict();
export type KvHoldRequest = z.input<typeof KvHoldRequestSchema>;
export const KvHoldResponseSchema = z
  .object({
    requestId: z.string(),
    held: z
      .object({ blocks: z.number().int().min(1), hash: blockHash, positions: z.number().int().min(1) })
      .strict()
      .nullable()
      .describe("the blocks held (whole blocks from position 0, short of the prompt's last token), or null"),
    promptTokens: z.number().int().min(1).describe("the prompt's tokens as this worker counted them"),
  })
  .strict();
export type KvHoldResponse = z.infer<typeof KvHoldResponseSchema>;

/** POST /internal/lora/load (every role): load a PEFT adapter folder under a name (vLLM's /v1/load_lora_adapter). */
export const LoraLoadRequestSchema = z
  .object({
    name: z.string().min(1).max(256).describe("the name requests use in `model` (vLLM's lora_name)"),
    path: z.string().min(1).describe("the adapter on the worker's file system: a PEFT folder (adapter_config.json + adapter_model.safetensors) or a llama.cpp GGUF LoRA file"),
  })
  .strict();
export type LoraLoadRequest = z.input<typeof LoraLoadRequestSchema>;
export const LoraInfoSchema = z
  .object({
    name: z.string(),
    path: z.string(),
    rank: z.number().int().min(1),
    fingerprint: z.string().describe("identifies the adapter's weights and configuration (the KV manifest names it)"),
    resident: z.boolean().describe("its weights are resident now (else the next request naming it reloads them)"),
  })
  .strict();
export type LoraInfoBody = z.infer<typeof LoraInfoSchema>;
/** POST /internal/lora/unload (every role). */
export const LoraUnloadRequestSchema = z.object({ name: z.string().min(1).max(256) }).strict();
export type LoraUnloadRequest = z.input<typeof LoraUnloadRequestSchema>;
export const LoraUnloadResponseSchema = z.object({ name: z.string(), unloaded: z.literal(true) }).strict();
export type LoraUnloadResponse = z.infer<typeof LoraUnloadResponseSchema>;

/** POST /internal/tokenize (every role): a prompt or chat messages as the model's token ids. */
export const TokenizeRequestSchema = z
  .object({
    input: PromptInputSchema.describe("the text or chat messages (token ids come back as they are)"),
    addSpecialTokens: z.boolean().optional().describe("run the tokenizer's post-processor (BOS...); default: true for a prompt, false for messages"),
    addGenerationPrompt: z.boolean().default(true).describe("messages: end with the assistant's turn header"),
  })
  .strict();
export type TokenizeRequest = z.input<typeof TokenizeRequestSchema>;
export const TokenizeResponseSchema = z
  .object({
    tokens: z.array(z.number().int().min(0)),
    tokenStrs: z.array(z.string()).describe("each token decoded alone"),
    maxModelLen: z.number().int().min(1).describe("max_model_len: the longest request (prompt + max_tokens) served"),
  })
  .strict();
export type TokenizeResponse = z.infer<typeof TokenizeResponseSchema>;

/** POST /internal/detokenize (every role): token ids as text (special tokens kept). */
export const DetokenizeRequestSchema = z.object({ tokens: z.array(z.number().int().min(0)) }).strict();
export type DetokenizeRequest = z.input<typeof DetokenizeRequestSchema>;
export const DetokenizeResponseSchema = z.object({ text: z.string() }).strict();
export type DetokenizeResponse = z.infer<typeof DetokenizeResponseSchema>;

export const RELEASE_REASONS = ["done", "client_gone", "decode_rejected", "prefill_failed", "aborted", "deadline"] as const;
export type ReleaseReason = (typeof RELEASE_REASONS)[number];

/** POST /internal/release (every role). */
export const ReleaseRequestSchema = z.object({ requestId: RequestIdSchema, reason: z.enum(RELEASE_REASONS).default("done") }).strict();
export type ReleaseRequest = z.input<typeof ReleaseRequestSchema>;
export const ReleaseResponseSchema = z.object({ requestId: z.string(), released: z.boolean().describe("false when no lease was held here") }).strict();
export type ReleaseResponse = z.infer<typeof ReleaseResponseSchema>;

/** One token with its log-probability (natural log; -9999 stands for impossible, as in vLLM). */
export const LogprobEntrySchema = z
  .object({
    token: z.number().int().min(0),
    text: z.string().describe("the token decoded alone (special tokens included; U+FFFD inside a UTF-8 sequence)"),
    bytes: z.array(z.number().int().min(0).max(255)).describe("the token's own bytes"),
    logprob: z.number(),
  })
  .strict();
export type LogprobEntry = z.infer<typeof LogprobEntrySchema>;

/** A chosen token's log-probability and the most likely alternatives at its position. */
export const TokenLogprobsSchema = LogprobEntrySchema.extend({ top: z.array(LogprobEntrySchema).describe("best first, as many as asked for") }).strict();
export type TokenLogprobsEntry = z.infer<typeof TokenLogprobsSchema>;

/** The prompt as prefill saw it, for echo: its text and tokens (scored given their prefix when logprobs was asked). */
export const EchoSchema = z
  .object({
    text: z.string().describe("the prompt tokens decoded together"),
    tokens: z
      .array(LogprobEntrySchema.extend({ logprob: z.number().nullable(), top: z.array(LogprobEntrySchema) }).strict())
      .describe("logprob null (and top empty) for the first token and when no logprobs were asked for"),
  })
  .strict();
export type Echo = z.infer<typeof EchoSchema>;

/** The first token, computed by prefill: in the prefill answer (PD) or the `first` event (solo). */
export const FirstTokenSchema = z
  .object({
    token: z.number().int().min(0),
    text: z.string().describe('what the detokenizer emits after it (may be "" inside a UTF-8 sequence)'),
    eos: z.boolean().describe("it is an end-of-sequence token"),
    promptTokens: z.number().int().min(1),
    seqLen: z.number().int().min(1).describe("the context bucket S of the compiled variant the request fits (what an NPU runs it on)"),
    maxTokens: z.number().int().min(1).describe("the effective max_tokens (resolved when null was sent)"),
    prefillMs: z.number().min(0),
    cachedTokens: z.number().int().min(0).optional().describe("prompt tokens whose KV came from the prefix cache (absent: 0)"),
    logprobs: TokenLogprobsSchema.optional().describe("when the request asked for logprobs"),
    echo: EchoSchema.optional().describe("when the request asked for echo"),
    others: z
      .array(
        z
          .object({ token: z.number().int().min(0), text: z.string(), eos: z.boolean(), logprobs: TokenLogprobsSchema.optional() })
          .strict()
          .describe("one more choice's first token"),
      )
      .optional()
      .describe("n > 1: the first tokens of choices 1, 2, ... (this object is choice 0's)"),
  })
  .strict();
export type FirstToken = z.infer<typeof FirstTokenSchema>;

/** The answer of POST /internal/prefill, sent after the manifest was pushed. */
export const PrefillResponseSchema = z
  .object({
    requestId: z.string(),
    first: FirstTokenSchema,
    transport: z.string().describe("the KV transport the blobs went through"),
    kvPushMs: z.number().min(0).describe("push time not hidden by the prefill"),
    kvBytes: z.number().int().min(0),
  })
  .strict();
export type PrefillResponse = z.infer<typeof PrefillResponseSchema>;

/** One line of the NDJSON stream of /internal/decode and /internal/generate. */
export const WorkerEventSchema = z.discriminatedUnion("type", [
  FirstTokenSchema.extend({ type: z.literal("first") }).describe("solo only: the first token"),
  z
    .object({
      type: z.literal("ready"),
      promptTokens: z.number().int().min(1),
      seqLen: z.number().int().min(1).describe("the context bucket S of the compiled variant the request fits"),
      kvLoadMs: z.number().min(0).describe("pull + check + import after the last blob arrived"),
      kvWaitMs: z.number().min(0).describe("waiting for prefill to push"),
    })
    .strict()
    .describe("decode only: the KV is imported"),
  z
    .object({
      type: z.literal("token"),
      choice: z.number().int().min(1).optional().describe("the choice it belongs to (absent: 0)"),
      index: z.number().int().min(1).describe("position in the completion (0 is the first token)"),
      token: z.number().int().min(0),
      text: z.string().describe("the detokenizer's delta"),
      logprobs: TokenLogprobsSchema.optional().describe("when the request asked for logprobs"),
    })
    .strict(),
  z
    .object({
      type: z.literal("done"),
      choice: z.number().int().min(1).optional().describe("the choice that ended (absent: 0); the stream ends after every choice's done"),
      finishReason: z.enum(["stop", "length"]),
      completionTokens: z.number().int().min(1).describe("first token and end-of-sequence token included"),
      text: z.string().describe("what the detokenizer still held back"),
      decodeMs: z.number().min(0),
    })
    .strict(),
  z
    .object({
      type: z.literal("error"),
      status: z.number().int(),
      code: z.string(),
      param: z.string().nullable(),
      message: z.string(),
    })
    .strict()
    .describe("the stream ends after it"),
]);
export type WorkerEvent = z.infer<typeof WorkerEventSchema>;
export type FirstEvent = Extract<WorkerEvent, { type: "first" }>;
export type TokenEvent = Extract<WorkerEvent, { type: "token" }>;
export type DoneEvent = Extract<WorkerEvent, { type: "done" }>;
export type ErrorEvent = Extract<WorkerEvent, { type: "error" }>;

export const ROLES = ["prefill", "decode", "solo"] as const;

export const ModelSummarySchema = z
  .object({
    id: z.string(),
    architecture: z.string(),
    layers: z.number().int(),
    kvHeads: z.number().int(),
    headDim: z.number().int(),
    vocabSize: z.number().int(),
    modelFingerprint: z.string(),
    numericsFingerprint: z.string(),
    generationDefaults: SamplingDefaultsSchema.optional().describe(
      "the model's sampling defaults (generation_config.json or the GGUF's general.sampling.* keys; none with AIRM_GENERATION_CONFIG=vllm): the gateway gives them to a request that leaves the field out",
    ),
  })
  .strict();

/** GET /health: 200 when ready, 503 while loading, draining (it stops) or after a fatal load error. */
/** What a worker measured for the disaggregation decision (rm-core's disaggregation.ts); null: not measured yet. */
export const WorkerEstimatesSchema = z
  .object({
    prefill: z
      .object({ fixedMs: z.number(), msPerToken: z.number() })
      .strict()
      .nullable()
      .describe("this worker's prefill time model, ms = fixedMs + msPerToken x computed tokens (least squares over its last 64 prefills)"),
    kvBandwidth: z.number().nullable().describe("decode: bytes/s of its KV pulls while the bytes were moving (EWMA)"),
    kvBytes: z.number().nullable().describe("decode: KV bytes per request received, the prompt's blocks (EWMA)"),
    kvBytesPerToken: z
      .number()
      .nullable()
      .optional()
      .describe("decode: KV bytes received per prompt token, block rounding included (EWMA); what a prompt of n tokens moves is about n times this"),
    localPrefill: z.boolean().describe("a decode worker that also prefills whole requests (--local-prefill)"),
  })
  .strict();
export type WorkerEstimates = z.infer<typeof WorkerEstimatesSchema>;

export const WorkerHealthSchema = z
  .object({
    status: z.enum(["ok", "loading", "draining", "failed"]),
    ready: z.boolean(),
    role: z.enum(ROLES),
    backend: z.string(),
    engine: z.string(),
    device: z.object({ vendor: z.string(), path: z.string(), device: z.string().nullable(), detail: z.string() }).strict().nullable(),
    model: ModelSummarySchema.nullable(),
    maxModelLen: z.number().int().nullable().describe("max_model_len: the longest request (prompt + max_tokens) served"),
    variants: z.array(z.object({ batch: z.number().int(), seqLen: z.number().int() }).strict()).describe("the (batch, context bucket) graphs an NPU compiles"),
    kvCache: z
      .object({
        blockSize: z.number().int(),
        totalBlocks: z.number().int(),
        usedBlocks: z.number().int().describe("held by requests and set aside for admitted ones"),
        freeBlocks: z.number().int(),
        cachedBlocks: z.number().int().describe("kept prompt prefixes no request holds (given back first)"),
        preemptions: z.number().int(),
      })
      .strict()
      .nullable()
      .describe("the paged KV cache (null while loading)"),
    transport: z.string().nullable(),
    leases: z.object({ outstanding: z.number().int(), expired: z.number().int() }).strict(),
    requests: z.object({ waiting: z.number().int(), running: z.number().int(), slots: z.number().int().describe("requests that run at once (max_num_seqs)") }).strict(),
    error: z.string().nullable().describe("why the load failed"),
    estimates: WorkerEstimatesSchema.optional().describe("the disaggregation decision's inputs measured here (absent from workers before this field)"),
    lora: z
      .object({ maxLoras: z.number().int(), maxLoraRank: z.number().int(), adapters: z.array(LoraInfoSchema) })
      .strict()
      .optional()
      .describe("LoRA adapters (--enable-lora): the limits and every loaded adapter; absent when the worker serves none"),
    prefixCache: z
      .object({
        enabled: z.boolean().describe("prefix caching by block is on (--enable-prefix-caching)"),
        instance: z.string().describe("this worker process's id: a router that sees it change drops what it indexed of the worker"),
        events: z
          .object({
            endpoint: z.string().describe("where its KV events are published (a wildcard host means the worker's own)"),
            replayEndpoint: z.string().nullable().describe("its replay endpoint (null: none)"),
            topic: z.string(),
          })
          .strict()
          .nullable()
          .describe("its KV events (--kv-events-config), null when it publishes none"),
      })
      .strict()
      .optional()
      .describe("the prefix cache and its KV events, for a prefix-aware router (absent while loading)"),
  })
  .strict();
export type WorkerHealth = z.infer<typeof WorkerHealthSchema>;
