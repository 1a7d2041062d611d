// Engine mechanics on the CPU reference backend (@airm/llama), shared by engine-rngd and
// engine-atom: weights loaded once (warm from the artifact cache when the model offers a packed
// image), a KV arena per compiled context S, prefill whole or chunked with per-layer callbacks,
// decode of B streams per step with the cache resident ("device") or passed whole as a host input
// each step ("host"), KV import/export in rngd-pd/v1, variant swap and per-tensor delta updates.
// What is vendor-specific (names, device selection, native paths) lives in the engine packages.

import { performance } from "node:perf_hooks";
import { ConfigError, ContextOverflowError, KVIntegrityError, UnsupportedError, choiceSeed } from "@airm/rm-core";
import type { DeviceInfo, EngineVariant, KVBlobs, ModelInfo, SamplingParams, TokenHistory } from "@airm/rm-core";
import { type ArtifactCache, artifactKey } from "./artifact-cache.ts";
import { LLAMA, type CpuCheckpoint, type CpuKVCache, type CpuModel, type CpuWeightsMode, type CpuActivationsMode, type LlamaModule } from "./cpu-model.ts";
import { planTensorDelta } from "./delta-plan.ts";
import { checkpointHashes, type CheckpointHashes } from "./tensor-hash-manifest.ts";
import type {
  DecodeResult,
  DecodeStep,
  DeltaResult,
  EngineStats,
  EngineTokenizer,
  Engine,
  KVStream,
  PrefillOptions,
  PrefillResult,
  SwapResult,
  TokenConstraint,
} from "@airm/rm-core";
import { PrefixCache } from "./prefix-cache.ts";
import { checkKVBlobs, copyPosition, copyPrefix, layerBytes, requestKVBytes, zeroPrefix, type KVGeometry } from "@airm/rm-core";
import { appendColumn, type DecodeGraphShape, type HostDecodeResult } from "./native/rbln-decode-graph.ts";
import { normalizeVariants, pickVariant, variantName } from "./variants.ts";

export interface CpuEngineSpec {
  /** Plugin name (`rngd`, `atom`). */
  name: string;
  backend: string;
  /** `whole`: one prefill call; `chunked`: prefillChunk against the live cache. */
  prefillMode: "whole" | "chunked";
  /** Where decode streams keep their KV. */
  residence: "device" | "host";
  device: DeviceInfo;
  variants: EngineVariant[];
  /** The variant new requests run on; default: the widest batch at the largest S. */
  activeVariant?: EngineVariant;
  chunkSize: number;
  threads: 1 | 2;
  /** How the CPU model holds weight matrices (AIRM_WEIGHTS; default auto). */
  weights?: CpuWeightsMode;
  /** The input width of the CPU model's Q4 kernels (AIRM_ACTIVATIONS; default the model's). */
  activations?: CpuActivationsMode;
  /** Null disables the artifact cache. */
  artifactCache: ArtifactCache | null;
  /** Streams the engine is sized for (kv_cache_usage_perc denominator). */
  maxStreams: number;
  /** A vendor runtime that runs host-input decode steps instead of the CPU model (ATOM native). */
  nativeHostDecode?: NativeHostDecode;
  /** Prompts whose KV is kept for prefix reuse (0: off; default 0). */
  prefixCache?: number;
  /**
   * Whole prompts that wait for the model run together in one forward pass, up to this many
   * prompt tokens per pass (AIRM_PREFILL_BATCH_TOKENS); 0 or unset: one at a time.
   */
  prefillBatchTokens?: number;
}

/** Opens the decode graph of a variant on the card; `step` runs one host-input decode step. */
export interface NativeHostDecode {
  open(variant: EngineVariant, shape: DecodeGraphShape): { step(host: KVBlobs[], tokens: number[]): HostDecodeResult[]; close(): void };
}

interface LoadedWeights {
  model: CpuModel;
  weightsFrom: EngineStats["weightsFrom"];
  loadMs: number;
  /** Why the artifact cache was not used, when it was not. */
  cacheNote: string;
}

const PACKED_KIND = "packed-weights";

/**
 * Loads the model for `ckpt`: from the packed image in `cache` when it exists (warm), else by
 * converting the checkpoint (cold), then stores the image.
 */
export async function loadWeights(
  llama: LlamaModule,
  ckpt: CpuCheckpoint,
  weightsFingerprint: string,
  threads: 1 | 2,
  cache: ArtifactCache | null,
  weights: CpuWeightsMode = "auto",
  activations?: CpuActivationsMode,
): Promise<LoadedWeights> {
  const cls = llama.LlamaModel;
  const format = cls.packedFormatFor(weights, "auto", activations);
  const t0 = performance.now();
  if (!cache) {
    const model = await cls.load(ckpt, { threads, weights, activations });
    return { model, weightsFrom: "converted", loadMs: performance.now() - t0, cacheNote: "artifact cache disabled" };
  }
  const key = artifactKey({ kind: PACKED_KIND, weightsFingerprint, variant: null, kernelVersion: format });
  // Read straight into the model's memories; the CRC-32 is checked once all of it is in.
  const reader = cache.reader(key);
  let note = "";
  if (reader) {
    try {
      const model = await cls.loadPacked(ckpt, reader, { threads, weights, activations });
      if (reader.verify()) return { model, weightsFrom: "artifact-cache", loadMs: performance.now() - t0, cacheNote: `warm: ${key.slice(0, 12)}` };
      model.close();
      note = `; the stored image ${key.slice(0, 12)} failed its CRC-32 and was removed`;
    } finally {
      reader.close();
    }
  }
  const model = await cls.load(ckpt, { threads, weights, activations });
  const loadMs = performance.now() - t0;
  const packed = model.exportPackedWeights();
  if (packed.format !== format) {
    return {
      model,
      weightsFrom: "converted",
      loadMs,
      cacheNote: `packed format ${packed.format} != LlamaModel.packedFormatFor(${weights}, auto, ${activations}) ${format}; not stored`,
    };
  }
  try {
    cache.write({ kind: PACKED_KIND, weightsFingerprint, variant: null, kernelVersion: packed.format }, packed.segments);
  } catch (e) {
    // A read-only or full cache folder costs the next warm start, not this load.
    return { model, weightsFrom: "converted", loadMs, cacheNote: `cold; could not store the image in ${cache.dir}: ${(e as Error).message}` };
  }
  return { model, weightsFrom: "converted", loadMs, cacheNote: `cold: stored ${key.slice(0, 12)}${note}` };
}

let streamCounter = 0;

const yieldToLoop = () => new Promise<void>((resolve) => setImmediate(resolve));

class EngineStream implements KVStream {
  readonly id: string;
  readonly seqLen: number;
  readonly residence: "device" | "host";
  readonly owner: CpuBackedEngine;
  cache: CpuKVCache | null = null;
  host: KVBlobs | null = null;
  released = false;
  constructor(owner: CpuBackedEngine, seqLen: number, residence: "device" | "host") {
    this.owner = owner;
    this.id = `${owner.name}-${process.pid}-${++streamCounter}`;
    this.seqLen = seqLen;
    this.residence = residence;
  }
  get length(): number {
    return this.cache ? this.cache.n : this.host ? this.host.n : 0;
  }
}

function defaultActive(variants: EngineVariant[]): EngineVariant {
  // The widest batch at the largest S: the decode graph a serving worker runs by default.
  const S = Math.max(...variants.map((v) => v.seqLen));
  return variants.filter((v) => v.seqLen === S).sort((a, b) => b.batch - a.batch)[0];
}

/**
 * Times model computation that lets the event loop run in between: `pause` (for a forward pass's
 * yields) stops the clock across a setImmediate, `finish` stops it at the end; the computing time
 * accumulates in `timing.computeMs`.
 */
function computeClock(timing: { computeMs: number }): { pause: () => Promise<void>; finish: <T>(x: T) => T } {
  let resumed = performance.now();
  return {
    pause: async () => {
      timing.computeMs += performance.now() - resumed;
      await new Promise<void>((r) => setImmediate(r));
      resumed = performance.now();
    },
    finish: (x) => {
      timing.computeMs += performance.now() - resumed;
      return x;
    },
  };
}

interface PrefillJob {
  tokens: number[];
  cache: CpuKVCache;
  emit: (layer: number) => void;
  timing: { computeMs: number };
  resolve: (logits: Float32Array) => void;
  reject: (e: unknown) => void;
}

/** An Engine running on the CPU reference model. Create with `CpuBackedEngine.open`. */
export class CpuBackedEngine implements Engine {
  readonly name: string;
  readonly backend: string;
  readonly device: DeviceInfo;
  model: ModelInfo;
  private readonly spec: CpuEngineSpec;
  private readonly llama: LlamaModule;
  private ckpt: CpuCheckpoint;
  private hashes: CheckpointHashes;
  private cpu: CpuModel;
  private variantList: EngineVariant[];
  private active: EngineVariant;
  private readonly geometry: KVGeometry;
  private readonly arena = new Map<number, CpuKVCache[]>();
  /**
   * What an idle cache still holds from the host-input decode path: positions [0, n) of the host
   * KV `host` (see decodeHostInput). Any other use of the cache forgets it (takeCache).
   */
  private readonly heldInput = new WeakMap<CpuKVCache, { host: WeakRef<KVBlobs>; n: number }>();
  /** Idle caches: positions [0, n) may hold data, the rest are zero (see returnCache). */
  private readonly dirty = new WeakMap<CpuKVCache, number>();
  private readonly prefixes: PrefixCache;
  /** Settles when the model computation in progress (if any) is done; see exclusive(). */
  private gate: Promise<void> = Promise.resolve();
  /** Whole prompts waiting for the model: they run together in one forward pass (runPrefillBatch). */
  private readonly prefillQueue: PrefillJob[] = [];
  /** Whether a runPrefillBatch is waiting for its turn at the gate. */
  private prefillScheduled = false;
  /** Prefill forward passes and the prompts they ran (stats().prefillPasses). */
  private readonly prefillCount = { passes: 0, prompts: 0 };
  /** Idle caches kept per S: the widest batch among the variants prepared at that S. */
  private readonly prepared = new Map<number, number>();
  private readonly streams = new Set<EngineStream>();
  private weightsFrom: EngineStats["weightsFrom"];
  private loadMs: number;
  readonly cacheNote: string;
  /** How the weight matrices are held, e.g. "120 q4, 1 q8 (98.2 MB per token)". */
  get weightsHeld(): string {
    return this.cpu.weightsSummary();
  }
  /** config.json keys the checkpoint took from its architecture's defaults (empty for GGUF). */
  get configDefaults(): string[] {
    return this.ckpt.configDefaults ?? [];
  }
  private closed = false;
  /** Open native decode graphs by variant name (one per batch width the steps have needed). */
  private readonly nativeGraphs = new Map<string, ReturnType<NativeHostDecode["open"]>>();

  private constructor(spec: CpuEngineSpec, llama: LlamaModule, ckpt: CpuCheckpoint, hashes: CheckpointHashes, weights: LoadedWeights) {
    this.spec = spec;
    this.prefixes = new PrefixCache(spec.prefixCache ?? 0);
    this.name = spec.name;
    this.backend = spec.backend;
    this.device = spec.device;
    this.llama = llama;
    this.ckpt = ckpt;
    this.hashes = hashes;
    this.cpu = weights.model;
    this.weightsFrom = weights.weightsFrom;
    this.loadMs = weights.loadMs;
    this.cacheNote = weights.cacheNote;
    this.variantList = normalizeVariants(spec.variants);
    this.active = spec.activeVariant ?? defaultActive(this.variantList);
    const c = ckpt.config;
    this.geometry = { layers: c.numLayers, kvHeads: c.numKvHeads, headDim: c.headDim };
    this.model = this.describe();
  }

  /** Loads the checkpoint at `modelPath` and the weights, then prepares the active variant's KV arena. */
  static async open(modelPath: string, spec: CpuEngineSpec): Promise<CpuBackedEngine> {
    const llama = LLAMA;
    const ckpt = await llama.loadCheckpoint(modelPath);
    try {
      // Each step below computes for a few hundred ms; between them the event loop answers the
      // worker's /health and /metrics ("loading") instead of leaving probes to time out.
      await yieldToLoop();
      const hashes = checkpointHashes(ckpt, spec.artifactCache?.dir ?? null);
      await yieldToLoop();
      const weights = await loadWeights(llama, ckpt, hashes.fingerprint, spec.threads, spec.artifactCache, spec.weights, spec.activations);
      await yieldToLoop();
      const engine = new CpuBackedEngine(spec, llama, ckpt, hashes, weights);
      engine.prepareArena(engine.active);
      return engine;
    } catch (e) {
      ckpt.tensors.close();
      throw e;
    }
  }

  /** How the checkpoint's hashes were obtained at the last load or delta (`record` = no re-hash). */
  get hashesFrom(): CheckpointHashes["from"] {
    return this.hashes.from;
  }

  private describe(): ModelInfo {
    const c = this.ckpt.config;
    return {
      id: this.ckpt.id,
      architecture: c.architecture,
      layers: c.numLayers,
      kvHeads: c.numKvHeads,
      headDim: c.headDim,
      vocabSize: c.vocabSize,
      modelFingerprint: this.hashes.fingerprint,
      numericsFingerprint: this.cpu.numericsFingerprint,
      eosTokenIds: [...this.ckpt.generation.eosTokenIds],
    };
  }

  get tokenizer(): EngineTokenizer {
    const ckpt = this.ckpt;
    return {
      vocabSize: ckpt.tokenizer.vocabSize,
      eosTokenIds: [...ckpt.generation.eosTokenIds],
      encode: (text, options) => ckpt.tokenizer.encode(text, options),
      decode: (ids, options) => ckpt.tokenizer.decode(ids, options),
      renderChat: ckpt.renderChat ? (messages, options) => ckpt.renderChat!(messages, options) : undefined,
      tokenBytes: ckpt.tokenizer.tokenBytes ? (id) => ckpt.tokenizer.tokenBytes!(id) : undefined,
      vocabulary: ckpt.tokenizer.vocabulary ? () => ckpt.tokenizer.vocabulary!() : undefined,
    };
  }

  get activeVariant(): EngineVariant {
    return { ...this.active };
  }

  variants(): EngineVariant[] {
    return this.variantList.map((v) => ({ ...v }));
  }

  pickVariant(promptTokens: number, maxTokens: number, batch = 1): EngineVariant {
    return { ...pickVariant(this.variantList, promptTokens, maxTokens, batch) };
  }

  // --- KV arena -------------------------------------------------------------------------------

  /**
   * Sizes `v`'s workspace: up to B caches of its S are kept for reuse once used (a prepared
   * variant stays prepared, as on the card). Caches are made when first needed, so an engine
   * compiled for B16 holds memory for the streams it has actually run.
   */
  private prepareArena(v: EngineVariant): void {
    this.prepared.set(v.seqLen, Math.max(this.prepared.get(v.seqLen) ?? 0, v.batch));
    if (!this.arena.has(v.seqLen)) this.arena.set(v.seqLen, []);
  }

  /** A cache of context S from the arena (or new). `zero` clears a reused one (exported KV stays deterministic). */
  private takeCache(S: number, zero = true): CpuKVCache {
    const free = this.arena.get(S);
    const reused = free?.length ? free.pop()! : null;
    const cache = reused ?? this.cpu.newCache(S);
    if (reused) this.heldInput.delete(reused);
    if (reused && zero) {
      // Only the positions a last user may have written: the rest is still zero.
      const dirty = this.dirty.get(reused) ?? S;
      for (let l = 0; l < this.geometry.layers; l++) zeroPrefix(this.geometry, S, dirty, cache.layerK(l), cache.layerV(l));
    }
    cache.n = 0;
    return cache;
  }

  /**
   * Keeps an idle cache for the next user (or frees it). `written`: the positions [0, written)
   * that may hold data since it was zeroed; the rest must be zero (the default: every position).
   */
  private returnCache(cache: CpuKVCache, written = cache.S): void {
    const free = this.arena.get(cache.S) ?? [];
    if (free.length < (this.prepared.get(cache.S) ?? 0)) {
      this.dirty.set(cache, Math.min(cache.S, written));
      free.push(cache);
      this.arena.set(cache.S, free);
      return;
    }
    this.cpu.freeCache(cache);
  }

  private checkSeqLen(S: number, what: string): void {
    if (!this.variantList.some((v) => v.seqLen === S)) {
      throw new KVIntegrityError("seqLen", `${what} at S=${S}, but this engine compiled ${this.variantList.map(variantName).join(", ")}`);
    }
  }

  private live(): void {
    if (this.closed) throw new UnsupportedError(`engine ${this.name} is closed`);
  }

  private own(stream: KVStream): EngineStream {
    if (!(stream instanceof EngineStream) || stream.owner !== this) throw new KVIntegrityError("stream", `stream ${stream.id} does not belong to engine ${this.name}`);
    if (stream.released) throw new KVIntegrityError("stream", `stream ${stream.id} was released`);
    return stream;
  }

  /**
   * The token at `position` from one row of logits: the constraint's mask first (in place), then
   * the sampler (logit bias, temperature, top-k/p); log-probabilities, when asked, come from the
   * masked logits before the bias (see TokenLogprobs).
   */
  private pick(
    logits: Float32Array,
    sampling: SamplingParams | undefined,
    position: number,
    o: { constraint?: TokenConstraint; top?: number; history?: TokenHistory; mask?: Int32Array | null },
  ): DecodeResult {
    const mask = o.mask !== undefined ? o.mask : (o.constraint?.allowedTokens() ?? null);
    if (mask) this.llama.applyTokenMask(logits, mask);
    const token = this.llama.sample(logits, { temperature: 0, ...sampling }, position, o.history);
    return o.top === undefined ? { token } : { token, logprobs: this.llama.tokenLogprobs(logits, token, o.top) };
  }

  /** Runs the sampler once on a tiny input so bad parameters fail before any compute or state change. */
  private checkSampling(sampling: SamplingParams | undefined): void {
    if (!sampling) return;
    const { logitBias, ...rest } = sampling;
    this.llama.sample(new Float32Array(2), { temperature: 0, ...rest }, 0);
    this.llama.checkLogitBias(logitBias, this.ckpt.config.vocabSize);
  }

  private checkTokens(tokens: number[], what: string): void {
    const V = this.ckpt.config.vocabSize;
    for (const t of tokens) {
      if (!Number.isInteger(t) || t < 0 || t >= V) throw new ConfigError(what, `token ${t} is not an id in [0, ${V})`);
    }
  }

  // --- prefill --------------------------------------------------------------------------------

  async prefill(tokens: number[], options: PrefillOptions): Promise<PrefillResult> {
    this.live();
    if (!Array.isArray(tokens) || tokens.length === 0) throw new ConfigError("tokens", "prefill needs at least one token");
    this.checkTokens(tokens, "tokens");
    this.checkSampling(options.sampling);
    if (options.logprobs !== undefined && !(Number.isInteger(options.logprobs) && options.logprobs >= 0)) {
      throw new ConfigError("logprobs", `must be an integer >= 0, got ${options.logprobs}`);
    }
    const done = options.completionTokens ?? 0;
    if (!(Number.isInteger(done) && done >= 0 && done < tokens.length))
      throw new ConfigError("completionTokens", `must be an integer in [0, ${tokens.length}) (the prompt keeps a token), got ${done}`);
    const S = options.seqLen;
    this.checkSeqLen(S, "prefill requested");
    if (tokens.length > S) throw new ContextOverflowError(tokens.length, S, "prompt alone");
    const g = this.geometry;
    const cache = this.takeCache(S);
    const k: Uint8Array[] = new Array(g.layers);
    const v: Uint8Array[] = new Array(g.layers);
    const pending: Promise<void>[] = [];
    const emit = (layer: number): void => {
      k[layer] = cache.layerK(layer).slice();
      v[layer] = cache.layerV(layer).slice();
      if (options.onLayer) {
        const r = options.onLayer(layer, k[layer], v[layer]);
        if (r && typeof (r as Promise<void>).then === "function") {
          const p = Promise.resolve(r);
          p.catch(() => undefined); // observed below; avoid an unhandled rejection meanwhile
          pending.push(p);
        }
      }
    };
    let rows: Float32Array[];
    const timing = { computeMs: 0 };
    // A kept prefix is copied in and only the rest is computed (same bits: see prefix-cache.ts).
    // Prompt log-probabilities need every position's logits, so they compute the whole prompt.
    const hit = options.promptLogprobs ? null : this.prefixes.lookup(S, tokens);
    try {
      if (hit) {
        for (let l = 0; l < g.layers; l++) copyPrefix(g, S, hit.n, hit.k[l], hit.v[l], cache.layerK(l), cache.layerV(l));
        cache.n = hit.n;
      }
      const rest = hit ? tokens.slice(hit.n) : tokens;
      // Whole prompts that wait for the model run together (same bits as alone); prompt
      // log-probabilities and chunked prefill run one prompt at a time.
      if ((this.spec.prefillBatchTokens ?? 0) > 0 && this.spec.prefillMode === "whole" && !options.promptLogprobs) rows = [await this.prefillBatched(rest, cache, emit, timing)];
      else
        rows = await this.exclusive(() => {
          this.prefillCount.passes++;
          this.prefillCount.prompts++;
          return this.prefillRows(rest, cache, emit, options.promptLogprobs === true, timing);
        });
      if (cache.n !== tokens.length) cache.n = tokens.length;
      for (let l = 0; l < g.layers; l++) if (!k[l]) emit(l);
    } catch (e) {
      this.returnCache(cache);
      throw e;
    }
    const computeMs = timing.computeMs;
    const top = options.logprobs ?? 0;
    const logprobs: Pick<PrefillResult, "firstLogprobs" | "promptLogprobs"> = {};
    // Prompt positions are scored before the last row is masked for the first token.
    if (options.promptLogprobs) logprobs.promptLogprobs = tokens.slice(1).map((t, i) => this.llama.tokenLogprobs(rows[i], t, top));
    let firstToken: number;
    let others: PrefillResult["others"];
    try {
      // Every choice draws from the same last row, under the same mask (read once), with its own seed.
      const output = new Map<number, number>();
      for (const t of tokens.slice(tokens.length - done)) output.set(t, (output.get(t) ?? 0) + 1);
      const history = { output, prompt: new Set(tokens.slice(0, tokens.length - done)) };
      const mask = options.constraint?.allowedTokens() ?? null;
      const draw = (i: number) =>
        this.pick(rows[rows.length - 1], { ...options.sampling, seed: choiceSeed(options.sampling?.seed, i) }, tokens.length, { mask, top: options.logprobs, history });
      const first = draw(0);
      firstToken = first.token;
      if (first.logprobs) logprobs.firstLogprobs = first.logprobs;
      if ((options.choices ?? 1) > 1) others = Array.from({ length: options.choices! - 1 }, (_, i) => draw(i + 1));
    } catch (e) {
      this.returnCache(cache, tokens.length);
      throw e;
    }
    let stream: EngineStream | undefined;
    if (options.keepStream) {
      stream = new EngineStream(this, S, this.spec.residence);
      if (this.spec.residence === "device") stream.cache = cache;
      else {
        stream.host = { seqLen: S, n: tokens.length, k: k.map((x) => x.slice()), v: v.map((x) => x.slice()) };
        this.returnCache(cache, tokens.length);
      }
      this.streams.add(stream);
    } else this.returnCache(cache, tokens.length); // a prefill writes the prompt's positions only
    try {
      for (const p of pending) await p;
    } catch (e) {
      if (stream) this.release(stream);
      throw e;
    }
    this.prefixes.store(S, tokens, k, v);
    return { firstToken, ...logprobs, ...(others ? { others } : {}), kv: { seqLen: S, n: tokens.length, k, v }, stream, computeMs, cachedTokens: hit?.n ?? 0 };
  }

  /**
   * Runs the prompt into `cache` the backend's way (whole, or in chunks against the live cache)
   * and returns the logits of the last position, or of every position when `all` (same kernels
   * and order, so the last row is the same either way). Lets the event loop run between blocks
   * of work (a worker keeps answering /health during a long prompt); `timing.computeMs` gets the
   * time spent computing, without those pauses.
   */
  private async prefillRows(tokens: number[], cache: CpuKVCache, emit: (layer: number) => void, all: boolean, timing: { computeMs: number }): Promise<Float32Array[]> {
    const { pause, finish } = computeClock(timing);
    if (this.spec.prefillMode === "whole") return finish(await this.cpu.prefillAsync(tokens, cache, { onLayer: emit, allLogits: all, pause }));
    // Chunked prefill finishes a layer only with the last chunk: layers are emitted by the caller then.
    const rows: Float32Array[] = [];
    for (let i = 0; i < tokens.length; i += this.spec.chunkSize) {
      const chunk = await this.cpu.prefillAsync(tokens.slice(i, i + this.spec.chunkSize), cache, { allLogits: all, pause });
      if (all || i + this.spec.chunkSize >= tokens.length) rows.push(...chunk);
    }
    return finish(rows);
  }

  /**
   * Queues a whole prompt (already checked, its cached prefix copied in) for the next forward
   * pass and resolves with the logits of its last position. A prompt that finds the model idle
   * starts at once; prompts that arrive while the model computes wait, and then all of them (up
   * to spec.prefillBatchTokens) run in one pass, so a burst of prompts finishes together instead of
   * one after another. `timing.computeMs` gets the pass's compute time.
   */
  private prefillBatched(tokens: number[], cache: CpuKVCache, emit: (layer: number) => void, timing: { computeMs: number }): Promise<Float32Array> {
    return new Promise<Float32Array>((resolve, reject) => {
      this.prefillQueue.push({ tokens, cache, emit, timing, resolve, reject });
      this.schedulePrefillBatch();
    });
  }

  private schedulePrefillBatch(): void {
    if (this.prefillScheduled || this.prefillQueue.length === 0) return;
    this.prefillScheduled = true;
    // runPrefillBatch settles every job it takes itself; nothing is left to observe here
    this.exclusive(() => this.runPrefillBatch()).catch(() => undefined);
  }

  /** Takes the waiting prompts (at least one, then up to spec.prefillBatchTokens in all) and runs them in one pass. */
  private async runPrefillBatch(): Promise<void> {
    this.prefillScheduled = false;
    let total = 0;
    let take = 0;
    while (take < this.prefillQueue.length && (take === 0 || total + this.prefillQueue[take].tokens.length <= (this.spec.prefillBatchTokens ?? 0))) {
      total += this.prefillQueue[take].tokens.length;
      take++;
    }
    const jobs = this.prefillQueue.splice(0, take);
    this.prefillCount.passes++;
    this.prefillCount.prompts += jobs.length;
    this.schedulePrefillBatch(); // the rest waits for the next turn
    const pass = { computeMs: 0 };
    const { pause, finish } = computeClock(pass);
    try {
      const logits = finish(
        await this.cpu.prefillManyAsync(
          jobs.map((j) => ({ tokens: j.tokens, cache: j.cache })),
          {
            onLayer: (l) => {
              for (const j of jobs) j.emit(l);
            },
            pause,
          },
        ),
      );
      jobs.forEach((j, i) => {
        j.timing.computeMs += pass.computeMs;
        j.resolve(logits[i]);
      });
    } catch (e) {
      for (const j of jobs) j.reject(e);
    }
  }

  /**
   * Runs `fn` when no other model computation is in progress. A prefill pauses between blocks of
   * work, and the model's scratch buffers belong to one forward pass at a time, so prefills and
   * decode steps take turns here.
   */
  private async exclusive<T>(fn: () => Promise<T> | T): Promise<T> {
    const before = this.gate;
    let done!: () => void;
    this.gate = new Promise<void>((r) => (done = r));
    await before;
    try {
      return await fn();
    } finally {
      done();
    }
  }

  // --- decode ---------------------------------------------------------------------------------

  async decode(steps: DecodeStep[]): Promise<DecodeResult[]> {
    this.live();
    const own = steps.map((s) => this.own(s.stream));
    if (new Set(own).size !== own.length) throw new ConfigError("steps", "a stream appears twice in one decode step");
    this.checkTokens(
      steps.map((s) => s.token),
      "token",
    );
    for (const s of steps) {
      this.checkSampling(s.sampling);
      if (s.logprobs !== undefined && !(Number.isInteger(s.logprobs) && s.logprobs >= 0)) throw new ConfigError("logprobs", `must be an integer >= 0, got ${s.logprobs}`);
    }
    for (const s of own) {
      if (s.length >= s.seqLen) throw new ContextOverflowError(s.length + 1, s.seqLen, `stream ${s.id} is full`);
    }
    const out: DecodeResult[] = new Array(steps.length);
    // Groups as wide as the widest compiled batch; each runs as the smallest variant that holds it.
    const B = this.widestBatch();
    await this.exclusive(() => {
      for (let at = 0; at < steps.length; at += B) {
        const group = steps.slice(at, at + B);
        const streams = own.slice(at, at + B);
        const logits = this.spec.residence === "device" ? this.decodeResident(streams, group) : this.decodeHostInput(streams, group);
        for (let i = 0; i < group.length; i++) {
          // A stream whose constraint fails fails alone: the others' tokens stand.
          try {
            out[at + i] = this.pick(logits[i], group[i].sampling, streams[i].length, { constraint: group[i].constraint, top: group[i].logprobs, history: group[i].history });
          } catch (error) {
            out[at + i] = { token: -1, error };
          }
        }
      }
    });
    return out;
  }

  /** The widest batch any compiled variant runs: how many streams one decode step takes. */
  widestBatch(): number {
    return Math.max(1, ...this.variantList.map((v) => v.batch));
  }

  /** The smallest compiled variant at S that holds `count` streams (the widest at S when none does). */
  private variantFor(count: number, S: number): EngineVariant {
    const atS = this.variantList.filter((v) => v.seqLen === S).sort((a, b) => a.batch - b.batch);
    return atS.find((v) => v.batch >= count) ?? atS[atS.length - 1] ?? this.active;
  }

  private decodeResident(streams: EngineStream[], group: DecodeStep[]): Float32Array[] {
    const before = streams.map((s) => s.cache!.n);
    const logits = this.cpu.decode(group.map((g, i) => ({ cache: streams[i].cache!, token: g.token })));
    streams.forEach((s, i) => {
      if (s.cache!.n === before[i]) s.cache!.n = before[i] + 1;
    });
    return logits;
  }

  private graphFor(v: EngineVariant = this.active): ReturnType<NativeHostDecode["open"]> {
    const key = variantName(v);
    let graph = this.nativeGraphs.get(key);
    if (!graph) {
      graph = this.spec.nativeHostDecode!.open({ ...v }, { ...this.geometry, vocabSize: this.ckpt.config.vocabSize });
      this.nativeGraphs.set(key, graph);
    }
    return graph;
  }

  /** ATOM's decode graph is fed every cached position from host memory on each step and returns the new position's K/V. */
  private decodeHostInput(streams: EngineStream[], group: DecodeStep[]): Float32Array[] {
    const g = this.geometry;
    if (this.spec.nativeHostDecode) {
      for (const s of streams) {
        if (s.seqLen !== this.active.seqLen) throw new ConfigError("variant", `stream ${s.id} has S=${s.seqLen}; swap to a variant with S=${s.seqLen} first`);
      }
      const results = this.graphFor(this.variantFor(streams.length, this.active.seqLen)).step(
        streams.map((s) => s.host!),
        group.map((x) => x.token),
      );
      for (const [i, s] of streams.entries()) appendColumn(g, s.host!, results[i].k, results[i].v);
      return results.map((r) => r.logits);
    }
    // The host cache is the input of the step: its valid positions go into a working cache
    // (attention reads positions [0, n] only, so what lies past them does not matter). An idle
    // cache that still holds this stream's positions [0, n) from its previous step (the step wrote
    // the new position there and copied it to the host) is taken as it is: the same bytes as the
    // copy, without copying n positions of every layer again.
    const held = streams.map((s) => {
      const free = this.arena.get(s.seqLen) ?? [];
      const at = free.findIndex((c) => {
        const t = this.heldInput.get(c);
        return t !== undefined && t.n === s.host!.n && t.host.deref() === s.host;
      });
      if (at < 0) return null;
      const c = free.splice(at, 1)[0];
      this.heldInput.delete(c);
      c.n = s.host!.n;
      return c;
    });
    const scratch = streams.map((s, i) => {
      const kept = held[i];
      if (kept) return kept;
      const c = this.takeCache(s.seqLen, false);
      const h = s.host!;
      for (let l = 0; l < g.layers; l++) copyPrefix(g, s.seqLen, h.n, h.k[l], h.v[l], c.layerK(l), c.layerV(l));
      c.n = h.n;
      return c;
    });
    let stepped = false;
    try {
      const logits = this.cpu.decode(group.map((x, i) => ({ cache: scratch[i], token: x.token })));
      streams.forEach((s, i) => {
        const host = s.host!;
        const p = host.n;
        for (let l = 0; l < g.layers; l++) copyPosition(g, s.seqLen, p, scratch[i].layerK(l), scratch[i].layerV(l), host.k[l], host.v[l]);
        host.n = p + 1;
      });
      stepped = true;
      return logits;
    } finally {
      for (const [i, c] of scratch.entries()) {
        if (stepped) this.heldInput.set(c, { host: new WeakRef(streams[i].host!), n: streams[i].host!.n });
        this.returnCache(c);
      }
    }
  }

  // --- KV exchange ----------------------------------------------------------------------------

  importKV(kv: KVBlobs): KVStream {
    this.live();
    checkKVBlobs(this.geometry, kv);
    this.checkSeqLen(kv.seqLen, "imported KV");
    const stream = new EngineStream(this, kv.seqLen, this.spec.residence);
    if (this.spec.residence === "device") {
      const cache = this.takeCache(kv.seqLen, false); // every byte is overwritten below
      for (let l = 0; l < this.geometry.layers; l++) {
        cache.layerK(l).set(kv.k[l]);
        cache.layerV(l).set(kv.v[l]);
      }
      cache.n = kv.n;
      stream.cache = cache;
    } else {
      stream.host = { seqLen: kv.seqLen, n: kv.n, k: kv.k.map((x) => x.slice()), v: kv.v.map((x) => x.slice()) };
    }
    this.streams.add(stream);
    return stream;
  }

  exportKV(stream: KVStream): KVBlobs {
    const s = this.own(stream);
    if (s.cache) {
      const L = this.geometry.layers;
      return {
        seqLen: s.seqLen,
        n: s.cache.n,
        k: Array.from({ length: L }, (_, l) => s.cache!.layerK(l).slice()),
        v: Array.from({ length: L }, (_, l) => s.cache!.layerV(l).slice()),
      };
    }
    const h = s.host!;
    return { seqLen: h.seqLen, n: h.n, k: h.k.map((x) => x.slice()), v: h.v.map((x) => x.slice()) };
  }

  release(stream: KVStream): void {
    if (!(stream instanceof EngineStream) || stream.owner !== this || stream.released) return;
    stream.released = true;
    this.streams.delete(stream);
    if (stream.cache) this.returnCache(stream.cache);
    stream.cache = null;
    stream.host = null;
  }

  // --- swap and delta -------------------------------------------------------------------------

  async swap(variant: EngineVariant): Promise<SwapResult> {
    this.live();
    if (!Number.isInteger(variant.batch) || variant.batch < 1 || !Number.isInteger(variant.seqLen) || variant.seqLen < 8) {
      throw new ConfigError("variant", `batch must be >= 1 and seqLen >= 8, got ${JSON.stringify(variant)}`);
    }
    const t0 = performance.now();
    const from = { ...this.active };
    const compiled = !this.variantList.some((v) => v.batch === variant.batch && v.seqLen === variant.seqLen);
    if (compiled) this.variantList = normalizeVariants([...this.variantList, { batch: variant.batch, seqLen: variant.seqLen }]);
    this.active = { batch: variant.batch, seqLen: variant.seqLen };
    // Weights stay; only the variant's workspace is made resident (kept for a later swap back).
    this.prepareArena(this.active);
    if (this.spec.nativeHostDecode) this.graphFor();
    return { from, to: { ...this.active }, compiled, ms: performance.now() - t0 };
  }

  async applyDelta(modelDir: string): Promise<DeltaResult> {
    this.live();
    if (this.streams.size > 0) {
      throw new UnsupportedError(`applyDelta with ${this.streams.size} live stream(s): their KV was computed with the old weights; release them first`);
    }
    const t0 = performance.now();
    const next = await this.llama.loadCheckpoint(modelDir, { reuseTokenizerFrom: this.ckpt });
    let nextHashes: CheckpointHashes;
    try {
      nextHashes = checkpointHashes(next, this.spec.artifactCache?.dir ?? null);
    } catch (e) {
      next.tensors.close();
      throw e;
    }
    const plan = planTensorDelta({ config: this.ckpt.config, tensors: this.hashes }, { config: next.config, tensors: nextHashes });
    if (!plan.fullReloadRequired && plan.changed.length === 0) {
      next.tensors.close();
      return { mode: "none", changedTensors: [], uploadBytes: 0, totalBytes: plan.totalBytes, modelFingerprint: this.hashes.fingerprint, reason: null, ms: performance.now() - t0 };
    }
    let mode: DeltaResult["mode"];
    const reason = plan.reason;
    // Kept prompt KV was computed with the old weights.
    this.prefixes.clear();
    if (!plan.fullReloadRequired) {
      for (const name of plan.changed) this.cpu.updateTensor(name, next.tensors);
      mode = "tensors";
    } else {
      const weights = await loadWeights(this.llama, next, nextHashes.fingerprint, this.spec.threads, this.spec.artifactCache, this.spec.weights);
      for (const free of this.arena.values()) for (const c of free) this.cpu.freeCache(c);
      this.arena.clear();
      this.prepared.clear();
      this.cpu.close();
      this.cpu = weights.model;
      this.weightsFrom = weights.weightsFrom;
      this.loadMs = weights.loadMs;
      this.prepareArena(this.active);
      mode = "full-reload";
    }
    this.ckpt.tensors.close();
    this.ckpt = next;
    this.hashes = nextHashes;
    this.model = this.describe();
    return {
      mode,
      changedTensors: plan.changed,
      uploadBytes: mode === "tensors" ? plan.uploadBytes : plan.totalBytes,
      totalBytes: plan.totalBytes,
      modelFingerprint: nextHashes.fingerprint,
      reason,
      ms: performance.now() - t0,
    };
  }

  stats(): EngineStats {
    let kvBytes = 0;
    for (const s of this.streams) kvBytes += requestKVBytes(this.geometry, s.seqLen);
    return {
      variant: { ...this.active },
      streams: this.streams.size,
      kvBytes,
      kvCapacityBytes: this.spec.maxStreams * requestKVBytes(this.geometry, this.active.seqLen),
      weightsFrom: this.weightsFrom,
      loadMs: this.loadMs,
      prefixCache: {
        queries: this.prefixes.queries,
        hits: this.prefixes.hits,
        reusedTokens: this.prefixes.reusedTokens,
        entries: this.prefixes.size,
        capacity: this.prefixes.capacity,
      },
      prefillPasses: { ...this.prefillCount },
    };
  }

  /** Bytes of one layer blob at `S` (what a transport moves per (layer, K|V)). */
  layerBlobBytes(S: number): number {
    return layerBytes(this.geometry, S);
  }

  async close(): Promise<void> {
    if (this.closed) return;
    for (const s of [...this.streams]) this.release(s);
    for (const graph of this.nativeGraphs.values()) graph.close();
    this.nativeGraphs.clear();
    for (const free of this.arena.values()) for (const c of free) this.cpu.freeCache(c);
    this.arena.clear();
    this.cpu.close();
    this.ckpt.tensors.close();
    this.closed = true;
  }
}
