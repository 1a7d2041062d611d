// Engine mechanics on the CPU reference backend (@airm/llama), shared by engine-rngd and
// engine-atom: weights loaded once (warm from the artifact cache when it has the image), a paged
// KV cache sized from a memory budget, streams holding blocks of it, one scheduler (pass-loop.ts)
// that runs decode steps and prompt chunks together, admission by reserved blocks, preemption by
// recompute when blocks run out, prompt-prefix reuse by shared blocks, KV import/export in
// rngd-pd/v2, variant swap and per-tensor delta updates. The NPU execution models keep their
// compiled (batch, context) buckets, which decide what fits; on the CPU reference only the
// positions in use are computed. LoRA adapters (with `lora` in the spec) run per stream, their KV
// kept apart in the prefix cache (engine-loras.ts). What is vendor-specific lives in the engine
// packages.

import { performance } from "node:perf_hooks";
import {
  ConfigError,
  ContextOverflowError,
  KVIntegrityError,
  PreemptedError,
  UnknownLoraError,
  UnsupportedError,
  blocksFor,
  blocksToDense,
  checkKVBlobs,
  choiceSeed,
  describeSamplingDefaults,
  isAirmError,
} from "@airm/rm-core";
import type {
  DecodeResult,
  DecodeStep,
  DeltaResult,
  DeviceInfo,
  Engine,
  EngineStats,
  EngineLoras,
  EngineTokenizer,
  EngineVariant,
  KVBlobs,
  ImportOptions,
  PrefixHold,
  KVCacheInfo,
  KVReservation,
  KVStream,
  LoraServingOptions,
  ModelInfo,
  PrefillOptions,
  PrefillResult,
  SamplingParams,
  SwapResult,
  TokenConstraint,
  TokenHistory,
} from "@airm/rm-core";
import type { ArtifactCache } from "./artifact-cache.ts";
import { LLAMA, samplingDefaults, type CpuCheckpoint, type CpuLoraHandle, type CpuModel, type CpuWeightsMode, type CpuActivationsMode, type LlamaModule } from "./cpu-model.ts";
import { EngineLoraSet, loraReserveBytes, modelLoraOptions, saltFor } from "./engine-loras.ts";
import { planTensorDelta } from "./delta-plan.ts";
import { CoreBoard, type CoreBoardSpec } from "./core-board.ts";
import { DEFAULT_KV_SHARE, kvBudgetBlocks, type KvCacheMemory } from "./kv-budget.ts";
import { loadWeights, type LoadedWeights } from "./load-weights.ts";
import { type DecodeGraphShape, type DenseKV, type HostDecodeResult, denseLayerBytes, writeBlockColumn } from "./host-decode.ts";
import { PassLoop, type DecodeWork } from "./pass-loop.ts";
import { PrefixCache, type BlockEvent } from "./prefix-cache.ts";
import { checkpointHashes, type CheckpointHashes } from "./tensor-hash-manifest.ts";
import { defaultVariants, normalizeVariants, pickVariant, variantName } from "./variants.ts";

export { loadWeights } from "./load-weights.ts";

/** Most tokens per pass unless configured: a whole prompt of this length runs in one pass. */
export const DEFAULT_MAX_NUM_BATCHED_TOKENS = 2048;
/** Share of a decode pass's time a prompt chunk beside it may add (TPOT up to 1.25x while a prompt prefills beside running streams). */
export const DEFAULT_PREFILL_SHARE = 0.25;
/** wasm memory kept free for working buffers (activations, scores, logits) when sizing the KV cache. */
const WORKING_RESERVE = 256 * 2 ** 20;
const WASM_CAP = 2 ** 32;

export interface CpuEngineSpec {
  /** Plugin name (`rngd`, `atom`). */
  name: string;
  backend: string;
  /** `whole`: a prompt runs in one pass when it fits the pass budget; `chunked`: in chunks of chunkSize. */
  prefillMode: "whole" | "chunked";
  /** Where decode streams keep their KV (the NPU model: resident on the card, or a host input each step). */
  residence: "device" | "host";
  device: DeviceInfo;
  /** The compiled (batch, context) variants; default: batches 1, 4, 8, 16 (and `batch`) at every context bucket up to max_model_len. */
  variants?: EngineVariant[];
  /** The batch width asked for (the worker's --B): caps the default batches (B8 compiles B1, B4, B8) and is compiled too. */
  batch?: number;
  /** The variant new requests run on; default: the widest batch at the largest context. */
  activeVariant?: EngineVariant;
  chunkSize: number;
  threads: 1 | 2;
  /** With threads 2: `when-idle` runs the second thread only while no other part on `coreBoard` has work (default always). */
  secondThread?: "always" | "when-idle";
  /** The host's core board (core-board.ts): where this engine says whether it has work. */
  coreBoard?: CoreBoardSpec;
  /** How the CPU model holds weight matrices (AIRM_WEIGHTS; default auto). */
  weights?: CpuWeightsMode;
  /** The input width of the CPU model's Q4 kernels (AIRM_ACTIVATIONS; default the model's). */
  activations?: CpuActivationsMode;
  /** Null disables the artifact cache. */
  artifactCache: ArtifactCache | null;
  /** A vendor runtime that runs host-input decode steps instead of the CPU model (ATOM native). */
  nativeHostDecode?: NativeHostDecode;
  /**
   * Prefix caching by block (vLLM's --enable-prefix-caching): full KV blocks stay under their
   * block hash after their prompt or stream is done, and a prompt that starts with them shares
   * them. Default false here (the worker's config turns it on).
   */
  prefixCaching?: boolean;
  /** Whole prompts that wait together share a pass up to this many tokens (AIRM_PREFILL_BATCH_TOKENS); 0 or unset: one at a time. */
  prefillBatchTokens?: number;
  /** Positions per KV block (--block-size; default 16). */
  blockSize?: number;
  /** The KV cache budget (--kv-cache-memory); default DEFAULT_KV_SHARE of the memory available after the weights. */
  kvCacheMemory?: KvCacheMemory;
  /** The longest request served (--max-model-len); default the model's context (max_position_embeddings). */
  maxModelLen?: number;
  /** Most tokens per pass, decode steps included (--max-num-batched-tokens). */
  maxNumBatchedTokens?: number;
  /** Share of a decode pass's time a prompt chunk beside it may add (--prefill-share). */
  prefillShare?: number;
  /**
   * Whose sampling defaults requests get (vLLM's --generation-config): `auto` (default) the
   * checkpoint's (generation_config.json, GGUF general.sampling.*), `vllm` none (the API's own).
   */
  generationConfig?: "auto" | "vllm";
  /**
   * Serve LoRA adapters (the load option, vLLM's --enable-lora): the model is loaded with the
   * limits, `modules` are loaded at start and the engine has `loras`. Refused (UnsupportedError)
   * with nativeHostDecode: the vendor's decode graph cannot apply adapters.
   */
  lora?: LoraServingOptions;
}

/** Opens the decode graph of a variant on the card; `step` runs one host-input decode step. */
export interface NativeHostDecode {
  open(variant: EngineVariant, shape: DecodeGraphShape): { step(host: DenseKV[], tokens: number[]): HostDecodeResult[]; close(): void };
}

/** What the engine keeps of the paged cache of one sequence (llama's PagedKVCache). */
type Cache = ReturnType<CpuModel["newCache"]> & {
  blocks: number[];
  reservedBlocks: number;
  ensure(to: number): void;
  blocksNeeded(to: number): number;
  addReservation(n: number): void;
  local: number[];
  adopt(ids: readonly number[], local?: readonly number[]): void;
  view(j: number, l: number, kind: "k" | "v"): Uint8Array;
  fork(): Cache;
  clear(): void;
};

let streamCounter = 0;
const yieldToLoop = () => new Promise<void>((resolve) => setImmediate(resolve));

class EngineStream implements KVStream {
  readonly id: string;
  readonly residence: "device" | "host";
  readonly owner: CpuBackedEngine;
  /** Arrival order: the newest stream is preempted first. */
  readonly seq: number;
  cache: Cache;
  preempted = false;
  /** Being recomputed after a preemption (not preemptible meanwhile). */
  recomputing = false;
  /** Has taken a decode step (a stream kept by a prefill that never decodes does not hold chunks back). */
  stepped = false;
  released = false;
  /** The token ids at the positions the cache holds (null: not known, e.g. KV imported without them): what the prefix cache keeps at release. */
  tokens: number[] | null = null;
  /** The prefix cache's salt: the request's cache_salt and its adapter's fingerprint (saltFor). */
  salt = "";
  /** The LoRA adapter it runs on (none: the base model); the engine counts it as one of the adapter's streams. */
  lora: CpuLoraHandle | undefined = undefined;
  constructor(owner: CpuBackedEngine, cache: Cache, residence: "device" | "host") {
    this.owner = owner;
    this.seq = ++streamCounter;
    this.id = `${owner.name}-${process.pid}-${this.seq}`;
    this.cache = cache;
    this.residence = residence;
  }
  get length(): number {
    return this.cache.n;
  }
  get blocks(): number {
    return this.cache.blocks.length;
  }
}

/** Kept blocks held for a request (engine.holdPrefix): one reference each until released. */
class Hold implements PrefixHold {
  private released = false;
  constructor(
    readonly owner: CpuBackedEngine,
    private readonly pool: { release(id: number): void; notifyFreed(): void },
    readonly ids: readonly number[],
    readonly n: number,
    readonly hash: string | null,
  ) {}
  get live(): boolean {
    return !this.released;
  }
  release(): void {
    if (this.released) return;
    this.released = true;
    for (const id of this.ids) this.pool.release(id);
    if (this.ids.length > 0) this.pool.notifyFreed();
  }
}

class Reservation implements KVReservation {
  private left: number;
  constructor(
    private readonly pool: { unreserve(n: number): void },
    readonly blocks: number,
  ) {
    this.left = blocks;
  }
  /** Hands the reserved blocks to a cache (which spends them first); the reservation is then empty. */
  moveTo(cache: Cache): void {
    cache.addReservation(this.left);
    this.left = 0;
  }
  release(): void {
    if (this.left > 0) this.pool.unreserve(this.left);
    this.left = 0;
  }
}

function defaultActive(variants: EngineVariant[]): EngineVariant {
  // The widest batch at the largest S: the decode graph a serving worker runs by default.
  const S = Math.max(...variants.map((v) => v.seqLen));
  return variants.filter((v) => v.seqLen === S).sort((a, b) => b.batch - a.batch)[0];
}

/** An Engine running on the CPU reference model. Create with `CpuBackedEngine.open`. */
export class CpuBackedEngine implements Engine {
  readonly name: string;
  readonly backend: string;
  readonly device: DeviceInfo;
  model: ModelInfo;
  /** The longest request (prompt + max_tokens) served. */
  readonly maxModelLen: number;
  /** How the KV cache was sized, e.g. "0.25 of 18.20 GiB available". */
  readonly kvBudgetNote: string;
  private readonly spec: CpuEngineSpec;
  private readonly llama: LlamaModule;
  private ckpt: CpuCheckpoint;
  private hashes: CheckpointHashes;
  private cpu: CpuModel;
  private variantList: EngineVariant[];
  private active: EngineVariant;
  private prefixes: PrefixCache;
  private readonly loop: PassLoop;
  private readonly streams = new Set<EngineStream>();
  /** The host's core board (spec.coreBoard), else null. */
  private readonly board: CoreBoard | null;
  /** Passes that ran with the second kernel thread. */
  private secondThreadPasses = 0;
  /** The stream of each decode step waiting in the loop (to preempt it there). */
  private readonly workStream = new WeakMap<DecodeWork, EngineStream>();
  private readonly freedListeners = new Set<() => void>();
  private readonly blockListeners = new Set<(e: BlockEvent) => void>();
  private preemptions = 0;
  private weightsFrom: EngineStats["weightsFrom"];
  private loadMs: number;
  readonly cacheNote: string;
  private closed = false;
  /** Open native decode graphs by variant name (one per batch width and context the steps have needed). */
  private readonly nativeGraphs = new Map<string, ReturnType<NativeHostDecode["open"]>>();
  /** LoRA adapters, with `lora` in the spec (the same object as `loras`). */
  private readonly loraSet: EngineLoraSet | undefined;
  readonly loras?: EngineLoras;

  /** How the weight matrices are held, e.g. "120 q4, 1 q8 (98.2 MB per token)". */
  get weightsHeld(): string {
    return this.cpu.weightsSummary();
  }
  /** config.json keys the checkpoint took from its architecture's defaults (empty for GGUF). */
  get configDefaults(): string[] {
    return this.ckpt.configDefaults ?? [];
  }

  /**
   * "generation defaults (from generation_config.json): temperature=0.7 top_p=0.8", or why there
   * are none: the start-up line about the sampling defaults requests get when they leave a field out.
   */
  get generationDefaultsNote(): string {
    const g = this.ckpt.generation;
    const ignored = g.samplingIgnored?.length ? `; left out: ${g.samplingIgnored.join(", ")}` : "";
    if (this.spec.generationConfig === "vllm") {
      const found = describeSamplingDefaults(samplingDefaults(g));
      return `generation defaults: none (AIRM_GENERATION_CONFIG=vllm${found === "none" ? "" : `; the model's ${found} not used`})`;
    }
    const d = this.model.generationDefaults;
    if (d && Object.keys(d).length) return `generation defaults (from ${g.samplingFrom}): ${describeSamplingDefaults(d)}${ignored}`;
    return `generation defaults: none (${g.samplingFrom ? `${g.samplingFrom} sets none` : "no generation_config.json"})${ignored}`;
  }

  private constructor(spec: CpuEngineSpec, llama: LlamaModule, ckpt: CpuCheckpoint, hashes: CheckpointHashes, weights: LoadedWeights) {
    this.spec = spec;
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
    this.maxModelLen = resolveMaxModelLen(spec, ckpt.config.maxPositionEmbeddings);
    this.variantList = spec.variants?.length ? normalizeVariants(spec.variants) : defaultVariants({ maxModelLen: this.maxModelLen, batch: spec.batch });
    this.active = spec.activeVariant ?? defaultActive(this.variantList);
    this.kvBudgetNote = this.sizePool();
    this.loraSet = spec.lora ? EngineLoraSet.open(this.cpu, spec.lora.modules) : undefined;
    if (this.loraSet) this.loras = this.loraSet;
    this.prefixes = this.newPrefixCache();
    this.cpu.kvPool.onFreed = () => this.blocksFreed();
    this.board = spec.coreBoard ? CoreBoard.open(spec.coreBoard) : null;
    this.loop = new PassLoop(
      () => this.modelForPass(),
      {
        batch: this.widestBatch(),
        maxTokens: spec.maxNumBatchedTokens ?? DEFAULT_MAX_NUM_BATCHED_TOKENS,
        chunkSize: spec.prefillMode === "chunked" ? spec.chunkSize : undefined,
        prefillShare: spec.prefillShare ?? DEFAULT_PREFILL_SHARE,
        packTokens: spec.prefillBatchTokens ?? 0,
        maxLoras: spec.lora ? this.cpu.loraLimits.maxLoras : undefined,
      },
      (steps) => this.makeRoom(steps),
      () => this.decodingStreams(),
    );
    this.model = this.describe();
  }

  /** A prefix cache over the current model's pools, which gives kept blocks back when a pool runs short. */
  private newPrefixCache(): PrefixCache {
    const local = this.cpu.homes.local;
    const cache = new PrefixCache(
      this.spec.prefixCaching ?? false,
      this.cpu.kvPool.blockSize,
      { modelFingerprint: this.hashes.fingerprint, numericsFingerprint: this.cpu.numericsFingerprint, blockSize: this.cpu.kvPool.blockSize },
      this.cpu.kvPool,
      local ? { pool: local.pool, firstLive: (n) => this.cpu.liveLocalFrom(n) } : null,
    );
    this.cpu.kvPool.reclaim = () => cache.evictOldest();
    cache.onEvent = (e) => {
      for (const l of this.blockListeners) l(e);
    };
    return cache;
  }

  /**
   * The model for the next pass: says on the core board that this engine has work and, with
   * secondThread when-idle, lets the pass use the second kernel thread only while no other part
   * on the board has work (same bits either way).
   */
  private modelForPass(): CpuModel {
    let second = this.cpu.threads === 2;
    if (this.board) {
      this.board.publish(true);
      if (second && this.spec.secondThread === "when-idle") {
        second = !this.board.othersBusy();
        this.cpu.useSecondThread(second);
      }
    }
    if (second) this.secondThreadPasses++;
    return this.cpu;
  }

  /** Tells the core board whether this engine still has work (streams or prompts). */
  private publishWork(): void {
    this.board?.publish(this.streams.size > 0 || this.loop.waitingPrompts > 0);
  }

  /** Loads the checkpoint at `modelPath` and the weights, then sizes the KV cache. */
  static async open(modelPath: string, spec: CpuEngineSpec): Promise<CpuBackedEngine> {
    if (spec.lora && spec.nativeHostDecode) {
      throw new UnsupportedError(
        `LoRA adapters: backend ${spec.backend} of engine ${spec.name} decodes on the native vendor runtime (${spec.device.device ?? spec.device.path}), whose compiled graph cannot apply adapters; serve them on a CPU-reference backend, or start without --enable-lora`,
      );
    }
    const llama = LLAMA;
    const ckpt = await llama.loadCheckpoint(modelPath);
    try {
      // Each step below computes for a few hundred ms; between them the event loop answers the
      // worker's /health and /metrics ("loading") instead of leaving probes to time out.
      await yieldToLoop();
      const hashes = checkpointHashes(ckpt, spec.artifactCache?.dir ?? null);
      await yieldToLoop();
      const weights = await loadWeights(llama, ckpt, hashes.fingerprint, spec.artifactCache, {
        threads: spec.threads,
        weights: spec.weights,
        activations: spec.activations,
        blockSize: spec.blockSize,
        lora: spec.lora && modelLoraOptions(spec.lora),
      });
      await yieldToLoop();
      try {
        return new CpuBackedEngine(spec, llama, ckpt, hashes, weights);
      } catch (e) {
        weights.model.close();
        throw e;
      }
    } catch (e) {
      ckpt.tensors.close();
      throw e;
    }
  }

  /** Sets the pool's budget from spec.kvCacheMemory; throws ConfigError when it cannot hold one request of max_model_len. */
  private sizePool(): string {
    const pool = this.cpu.kvPool;
    // The resident LoRA adapters' most (allocated as they load) stays out of the cache's room.
    const loraBytes = this.spec.lora ? loraReserveBytes(this.ckpt.config, this.cpu.loraLimits) : 0;
    const room = Math.max(0, WASM_CAP - this.cpu.rt.allocationTop - WORKING_RESERVE - loraBytes);
    const budget = kvBudgetBlocks({
      memory: this.spec.kvCacheMemory ?? { share: DEFAULT_KV_SHARE },
      blockBytes: this.cpu.kvBlockBytes,
      available: process.availableMemory(),
      room,
    });
    const need = blocksFor(this.maxModelLen, pool.blockSize);
    if (budget.blocks < need) {
      throw new ConfigError(
        "kv-cache-memory",
        `the KV cache (${budget.how}) holds ${budget.blocks} blocks of ${pool.blockSize} positions (${budget.blocks * pool.blockSize} tokens), fewer than one request of max_model_len ${this.maxModelLen} needs (${need} blocks of ${this.cpu.kvBlockBytes} bytes)${loraBytes ? ` with ${(loraBytes / 2 ** 20).toFixed(1)} MiB set aside for --max-loras adapters of --max-lora-rank` : ""}; raise --kv-cache-memory or lower --max-model-len`,
      );
    }
    pool.setMaxBlocks(budget.blocks);
    return budget.how;
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
      ...this.windowInfo(),
      eosTokenIds: [...this.ckpt.generation.eosTokenIds],
      generationDefaults: this.spec.generationConfig === "vllm" ? {} : samplingDefaults(this.ckpt.generation),
    };
  }

  /** The sliding-window layers whose blocks out of the window are dropped (and exported as zeros), for ModelInfo. */
  private windowInfo(): Pick<ModelInfo, "slidingWindow"> {
    const local = this.cpu.homes.local;
    if (!local) return {};
    const layers = this.cpu.homes.windowed.flatMap((w, l) => (w ? [l] : []));
    return { slidingWindow: { window: local.window, layers } };
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

  /** The widest batch any compiled variant runs: how many decode steps one pass takes. */
  widestBatch(): number {
    return Math.max(1, ...this.variantList.map((v) => v.batch));
  }

  // --- the paged KV cache ---------------------------------------------------------------------

  kvCache(): KVCacheInfo {
    const pool = this.cpu.kvPool;
    const cached = this.prefixes.evictableBlocks();
    const used = pool.usedBlocks + pool.reservedBlocks - cached;
    return {
      blockSize: pool.blockSize,
      totalBlocks: pool.totalBlocks,
      usedBlocks: used,
      freeBlocks: pool.totalBlocks - used,
      cachedBlocks: cached,
      blockBytes: this.cpu.kvBlockBytes,
      maxModelLen: this.maxModelLen,
      preemptions: this.preemptions,
    };
  }

  reserve(positions: number, extra = 0): KVReservation | null {
    this.live();
    const pool = this.cpu.kvPool;
    if (!Number.isInteger(positions) || positions < 1 || !Number.isInteger(extra) || extra < 0) {
      throw new ConfigError("positions", `must be an integer >= 1 (and extra >= 0), got ${positions} (+${extra})`);
    }
    const blocks = blocksFor(positions, pool.blockSize) + extra;
    if (blocks > pool.totalBlocks) {
      throw new ContextOverflowError(positions, pool.totalBlocks * pool.blockSize, `${pool.totalBlocks} blocks of ${pool.blockSize} positions`, "the KV cache");
    }
    const headroom = this.growthHeadroom();
    // the pool gives back kept prefix blocks itself (reclaim) when it runs short
    if (!pool.makeAvailable(blocks + headroom) || !pool.reserve(blocks)) return null;
    return new Reservation(pool, blocks);
  }

  /**
   * Blocks a reservation leaves free: one for each stream that holds KV here, which may take a
   * block at its next step. Without it a request (or a preempted stream's recompute) admitted into
   * the last free blocks is the newest stream when the running ones grow, and is preempted again
   * before it gives a token: streams were recomputed over and over and one went 60 s without one.
   */
  private growthHeadroom(): number {
    let n = 0;
    for (const s of this.streams) if (!s.preempted) n++;
    return n;
  }

  /** Calls `listener` with every change to the prefix cache's kept blocks (stored, removed, cleared): what KV events publish. */
  onBlockEvent(listener: (e: BlockEvent) => void): () => void {
    this.blockListeners.add(listener);
    return () => this.blockListeners.delete(listener);
  }

  onBlocksFreed(listener: () => void): () => void {
    this.freedListeners.add(listener);
    return () => this.freedListeners.delete(listener);
  }

  private blocksFreed(): void {
    for (const l of this.freedListeners) l();
  }

  /** A reservation made by this engine's reserve(), or a TypeError. */
  private takeReservation(r: KVReservation | undefined, cache: Cache): void {
    if (r === undefined) return;
    if (!(r instanceof Reservation)) throw new ConfigError("reservation", "the reservation was not made by this engine's reserve()");
    r.moveTo(cache);
  }

  private newCache(): Cache {
    return this.cpu.newCache(this.maxModelLen) as Cache;
  }

  /**
   * Makes the pool hold the blocks the decode steps write: kept prefix blocks go first (the pool's reclaim), then
   * preempts the newest streams (possibly ones in this pass, whose steps then fail with
   * PreemptedError). Returns the steps that stay.
   */
  private makeRoom(steps: DecodeWork[]): DecodeWork[] {
    const pool = this.cpu.kvPool;
    let live = steps.filter((w) => this.stillLive(w));
    for (;;) {
      const need = live.reduce((a, w) => a + Math.max(0, (w.cache as Cache).blocksNeeded(w.cache.n + 1) - (w.cache as Cache).reservedBlocks), 0);
      if (pool.makeAvailable(need)) return live;
      const victim = [...this.streams].filter((s) => !s.preempted && !s.recomputing && s.cache.blocks.length > 0).sort((a, b) => b.seq - a.seq)[0];
      if (!victim) return live;
      this.preempt(victim);
      live = live.filter((w) => this.stillLive(w));
    }
  }

  /** Streams that take decode steps now: live, not preempted, with a step taken since their last recompute or prefill. */
  private decodingStreams(): number {
    let n = 0;
    for (const s of this.streams) if (!s.preempted && !s.recomputing && s.stepped) n++;
    return n;
  }

  /** False (and the step failed with PreemptedError) when the step's stream was preempted. */
  private stillLive(w: DecodeWork): boolean {
    const s = this.workStream.get(w);
    if (!s?.preempted) return true;
    w.reject(new PreemptedError(s.id));
    return false;
  }

  /** Takes a stream's blocks back; it must be recomputed (engine.recompute) before it steps again. */
  private preempt(s: EngineStream): void {
    s.preempted = true;
    this.preemptions++;
    s.cache.clear();
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
      if (!s.preempted && s.length >= this.maxModelLen) throw new ContextOverflowError(s.length + 1, this.maxModelLen, `stream ${s.id} is full`);
    }
    const out: DecodeResult[] = new Array(steps.length);
    const running: number[] = [];
    own.forEach((s, i) => {
      if (s.preempted || s.recomputing) out[i] = { token: -1, error: new PreemptedError(s.id) };
      else running.push(i);
    });
    const logits = this.spec.nativeHostDecode
      ? await this.decodeNative(
          running.map((i) => own[i]),
          running.map((i) => steps[i].token),
        )
      : await Promise.allSettled(running.map((i) => this.queueStep(own[i], steps[i].token)));
    running.forEach((i, k) => {
      const r = logits[k];
      if (r.status === "rejected") {
        if (!isAirmError(r.reason, "PREEMPTED")) throw r.reason;
        out[i] = { token: -1, error: r.reason };
        return;
      }
      // A stream whose constraint fails fails alone: the others' tokens stand.
      const g = steps[i];
      try {
        out[i] = this.pick(r.value, g.sampling, own[i].length, { constraint: g.constraint, top: g.logprobs, history: g.history });
      } catch (error) {
        out[i] = { token: -1, error };
      }
    });
    return out;
  }

  private queueStep(s: EngineStream, token: number): Promise<Float32Array> {
    s.stepped = true;
    s.tokens?.push(token);
    return new Promise<Float32Array>((resolve, reject) => {
      const work: DecodeWork = { cache: s.cache, token, lora: s.lora, resolve, reject };
      this.workStream.set(work, s);
      this.loop.decode([work]);
    });
  }

  /** The smallest compiled variant with context >= `need` that holds `count` streams (the widest there when none does). */
  private variantFor(count: number, need: number): EngineVariant {
    const S = Math.min(...this.variantList.filter((v) => v.seqLen >= need).map((v) => v.seqLen));
    const atS = this.variantList.filter((v) => v.seqLen === S).sort((a, b) => a.batch - b.batch);
    return atS.find((v) => v.batch >= count) ?? atS[atS.length - 1];
  }

  private graphFor(v: EngineVariant): ReturnType<NativeHostDecode["open"]> {
    const key = variantName(v);
    let graph = this.nativeGraphs.get(key);
    if (!graph) {
      const c = this.ckpt.config;
      graph = this.spec.nativeHostDecode!.open({ ...v }, { layers: c.numLayers, kvHeads: c.numKvHeads, headDim: c.headDim, vocabSize: c.vocabSize });
      this.nativeGraphs.set(key, graph);
    }
    return graph;
  }

  /**
   * ATOM's decode graph, on the card: each stream's positions are gathered from its blocks into
   * the graph's dense input of the smallest compiled context that holds them, and the new
   * position it returns is written back into the stream's block. Groups of the widest batch.
   */
  private async decodeNative(streams: EngineStream[], tokens: number[]): Promise<PromiseSettledResult<Float32Array>[]> {
    await this.loop.idle();
    const out: PromiseSettledResult<Float32Array>[] = [];
    const c = this.ckpt.config;
    const g = { kvHeads: c.numKvHeads, headDim: c.headDim };
    const pool = this.cpu.kvPool;
    const B = this.widestBatch();
    for (let at = 0; at < streams.length; at += B) {
      const group = streams.slice(at, at + B);
      const works = group.map((s) => {
        const w: DecodeWork = { cache: s.cache, token: 0, resolve: () => {}, reject: () => {} };
        this.workStream.set(w, s);
        return w;
      });
      const kept = new Set(this.makeRoom(works).map((w) => w.cache));
      for (const s of group) if (!kept.has(s.cache)) out.push({ status: "rejected", reason: new PreemptedError(s.id) });
      const live = group.filter((s) => kept.has(s.cache));
      if (live.length === 0) continue;
      const v = this.variantFor(live.length, Math.max(...live.map((s) => s.length + 1)));
      const dense: DenseKV[] = live.map((s) => {
        const kv = this.cpu.exportKV(s.cache);
        const d: DenseKV = { seqLen: v.seqLen, n: kv.n, k: [], v: [] };
        for (let l = 0; l < c.numLayers; l++) {
          const K = new Uint8Array(denseLayerBytes(g, v.seqLen));
          const V = new Uint8Array(K.length);
          blocksToDense(g, kv.blockSize, kv.n, kv.k[l], kv.v[l], v.seqLen, K, V);
          d.k.push(K);
          d.v.push(V);
        }
        return d;
      });
      const results = this.graphFor(v).step(
        dense,
        live.map((s) => tokens[streams.indexOf(s)]),
      );
      live.forEach((s, i) => {
        s.tokens?.push(tokens[streams.indexOf(s)]);
        const p = s.cache.n;
        s.cache.ensure(p + 1);
        const j = Math.floor(p / pool.blockSize);
        for (let l = 0; l < c.numLayers; l++)
          writeBlockColumn(g, pool.blockSize, p % pool.blockSize, s.cache.view(j, l, "k"), s.cache.view(j, l, "v"), results[i].k[l], results[i].v[l]);
        s.cache.n = p + 1;
        out.push({ status: "fulfilled", value: results[i].logits });
      });
    }
    // in the order of `streams`
    const byStream = new Map<EngineStream, PromiseSettledResult<Float32Array>>();
    let k = 0;
    for (let at = 0; at < streams.length; at += B) for (const s of streams.slice(at, at + B)) byStream.set(s, out[k++]);
    return streams.map((s) => byStream.get(s)!);
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
    if (tokens.length > this.maxModelLen) throw new ContextOverflowError(tokens.length, this.maxModelLen, "prompt alone");
    const lora = this.adapter(options.lora);
    const cache = this.newCache();
    let stream: EngineStream | undefined;
    // The prompt counts as a user of its adapter while it runs (an unload meanwhile waits for it).
    this.loraSet?.hold(lora);
    try {
      this.takeReservation(options.reservation, cache);
      const salt = saltFor(options.cacheSalt, lora);
      const run = await this.runPrompt(tokens, cache, { onLayer: options.onLayer, promptLogprobs: options.promptLogprobs === true, exportKV: !options.keepStream, salt, lora });
      const result = this.firstTokens(tokens, run.rows, options);
      if (options.keepStream) stream = this.addStream(cache, { tokens: tokens.slice(), salt, lora });
      try {
        for (const p of run.pending) await p;
      } catch (e) {
        if (stream) this.release(stream);
        stream = undefined;
        throw e;
      }
      return { ...result, ...(run.kv ? { kv: run.kv } : {}), stream, computeMs: run.computeMs, cachedTokens: run.cachedTokens };
    } finally {
      if (!stream) cache.clear();
      this.loraSet?.release(lora);
      this.publishWork();
    }
  }

  /** The loaded adapter a request names (undefined for none); UnknownLoraError when none of that name is loaded (or the engine serves none). */
  private adapter(name: string | undefined): CpuLoraHandle | undefined {
    if (name === undefined) return undefined;
    if (!this.loraSet) throw new UnknownLoraError(String(name), []);
    return this.loraSet.resolve(name);
  }

  /** A new stream of this engine over `cache`, counted as one of its adapter's streams until released. */
  private addStream(cache: Cache, o: { tokens: number[] | null; salt: string; lora: CpuLoraHandle | undefined }): EngineStream {
    const stream = new EngineStream(this, cache, this.spec.residence);
    stream.tokens = o.tokens;
    stream.salt = o.salt;
    stream.lora = o.lora;
    this.loraSet?.hold(o.lora);
    this.streams.add(stream);
    return stream;
  }

  /**
   * Runs `tokens` into an empty cache through the scheduler: a kept prefix's blocks shared first,
   * the rest computed in passes. Returns the last (or, for prompt log-probabilities, every)
   * position's logits, the time computed, and with `exportKV` the prompt's blobs (taken layer by
   * layer as the last chunk finishes each, when onLayer is called).
   */
  private async runPrompt(
    tokens: number[],
    cache: Cache,
    o: { onLayer?: PrefillOptions["onLayer"]; promptLogprobs: boolean; exportKV: boolean; salt: string; lora: CpuLoraHandle | undefined },
  ): Promise<{ rows: Float32Array[]; computeMs: number; cachedTokens: number; kv?: KVBlobs; pending: Promise<void>[] }> {
    const L = this.ckpt.config.numLayers;
    // Prompt log-probabilities need every position's logits, so they compute the whole prompt.
    const hit = o.promptLogprobs ? null : this.prefixes.lookup(tokens, o.salt);
    if (hit) cache.adopt(hit.blocks, hit.local);
    const k: Uint8Array[] = new Array(L);
    const v: Uint8Array[] = new Array(L);
    const pending: Promise<void>[] = [];
    const emit = (layer: number): void => {
      if (!o.exportKV && !o.onLayer) return;
      k[layer] = cache.layerK(layer, tokens.length);
      v[layer] = cache.layerV(layer, tokens.length);
      const r = o.onLayer?.(layer, k[layer], v[layer]);
      if (r && typeof (r as Promise<void>).then === "function") {
        const p = Promise.resolve(r);
        p.catch(() => undefined); // observed by the caller; no unhandled rejection meanwhile
        pending.push(p);
      }
    };
    const timing = { computeMs: 0 };
    const rows = await new Promise<Float32Array[]>((resolve, reject) => {
      this.loop.prefill({
        tokens: tokens.slice(cache.n),
        cache,
        lora: o.lora,
        allLogits: o.promptLogprobs,
        onLayer: emit,
        take: (count) => cache.ensure(cache.n + count),
        rows: [],
        timing,
        resolve,
        reject,
      });
    });
    for (let l = 0; l < L; l++) if (!k[l]) emit(l);
    this.prefixes.store(tokens, cache.blocks, cache.local, o.salt);
    const kv = o.exportKV ? { blockSize: this.cpu.kvPool.blockSize, n: tokens.length, k, v } : undefined;
    return { rows, computeMs: timing.computeMs, cachedTokens: hit?.n ?? 0, kv, pending };
  }

  /** Every choice's first token from the prompt's last logits (and the prompt's log-probabilities when asked). */
  private firstTokens(tokens: number[], rows: Float32Array[], options: PrefillOptions): Pick<PrefillResult, "firstToken" | "firstLogprobs" | "others" | "promptLogprobs"> {
    const top = options.logprobs ?? 0;
    const done = options.completionTokens ?? 0;
    const out: Pick<PrefillResult, "firstToken" | "firstLogprobs" | "others" | "promptLogprobs"> = { firstToken: -1 };
    // Prompt positions are scored before the last row is masked for the first token.
    if (options.promptLogprobs) out.promptLogprobs = tokens.slice(1).map((t, i) => this.llama.tokenLogprobs(rows[i], t, top));
    // Every choice draws from the same last row, under the same mask (read once), with its own seed.
    const output = new Map<number, number>();
    for (const t of tokens.slice(tokens.length - done)) output.set(t, (output.get(t) ?? 0) + 1);
    const history = { output, prompt: new Set(tokens.slice(0, tokens.length - done)) };
    const mask = options.constraint?.allowedTokens() ?? null;
    const draw = (i: number) =>
      this.pick(rows[rows.length - 1], { ...options.sampling, seed: choiceSeed(options.sampling?.seed, i) }, tokens.length, { mask, top: options.logprobs, history });
    const first = draw(0);
    out.firstToken = first.token;
    if (first.logprobs) out.firstLogprobs = first.logprobs;
    if ((options.choices ?? 1) > 1) out.others = Array.from({ length: options.choices! - 1 }, (_, i) => draw(i + 1));
    return out;
  }

  async recompute(stream: KVStream, tokens: number[], reservation?: KVReservation): Promise<void> {
    this.live();
    const s = this.own(stream);
    if (!s.preempted || s.recomputing) throw new KVIntegrityError("stream", `stream ${s.id} was not preempted (or is being recomputed); nothing to recompute`);
    if (!Array.isArray(tokens) || tokens.length === 0) throw new ConfigError("tokens", "recompute needs the stream's tokens");
    this.checkTokens(tokens, "tokens");
    if (tokens.length > this.maxModelLen) throw new ContextOverflowError(tokens.length, this.maxModelLen, "recompute");
    s.recomputing = true;
    try {
      this.takeReservation(reservation, s.cache);
      const hit = this.prefixes.lookup(tokens, s.salt);
      if (hit) s.cache.adopt(hit.blocks, hit.local);
      s.tokens = tokens.slice();
      await new Promise<Float32Array[]>((resolve, reject) => {
        // Ahead of new prompts: a preempted stream was admitted before them.
        this.loop.prefill(
          {
            tokens: tokens.slice(s.cache.n),
            cache: s.cache,
            lora: s.lora,
            allLogits: false,
            take: (count) => s.cache.ensure(s.cache.n + count),
            rows: [],
            timing: { computeMs: 0 },
            resolve,
            reject,
          },
          true,
        );
      });
      s.preempted = false;
    } catch (e) {
      s.cache.clear();
      throw e;
    } finally {
      s.recomputing = false;
    }
  }

  // --- KV exchange ----------------------------------------------------------------------------

  holdPrefix(tokens: number[], options: { cacheSalt?: string; maxPositions?: number; lora?: string } = {}): PrefixHold {
    this.live();
    this.checkTokens(tokens, "tokens");
    const salt = saltFor(options.cacheSalt, this.adapter(options.lora));
    const bs = this.cpu.kvPool.blockSize;
    const max = Math.floor(Math.min(options.maxPositions ?? tokens.length, tokens.length) / bs);
    const got = this.prefixes.hold(tokens, salt, max);
    return new Hold(this, this.cpu.kvPool, got.blocks, got.blocks.length * bs, got.hashes[got.hashes.length - 1] ?? null);
  }

  importKV(kv: KVBlobs, reservation?: KVReservation, options: ImportOptions = {}): KVStream {
    this.live();
    const c = this.ckpt.config;
    if (kv.blockSize !== this.cpu.kvPool.blockSize) {
      throw new KVIntegrityError(
        "blockSize",
        `imported KV is in blocks of ${kv.blockSize} positions; this engine uses ${this.cpu.kvPool.blockSize} (--block-size must match on both sides)`,
      );
    }
    checkKVBlobs({ layers: c.numLayers, kvHeads: c.numKvHeads, headDim: c.headDim }, kv);
    if (kv.n > this.maxModelLen) throw new KVIntegrityError("n", `imported KV holds ${kv.n} positions, past max_model_len ${this.maxModelLen}`);
    if (options.tokens) {
      if (options.tokens.length !== kv.n) throw new ConfigError("tokens", `imported KV holds ${kv.n} positions; ${options.tokens.length} token ids came with it`);
      this.checkTokens(options.tokens, "tokens");
    }
    const lora = this.adapter(options.lora);
    const cache = this.newCache();
    try {
      this.takeReservation(reservation, cache);
      this.cpu.importKV(cache, kv, this.heldIds(kv, options.held));
    } catch (e) {
      cache.clear();
      throw e;
    }
    return this.addStream(cache, { tokens: options.tokens ? options.tokens.slice() : null, salt: saltFor(options.cacheSalt, lora), lora });
  }

  /** The block ids of a hold of this engine that the KV leaves out (none without one). */
  private heldIds(kv: KVBlobs, held: PrefixHold | undefined): readonly number[] {
    const from = kv.from ?? 0;
    if (held === undefined) {
      if (from > 0) throw new KVIntegrityError("from", `the KV leaves out ${from} positions, and no held prefix came with it`);
      return [];
    }
    if (!(held instanceof Hold) || held.owner !== this || !held.live) throw new KVIntegrityError("held", "the held prefix is not one of this engine's live holds");
    if (held.n !== from) throw new KVIntegrityError("from", `the KV leaves out ${from} positions; the held prefix has ${held.n}`);
    return held.ids;
  }

  fork(stream: KVStream): KVStream {
    const s = this.own(stream);
    if (s.preempted) throw new PreemptedError(s.id);
    const cache = s.cache.fork();
    // One of the parent's reserved blocks goes with the copy (each writes its own copy of the shared last block).
    if (s.cache.reservedBlocks > 1) {
      s.cache.reservedBlocks--;
      cache.addReservation(1);
    }
    return this.addStream(cache, { tokens: s.tokens ? s.tokens.slice() : null, salt: s.salt, lora: s.lora });
  }

  exportKV(stream: KVStream): KVBlobs {
    const s = this.own(stream);
    if (s.preempted) throw new PreemptedError(s.id);
    return this.cpu.exportKV(s.cache);
  }

  release(stream: KVStream): void {
    if (!(stream instanceof EngineStream) || stream.owner !== this || stream.released) return;
    stream.released = true;
    this.streams.delete(stream);
    // Its full blocks (prompt and output) stay findable by hash: the conversation's next turn starts with them.
    const t = stream.tokens;
    if (t && !stream.preempted && !stream.recomputing && t.length === stream.cache.n) this.prefixes.store(t, stream.cache.blocks, stream.cache.local, stream.salt);
    stream.cache.clear();
    this.loraSet?.release(stream.lora);
    this.publishWork();
  }

  // --- checks and sampling ----------------------------------------------------------------------

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

  // --- swap and delta -------------------------------------------------------------------------

  async swap(variant: EngineVariant): Promise<SwapResult> {
    this.live();
    if (!Number.isInteger(variant.batch) || variant.batch < 1 || !Number.isInteger(variant.seqLen) || variant.seqLen < 8) {
      throw new ConfigError("variant", `batch must be >= 1 and seqLen >= 8, got ${JSON.stringify(variant)}`);
    }
    if (variant.seqLen > this.maxModelLen) throw new ConfigError("variant", `seqLen ${variant.seqLen} is past max_model_len ${this.maxModelLen}`);
    const t0 = performance.now();
    const from = { ...this.active };
    const compiled = !this.variantList.some((v) => v.batch === variant.batch && v.seqLen === variant.seqLen);
    if (compiled) this.variantList = normalizeVariants([...this.variantList, { batch: variant.batch, seqLen: variant.seqLen }]);
    this.active = { batch: variant.batch, seqLen: variant.seqLen };
    // Weights and the KV cache stay; on a card only the variant's graph would be made resident.
    if (this.spec.nativeHostDecode) this.graphFor(this.active);
    return { from, to: { ...this.active }, compiled, ms: performance.now() - t0 };
  }

  async applyDelta(modelDir: string): Promise<DeltaResult> {
    this.live();
    if (this.streams.size > 0) {
      throw new UnsupportedError(`applyDelta with ${this.streams.size} live stream(s): their KV was computed with the old weights; release them first`);
    }
    await this.loop.idle();
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
    // Kept KV was computed with the old weights.
    this.prefixes.clear();
    if (!plan.fullReloadRequired) {
      for (const name of plan.changed) this.cpu.updateTensor(name, next.tensors);
      mode = "tensors";
    } else {
      await this.reloadWeights(next, nextHashes.fingerprint);
      mode = "full-reload";
    }
    this.ckpt.tensors.close();
    this.ckpt = next;
    this.hashes = nextHashes;
    // New weights hash from a new root; a reloaded model has new pools.
    this.prefixes = this.newPrefixCache();
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

  /**
   * Loads the model of `next` anew (a delta that changes more than tensors) with the same pool
   * budget, and the LoRA adapters into it under their names; on failure (an adapter that does not
   * fit the new model, say) the engine keeps the old model and `next` is closed.
   */
  private async reloadWeights(next: CpuCheckpoint, fingerprint: string): Promise<void> {
    let weights: LoadedWeights;
    let handles: Map<string, CpuLoraHandle> | undefined;
    try {
      weights = await loadWeights(this.llama, next, fingerprint, this.spec.artifactCache, {
        threads: this.spec.threads,
        weights: this.spec.weights,
        activations: this.spec.activations,
        blockSize: this.cpu.kvPool.blockSize,
        lora: this.spec.lora && modelLoraOptions(this.spec.lora),
      });
    } catch (e) {
      next.tensors.close();
      throw e;
    }
    try {
      handles = this.loraSet?.loadInto(weights.model);
    } catch (e) {
      weights.model.close();
      next.tensors.close();
      throw e;
    }
    weights.model.kvPool.setMaxBlocks(this.cpu.kvPool.totalBlocks);
    weights.model.kvPool.onFreed = () => this.blocksFreed();
    this.cpu.close();
    this.cpu = weights.model;
    if (handles) this.loraSet!.adopt(weights.model, handles);
    this.weightsFrom = weights.weightsFrom;
    this.loadMs = weights.loadMs;
  }

  stats(): EngineStats {
    const kv = this.kvCache();
    return {
      variant: { ...this.active },
      streams: this.streams.size,
      kvBytes: kv.usedBlocks * kv.blockBytes,
      kvCapacityBytes: kv.totalBlocks * kv.blockBytes,
      weightsFrom: this.weightsFrom,
      loadMs: this.loadMs,
      prefixCache: {
        enabled: this.prefixes.enabled,
        queries: this.prefixes.queries,
        hits: this.prefixes.hits,
        reusedTokens: this.prefixes.reusedTokens,
        blocks: this.prefixes.size,
        evictions: this.prefixes.evictions,
      },
      prefillPasses: { passes: this.loop.counts.prefillPasses, prompts: this.loop.counts.prompts },
    };
  }

  /** The pass loop's counters (passes, chunks, prompts, decode steps, passes that mixed both, passes on two kernel threads). */
  passCounts(): PassLoop["counts"] & { secondThread: number } {
    return { ...this.loop.counts, secondThread: this.secondThreadPasses };
  }

  /**
   * Bytes the budget charges one block of the KV cache: every layer's K and V, the
   * sliding-window layers' included (their blocks leave as the window passes, so a long sequence
   * holds less than this per block).
   */
  kvBlockBytes(): number {
    return this.cpu.kvBlockBytes;
  }

  /** Blocks whose memory the KV cache has touched so far (it takes memory as blocks are first used). */
  kvMaterializedBlocks(): number {
    return this.cpu.kvPool.materializedBlocks;
  }

  async close(): Promise<void> {
    if (this.closed) return;
    await this.loop.idle();
    for (const s of [...this.streams]) this.release(s);
    this.prefixes.clear();
    for (const graph of this.nativeGraphs.values()) graph.close();
    this.nativeGraphs.clear();
    this.cpu.close();
    this.ckpt.tensors.close();
    this.board?.close();
    this.closed = true;
  }
}

/** max_model_len: --max-model-len, else the model's context, never past it (nor past the largest compiled variant when variants are given). */
function resolveMaxModelLen(spec: CpuEngineSpec, modelContext: number): number {
  const asked = spec.maxModelLen;
  if (asked !== undefined && (!Number.isInteger(asked) || asked < 8)) throw new ConfigError("max-model-len", `must be an integer >= 8, got ${asked}`);
  if (asked !== undefined && asked > modelContext) {
    throw new ConfigError(
      "max-model-len",
      `${asked} is past the model's context of ${modelContext} tokens (max_position_embeddings / context_length); ask for at most ${modelContext}`,
    );
  }
  const largest = spec.variants?.length ? Math.max(...spec.variants.map((v) => v.seqLen)) : Number.POSITIVE_INFINITY;
  if (asked !== undefined && asked > largest) throw new ConfigError("max-model-len", `${asked} is past the largest compiled variant's context ${largest} (AIRM_VARIANTS)`);
  return Math.min(asked ?? modelContext, largest);
}
