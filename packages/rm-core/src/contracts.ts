// The contracts every @airm plugin and host codes against: KV transports (push/pull and
// copy-only), engines and workloads. Plain types only; implementations live in their packages
// and are checked by annotation (`export const shm: KVTransportPlugin = {...}`).

import type { ConfigSpec, ConfigValues, OptionMap } from "./config/config-spec.ts";
import type { SamplingDefaults, SamplingParams, TokenHistory, TokenLogprobs } from "./sampling.ts";

/** Element type of the KV blobs. */
export type KVDtype = "bf16" | "fp16";

/** The plugin groups hosts resolve by name. */
export const GROUPS = ["airm.kv_transports", "airm.workloads"] as const;
export type PluginGroup = (typeof GROUPS)[number];

// ---------------------------------------------------------------------------------------------
// KV transports

/** Where a transport moves bytes: same machine only, or across nodes. */
export type TransportScope = "same-host" | "cross-node";
/** The memory kinds a transport reads from and writes to. */
export type MemoryTier = "host-dram" | "device-dram" | "dmabuf";

export interface TransportSupport {
  /** Scopes the transport can serve (a cross-node transport also works on one host). */
  scope: TransportScope[];
  tiers: MemoryTier[];
  dtypes: KVDtype[];
  layouts: string[];
  /** True for transports that only copy between bound allocations (plan/submit/wait). */
  copyOnly: boolean;
}

export interface PushOptions {
  dtype?: KVDtype;
  layout?: string;
  /** How long a push may wait for space (ms). */
  timeoutMs?: number;
  /**
   * The CRC-32 (IEEE, as zlib) of `data` when the caller already has it (the prefill worker takes
   * one per blob for the manifest). A transport that checksums blobs then sends this value instead
   * of reading the bytes once more to compute it; the receiving side still checks the bytes against
   * it, so a wrong value fails the transfer (KV_INTEGRITY) and never delivers bytes.
   */
  crc32?: number;
}

export interface PullOptions {
  dtype?: KVDtype;
  layout?: string;
  /** How long to wait for a blob that has not been pushed yet (ms). */
  timeoutMs?: number;
  /** Write the bytes here (its length must be >= the blob's); the result is a view of it. */
  into?: Uint8Array;
}

export interface TransportStats {
  /** Blobs pushed and not yet released. */
  blobs: number;
  bytes: number;
  expired: number;
}

/** What a pull returns: the bytes and, when the transport checked them on arrival, their CRC-32. */
export interface PulledBlob {
  /** The blob; valid until `release(requestId)` of its request or `close()` (copy it to keep it). */
  bytes: Uint8Array;
  /**
   * The CRC-32 (IEEE) the transport measured over exactly these bytes as they arrived, or null
   * when it took none. The KV handoff compares it with the manifest instead of reading the blob again.
   */
  crc32: number | null;
  /**
   * When the bytes began and finished moving to this process (performance.now() ms), waits for a
   * blob not yet pushed excluded; absent when the transport does not time them. The decode worker
   * learns its KV path's bandwidth from these.
   */
  transfer?: { startMs: number; endMs: number };
}

/** A push/pull KV transport. Keys follow `kv-key.ts`. */
export interface KVTransport {
  readonly name: string;
  readonly support: TransportSupport;
  /** Store `data` under `key`. Throws TransportError (NO_SPACE, CLOSED...), InvalidKeyError, UnsupportedError. */
  push(key: string, data: Uint8Array, options?: PushOptions): Promise<void>;
  /** The blob under `key`, waiting up to `timeoutMs` for it. Throws TransportTimeoutError. */
  pull(key: string, options?: PullOptions): Promise<PulledBlob>;
  /** Free every blob of one request, on any side. Idempotent. */
  release(requestId: string): Promise<void>;
  close(): Promise<void>;
  stats?(): TransportStats;
}

/** One copy between two bound allocations, as a copy-only transport plans it. */
export interface CopyRequest {
  requestId: string;
  key: string;
  src: Uint8Array;
  /** The blob's CRC-32 when the pusher has it (a uint32), else the transport computes it. */
  crc32?: number;
}
export interface CopyPlan {
  readonly requestId: string;
  readonly key: string;
  readonly bytes: number;
}
export interface CopyHandle {
  readonly plan: CopyPlan;
}
export type CopyStatus = { ok: true; data: Uint8Array; crc32?: number } | { ok: false; reason: string };

/** A transport that only copies between tiers (nixl, p2p). Hosts use it through FencedTransport. */
export interface CopyOnlyTransport {
  readonly name: string;
  readonly support: TransportSupport;
  plan(request: CopyRequest): Promise<CopyPlan>;
  submit(plan: CopyPlan): Promise<CopyHandle>;
  /** The completion fence: resolves once every copy of the handle completed (or failed). */
  wait(handle: CopyHandle, timeoutMs: number): Promise<CopyStatus>;
  /**
   * Transports whose handles live outside the process (a per-host agent that every worker of the
   * host drives) can take up a copy another process submitted: the handle for `key`, waiting up
   * to `timeoutMs` for it (TransportTimeoutError). Without it a handle is only seen by the
   * process that submitted it.
   */
  adopt?(key: string, timeoutMs: number): Promise<CopyHandle>;
  release(requestId: string): Promise<void>;
  close(): Promise<void>;
  stats?(): TransportStats;
}

export interface ConformanceFixture {
  /** A fresh transport endpoint; called once per side (producer, consumer). */
  factory(): Promise<KVTransport>;
  teardown(): Promise<void>;
  /** Why the fixture cannot run here (absent hardware); every case is then skipped with it. */
  skip?: string;
}

export interface KVTransportPlugin<S extends OptionMap = OptionMap> {
  readonly kind: "kv_transport";
  readonly name: string;
  readonly support: TransportSupport;
  /** Every option create() takes, with its environment variable, default and meaning. */
  readonly config: ConfigSpec<S>;
  /**
   * Opens an endpoint with resolved options. Hosts call `openTransport` (rm-core), which resolves
   * them from explicit options and the host's environment and refuses unknown or bad ones.
   */
  create(options: ConfigValues<S>): Promise<KVTransport | CopyOnlyTransport>;
  /**
   * The set-up the conformance cases run against (a dedicated folder, an in-process relay...),
   * configured from `env` as the host would configure create().
   */
  conformance?(env?: Record<string, string | undefined>): Promise<ConformanceFixture>;
}

/**
 * A process a transport needs beside the workers, declared in the plugin's package.json entry
 * (`"sidecar": {...}`) and started by `airm up` (or a chart's extra Deployment) before the workers.
 * In `args` and `env`, "{host}", "{port}" and "{addr}" (host:port) are replaced.
 */
export interface SidecarSpec {
  /** Transports that name the same sidecar share one process. */
  name: string;
  /** The package whose bin runs it (default: the plugin's own package). */
  package?: string;
  bin: string;
  args: string[];
  /** Port it listens on unless the launcher picks another. */
  port: number;
  /** Variables every worker (and the sidecar) gets so that they find it. */
  env: Record<string, string>;
  /** How a launcher tells it is up: a TCP connect (`"connect"`), or an HTTP GET of a path answering 200. */
  ready: "connect" | { http: string };
}

/**
 * A folder of the transport's own that one cluster's workers share (e.g. the shm root): the
 * launcher creates `<under>/<prefix><launcher pid>`, passes it in `env`, removes it at the end and
 * sweeps folders whose launcher is gone.
 */
export interface ClusterDirSpec {
  env: string;
  under: string;
  prefix: string;
}

/** What a transport's package.json entry may declare besides its export. */
export interface TransportEntryMeta {
  sidecar?: SidecarSpec;
  clusterDir?: ClusterDirSpec;
}

// ---------------------------------------------------------------------------------------------
// Engines

export interface EngineVariant {
  /** Batch width the graph was compiled for. */
  batch: number;
  /** Context length S the graph was compiled for (a bucket: requests up to S positions run on it). */
  seqLen: number;
}

export interface DeviceInfo {
  vendor: "furiosa" | "rebellions" | "cpu";
  /** `native` when the vendor runtime library was found and drives a card, else `cpu-reference`. */
  path: "native" | "cpu-reference";
  /** The device the engine owns, e.g. `rngd:2`, or null on the CPU backend. */
  device: string | null;
  detail: string;
}

export interface ModelInfo {
  id: string;
  architecture: string;
  layers: number;
  kvHeads: number;
  headDim: number;
  vocabSize: number;
  /** sha-256 hex of config + weights. */
  modelFingerprint: string;
  /** sha-256 hex of what decides the numerics: kernel version, summation order, dtype. */
  numericsFingerprint: string;
  eosTokenIds: number[];
  /**
   * Layers that attend only to the last `window` positions (Gemma 3's local layers) and whose
   * blocks out of the window are dropped: their KV blobs hold zeros there. Absent when none do.
   */
  slidingWindow?: { window: number; layers: number[] };
  /** The model's sampling defaults (empty when it has none or the engine was told to ignore them). */
  generationDefaults?: SamplingDefaults;
}

/** What to run: the model and the compiled shape. How (threads, caches, devices) is the engine's config. */
export interface EngineLoadOptions {
  model: string;
  backend?: string;
  chip?: number;
  /** The longest request served (prompt + max_tokens); default the engine's config, else the model's context. */
  maxModelLen?: number;
  /** The decode batch width (caps the compiled batches). */
  batch?: number;
  /** Compiled variants; default from the engine's config (AIRM_VARIANTS) or every default batch at every context bucket up to max_model_len. */
  variants?: EngineVariant[];
  /** Serve LoRA adapters on the base model (vLLM's --enable-lora): the engine then has `loras`. Unset: none. */
  lora?: LoraServingOptions;
}

/** vLLM's LoRA flags: --max-loras, --max-lora-rank, --lora-modules. */
export interface LoraServingOptions {
  /** Adapters whose weights are resident at once (default 4); others reload on demand, least recently used idle one out. */
  maxLoras?: number;
  /** The largest rank an adapter may have (default 64). */
  maxLoraRank?: number;
  /** Adapters loaded at start: name and PEFT folder. */
  modules?: { name: string; path: string }[];
}

/** A LoRA adapter an engine has loaded. */
export interface LoraInfo {
  /** The name requests use (vLLM's lora_name: what a client puts in `model`). */
  name: string;
  /** Its PEFT folder (adapter_config.json + adapter_model.safetensors). */
  path: string;
  rank: number;
  /**
   * Identifies the adapter's weights and configuration: KV computed with it carries it, and a
   * handoff of KV made with another adapter (or none) is refused by it.
   */
  fingerprint: string;
  /** Its weights are resident now (else the next request naming it reloads them). */
  resident: boolean;
}

/** The LoRA adapters of an engine started with `lora` (vLLM's --enable-lora). */
export interface EngineLoras {
  readonly maxLoras: number;
  readonly maxLoraRank: number;
  /**
   * Loads the PEFT folder at `path` as `name`. Throws ConfigError when the name is taken, and
   * a ConfigError naming the field (r, base_model_name_or_path, ...) or tensor that is wrong.
   */
  load(name: string, path: string): Promise<LoraInfo>;
  /** Forgets `name` (false when it was not loaded); streams already running on it finish on it. */
  unload(name: string): boolean;
  /** Every loaded adapter. */
  list(): LoraInfo[];
}

/**
 * Host-side KV of one request in layout rngd-pd/v2: per layer one K and one V array, each the
 * request's blocks of `blockSize` positions in order (kv-layout.ts), positions past n zero.
 */
export interface KVBlobs {
  blockSize: number;
  /** Valid positions [0, n). */
  n: number;
  /**
   * Positions [0, from) are not in the blobs (whole blocks, which the receiver already holds: a
   * handoff that skips what decode has): each blob holds blocks [from / blockSize, ceil(n / blockSize)).
   * Default 0.
   */
  from?: number;
  k: Uint8Array[];
  v: Uint8Array[];
}

/** A request's KV as the engine holds it: blocks of its paged cache, resident on the card (rngd) or in host memory (atom). */
export interface KVStream {
  readonly id: string;
  /** Tokens whose K/V are in the cache (positions [0, length)). */
  readonly length: number;
  /** Blocks of the paged cache the stream holds (shared ones included). */
  readonly blocks: number;
  /** `device`: resident, decode reads it in place; `host`: an input of every step. */
  readonly residence: "device" | "host";
  /** True once the engine took the stream's blocks back to let older streams go on (preemption): recompute it before stepping it again. */
  readonly preempted: boolean;
}

/**
 * Blocks of the paged KV cache set aside for one request before it runs (admission), so that
 * what it was admitted for cannot be taken by others meanwhile. Spent by the prefill, import or
 * recompute it is passed to; `release()` returns what is left (idempotent).
 */
export interface KVReservation {
  readonly blocks: number;
  release(): void;
}

/** The paged KV cache of an engine: its geometry and how much of it is in use. */
export interface KVCacheInfo {
  /** Positions per block. */
  blockSize: number;
  /** Blocks of the pool (the memory budget). */
  totalBlocks: number;
  /** Blocks held by streams and reservations (what vllm:kv_cache_usage_perc divides by totalBlocks). */
  usedBlocks: number;
  /** Blocks a reservation or a growing stream can take now (free ones and cached prefixes that can be evicted). */
  freeBlocks: number;
  /** Blocks that hold kept prompt prefixes and no live stream (evicted first when blocks run out). */
  cachedBlocks: number;
  /** Bytes of one block (K and V, every layer). */
  blockBytes: number;
  /** The longest request (prompt + max_tokens) the engine serves: the model's context, or --max-model-len. */
  maxModelLen: number;
  /** Streams preempted so far (their blocks taken back and their KV recomputed later). */
  preemptions: number;
}

/**
 * The token ids a structured-output matcher allows next (a JSON schema, regex, choice or grammar
 * the worker drives; the engine only applies it). The sampler, greedy or not, sees only these ids.
 */
export interface TokenConstraint {
  /**
   * A bitmask over the vocabulary (bit `i & 31` of word `i >> 5` set: id `i` may come next), or
   * null when every id may. Called once per sampled position, after the forward pass; it may
   * block until the matcher has the mask. Throws GrammarError when the matcher failed.
   */
  allowedTokens(): Int32Array | null;
}

export interface PrefillOptions {
  sampling?: SamplingParams;
  /** Restricts the first token to what a grammar allows (structured outputs). */
  constraint?: TokenConstraint;
  /**
   * First tokens to draw from the prompt's last logits (default 1): choice i with the seed
   * choiceSeed(seed, i), under the same constraint (a request's `n` or `best_of`).
   */
  choices?: number;
  /**
   * The last this many of the tokens are completion tokens already generated (a migrated request
   * resuming): the penalties count them as output, not prompt. Default 0.
   */
  completionTokens?: number;
  /**
   * Called once per layer, in order, as soon as that layer's K and V for the whole prompt are
   * final: layer blobs in layout rngd-pd/v2 (the prompt's blocks), the same arrays the result's
   * `kv` holds. Compute does not wait for a returned promise; prefill resolves after all of them
   * settle and rejects with the first rejection.
   */
  onLayer?(layer: number, k: Uint8Array, v: Uint8Array): void | Promise<void>;
  /**
   * vLLM's cache_salt: the prefix cache shares blocks only between requests with the same salt
   * (tenants apart). Unset: the shared, unsalted cache.
   */
  cacheSalt?: string;
  /** Keep the cache as a decode stream in this engine (solo role) and return it; `kv` is then not exported. */
  keepStream?: boolean;
  /**
   * The loaded LoRA adapter (its name) the prompt runs on, and the kept stream decodes on; its
   * KV is kept in the prefix cache apart from other adapters'. Throws UnknownLoraError when no
   * adapter of that name is loaded. Unset: the base model.
   */
  lora?: string;
  /** Blocks set aside for this prompt at admission (engine.reserve); without one the prefill takes free blocks or throws KVCacheFullError. */
  reservation?: KVReservation;
  /**
   * Return the first token's log-probability and its `logprobs` most likely alternatives
   * (`firstLogprobs`), from the logits the sampler saw. Unset: none are computed.
   */
  logprobs?: number;
  /**
   * Return each prompt token's log-probability given the tokens before it (`promptLogprobs`,
   * what `echo` scores), with `logprobs ?? 0` alternatives each. Costs the output head on every
   * prompt position.
   */
  promptLogprobs?: boolean;
}

/**
 * Kept blocks of a prompt's prefix that an engine holds for a request until it releases them (a
 * decode worker, between saying what it has and importing the rest): they cannot be evicted.
 */
export interface PrefixHold {
  /** Positions held: whole blocks from position 0 (0: none). */
  readonly n: number;
  /** Block hash of the last held block (null when none is held). */
  readonly hash: string | null;
  /** Lets go of the blocks (a stream that imported them keeps its own references). */
  release(): void;
}

/** A change to what an engine's prefix cache holds, in the terms of vLLM's KV events (hashes: rm-core block-hash.ts). */
export type BlockEvent =
  | { kind: "stored"; hashes: string[]; parent: string | null; tokens: number[]; blockSize: number }
  | { kind: "removed"; hashes: string[] }
  | { kind: "cleared" };

/** What a stream adopted from another process is, for the engine's prefix cache. */
export interface ImportOptions {
  /** The kept blocks the imported KV leaves out (kv.from === held.n): the stream starts with them. */
  held?: PrefixHold;
  /** The token ids at the imported positions [0, n): with them the stream's full blocks are kept by hash when it is released. */
  tokens?: number[];
  /** The request's cache_salt (vLLM's): blocks kept for it are found only by requests with the same salt. */
  cacheSalt?: string;
  /** The LoRA adapter the KV was computed with (its name): the stream decodes on it. Throws UnknownLoraError when it is not loaded. */
  lora?: string;
}

export interface PrefillResult {
  firstToken: number;
  /** With `logprobs` set. */
  firstLogprobs?: TokenLogprobs;
  /** With `choices` > 1: the first token (and log-probabilities) of choices 1, 2, ... */
  others?: { token: number; logprobs?: TokenLogprobs }[];
  /** With `promptLogprobs`: entry i scores prompt token i + 1 (the first prompt token has no prefix to score it). */
  promptLogprobs?: TokenLogprobs[];
  /** The prompt's KV in layout rngd-pd/v2; absent when `keepStream` was set. */
  kv?: KVBlobs;
  /** Present when `keepStream` was set. */
  stream?: KVStream;
  /** Wall time of the prefill itself (ms), without waiting on onLayer promises. */
  computeMs: number;
  /** Prompt tokens whose KV came from the engine's prefix cache instead of being computed (0 or absent: none). */
  cachedTokens?: number;
}

export interface DecodeStep {
  stream: KVStream;
  /** The token to append at position `stream.length`. */
  token: number;
  sampling?: SamplingParams;
  /** Restricts the next token to what a grammar allows (structured outputs). */
  constraint?: TokenConstraint;
  /** The stream's prompt and completion so far, for the sampling's penalties (needed only when it has some). */
  history?: TokenHistory;
  /** Also return the next token's log-probability and this many alternatives. */
  logprobs?: number;
}

/** What one decode step gives a stream: its next token (and log-probabilities when asked). */
export interface DecodeResult {
  token: number;
  logprobs?: TokenLogprobs;
  /**
   * Set when this stream's step failed on its own (its constraint, or PreemptedError when the
   * engine took its blocks back): `token` is then meaningless; the other streams' results stand.
   */
  error?: unknown;
}

export interface SwapResult {
  from: EngineVariant;
  to: EngineVariant;
  /** True when the variant had to be compiled (prepared) first. */
  compiled: boolean;
  ms: number;
}

export interface DeltaResult {
  /** `tensors`: only changed tensors were uploaded; `full-reload`: the plan required a reload. */
  mode: "tensors" | "full-reload" | "none";
  changedTensors: string[];
  uploadBytes: number;
  totalBytes: number;
  /** The new model fingerprint. */
  modelFingerprint: string;
  reason: string | null;
  ms: number;
}

export interface EngineStats {
  variant: EngineVariant;
  streams: number;
  /** Bytes of KV held by live streams (their blocks). */
  kvBytes: number;
  /** Bytes of the whole KV block pool (the memory budget). */
  kvCapacityBytes: number;
  /** How the weights got ready at load: `artifact-cache` (warm), `converted` (cold) or `native`. */
  weightsFrom: "artifact-cache" | "converted" | "native";
  loadMs: number;
  /**
   * Prefix caching by block, when the engine has it: prefills that looked, that found a prefix,
   * prompt tokens reused, full blocks kept under their hash, and kept blocks given back for room.
   */
  prefixCache?: { enabled: boolean; queries: number; hits: number; reusedTokens: number; blocks: number; evictions: number };
  /** Prefill forward passes and the prompts they ran, when the engine batches prompts (prompts / passes: how many ran together). */
  prefillPasses?: { passes: number; prompts: number };
}

/** A tool call an assistant turn made, as the chat template sees it (arguments: a JSON object's text). */
export interface ChatToolCall {
  id: string;
  name: string;
  arguments: string;
}

/** One chat turn: a role and its text, and for tool use the calls an assistant made or the call a tool turn answers. */
export interface ChatTurn {
  role: string;
  content: string;
  toolCalls?: ChatToolCall[];
  toolCallId?: string;
  /** The tool's name on a tool turn. */
  name?: string;
}

/** A function the model may call: rendered into the prompt with the chat template's `tools`. */
export interface ChatTool {
  name: string;
  description?: string;
  /** A JSON schema of the arguments (an object schema). */
  parameters: Record<string, unknown>;
}

/** How a vocabulary's token strings spell bytes, for a grammar engine (xgrammar's vocab types). */
export type VocabularyType = "byte_level" | "byte_fallback" | "raw";

/** The text side a worker needs (it never loads the checkpoint itself). */
export interface EngineTokenizer {
  readonly vocabSize: number;
  readonly eosTokenIds: number[];
  encode(text: string, options?: { addSpecialTokens?: boolean }): number[];
  decode(ids: number[], options?: { skipSpecialTokens?: boolean }): string;
  renderChat?(messages: ChatTurn[], options?: { addGenerationPrompt?: boolean; tools?: ChatTool[] }): string;
  /** Each id's token string as the tokenizer stores it ("" for an unused id) and how they spell bytes: what a grammar engine matches against. */
  vocabulary?(): { tokens: string[]; type: VocabularyType };
  /** The raw bytes of one token (a byte-level token may be part of a UTF-8 character); else the caller encodes decode([id]). */
  tokenBytes?(id: number): Uint8Array;
}

/** What a worker drives: prefill, batched decode, KV exchange, variants, swap and delta. */
export interface Engine {
  readonly name: string;
  readonly backend: string;
  readonly model: ModelInfo;
  readonly device: DeviceInfo;
  readonly tokenizer: EngineTokenizer;
  /** The variant new requests run on. */
  readonly activeVariant: EngineVariant;
  variants(): EngineVariant[];
  /** Throws ContextOverflowError when promptTokens + maxTokens exceeds the largest S (max_model_len). */
  pickVariant(promptTokens: number, maxTokens: number, batch?: number): EngineVariant;
  /** The paged KV cache: geometry and occupancy. */
  kvCache(): KVCacheInfo;
  /**
   * Sets aside the blocks `positions` positions need (plus `extra` blocks), or returns null when
   * they are not free now (retry after onBlocksFreed). Throws ContextOverflowError when they
   * exceed the whole pool (no amount of waiting would admit them).
   */
  reserve(positions: number, extra?: number): KVReservation | null;
  /** Calls `listener` whenever blocks return to the pool (a stream released or preempted); returns the unsubscribe function. */
  onBlocksFreed(listener: () => void): () => void;
  prefill(tokens: number[], options: PrefillOptions): Promise<PrefillResult>;
  /**
   * One decode step for many streams: appends each step's token and returns the next token of
   * each stream, in order. A stream that needs a block when none is free makes the engine preempt
   * the newest stream (its result, now or at its next step, carries PreemptedError). Throws
   * ContextOverflowError when a stream is at max_model_len, KVIntegrityError for a released stream.
   */
  decode(steps: DecodeStep[]): Promise<DecodeResult[]>;
  /**
   * Recomputes a preempted stream's KV from its tokens (prompt and generated so far, the last
   * one excluded: it is the next step's input), with the same bits it held. Throws
   * KVIntegrityError when the stream was not preempted, KVCacheFullError without blocks.
   */
  recompute(stream: KVStream, tokens: number[], reservation?: KVReservation): Promise<void>;
  /** Adopts KV from another process (layout rngd-pd/v2). Throws KVIntegrityError on a shape mismatch, KVCacheFullError without blocks. */
  importKV(kv: KVBlobs, reservation?: KVReservation, options?: ImportOptions): KVStream;
  /**
   * Holds the longest kept prefix of `tokens` in whole blocks, at most `maxPositions` positions,
   * for a later importKV that leaves those positions out. An engine without a prefix cache (or
   * whose model keeps sliding-window layers apart) holds none.
   */
  holdPrefix?(tokens: number[], options?: { cacheSalt?: string; maxPositions?: number; lora?: string }): PrefixHold;
  /** Calls `listener` with every block the prefix cache stores or removes, and when it is cleared (what KV events publish). Returns the unsubscribe. */
  onBlockEvent?(listener: (e: BlockEvent) => void): () => void;
  /** A second stream with the same KV (another choice of the request): full blocks are shared, a shared block is copied when written. */
  fork(stream: KVStream): KVStream;
  /** A host copy of a stream's KV in layout rngd-pd/v2. */
  exportKV(stream: KVStream): KVBlobs;
  /** Frees a stream (its blocks go back to the pool unless shared). Idempotent. */
  release(stream: KVStream): void;
  /** Makes `variant` active, keeping the weights resident; compiles (prepares) it when new. */
  swap(variant: EngineVariant): Promise<SwapResult>;
  /** Updates the weights to the checkpoint in `modelDir`, uploading only tensors whose bytes changed. */
  applyDelta(modelDir: string): Promise<DeltaResult>;
  stats(): EngineStats;
  /** LoRA adapters, when the engine was loaded with `lora` and can serve them (absent otherwise). */
  readonly loras?: EngineLoras;
  close(): Promise<void>;
}

export interface EnginePlugin<S extends OptionMap = OptionMap> {
  readonly kind: "engine";
  readonly name: string;
  /** The engine's settings (threads, caches, device discovery...), with their variables. */
  readonly config: ConfigSpec<S>;
  /** Loads the model. `config` is the resolved config (default: every option at its default). */
  load(options: EngineLoadOptions, config?: ConfigValues<S>): Promise<Engine>;
}

/** Roles a worker can run. */
export type WorkerRole = "prefill" | "decode" | "solo";

/** What an engine's package.json entry declares: the `--backend` names it runs and in which roles. */
export interface EngineEntryMeta {
  backends: Record<string, { roles: WorkerRole[] }>;
}

// ---------------------------------------------------------------------------------------------
// Workloads

export interface Workload {
  kind: "prefill" | "decode" | "serve";
  model?: string;
  batch_hint?: number;
  name?: string;
}

export interface WorkloadPlugin {
  readonly kind: "workload";
  readonly name: string;
  run(workload: Workload, config?: Record<string, unknown>): Promise<unknown>;
}

export type AnyPlugin = KVTransportPlugin | EnginePlugin | WorkloadPlugin;
