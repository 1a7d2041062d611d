// The Llama / Qwen2 / Qwen3 / Gemma 3 forward pass over explicit KV caches: weights packed as bf16 into one wasm
// memory, whole-prompt prefill, chunked prefill and batched decode sharing one code path (so they
// agree bit for bit). Knows the architecture and the numerics; loading files and sampling are
// done elsewhere.
import { createHash } from "node:crypto";
import { AirmError, ConfigError, ContextOverflowError, KVCacheFullError, KVIntegrityError, KV_LAYOUT, checkKVBlobs, firstLiveBlock, type KVBlobs } from "@airm/rm-core";
import type { Checkpoint, ModelConfig, TensorSource } from "../checkpoint-types.ts";
import { traitsOf } from "../checkpoint/architecture-traits.ts";
import { KERNEL_VERSION, NUMERICS_CHOICES } from "../kernels/assemble.ts";
import { KernelRuntime, WEIGHT_MEMORY_BYTES } from "../kernels/kernel-runtime.ts";
import { GROUP_BLOCK_BYTES, QUANT_IMAGE_LAYOUT, dequantImageRow, takesA8, type QuantKind, type WeightKind } from "../kernels/quant-image.ts";
import { imageIndex } from "../kernels/weight-image.ts";
import { type LoadLoraOptions, type LoraHandle, type LoraOptions, LoraRegistry, loraLimits } from "../lora/lora-registry.ts";
import type { LoraGroup } from "../lora/projections.ts";
import { applyLora, type ResidentLora } from "../lora/resident-lora.ts";
import { PagedKVCache, wholeContextHomes, type KVCache, type LayerHomes } from "./kv-cache.ts";
import { KVBlockPool, type KVPoolOptions } from "./kv-pool.ts";
import { RopeTable } from "./rope.ts";
import {
  ACTIVATIONS_MODES,
  type ActivationsMode,
  DEFAULT_ACTIVATIONS,
  type LayerWeights,
  type Matrix,
  WEIGHTS_MODES,
  type WeightSlot,
  type WeightsMode,
  WeightLoader,
  expectShape,
  fillQuantRows,
  weightBytes,
  weightMemoriesFor,
  writeVectorF32,
} from "./weight-loading.ts";

export { ACTIVATIONS_MODES, type ActivationsMode, DEFAULT_ACTIVATIONS, WEIGHTS_MODES, type WeightsMode };

const fr = Math.fround;
/** Tokens per pass through a layer (bounds scratch memory; has no effect on results). */
const TOKEN_BLOCK = 128;

export interface LlamaModelOptions {
  /** Kernel threads: 1 (default) or 2 (rows of each matmul split between two threads). */
  threads?: 1 | 2;
  /** How matrices are held (default `auto`); see WeightsMode. */
  weights?: WeightsMode;
  /** The input width of the Q4 kernels (default DEFAULT_ACTIVATIONS); see ActivationsMode. */
  activations?: ActivationsMode;
  /**
   * Where the weight matrices live: `auto` (default) keeps them in the main wasm memory up to
   * SHARED_WEIGHTS_MAX bytes, in weight memories of their own past that; `separate` always uses
   * weight memories. Placement does not change the arithmetic (same kernels, same order).
   */
  placement?: WeightPlacement;
  /** Usable bytes per weight memory (default: all of wasm32's 4 GiB but a page); tests make it small. */
  weightMemoryBytes?: number;
  /** The paged KV cache: block size (default 16) and budget in blocks (default: what the memory holds). */
  kv?: KVPoolOptions;
  /** LoRA adapters: how many are resident at once and the largest rank accepted (see loadLora). */
  lora?: LoraOptions;
}

export type WeightPlacement = "auto" | "separate";

/**
 * A packed weight image read in order straight into the model's memories (an artifact file), so
 * a warm load never holds the image twice. `readNext` fills `dst` with the next dst.length bytes.
 */
export interface PackedImageReader {
  readonly byteLength: number;
  readNext(dst: Uint8Array): void;
}
const PLACEMENTS: readonly WeightPlacement[] = ["auto", "separate"];

/**
 * Matrix bytes above which `auto` places matrices in weight memories of their own: the main
 * memory (4 GiB in wasm32) also holds the KV caches, activations and logits.
 */
export const SHARED_WEIGHTS_MAX = 3 * 2 ** 30;

/** Image bytes of matrices (what a decode step streams through them). */
const bytesOf = (ms: Matrix[]): number => ms.reduce((a, m) => a + m.segs.reduce((b, g) => b + g.bytes, 0), 0);

export interface PrefillOptions {
  /** Called when layer l's K and V for all prompt tokens are in the cache. */
  onLayer?(layer: number): void;
  /** The LoRA adapter the tokens run on (from loadLora); none: the base model. */
  lora?: LoraHandle;
}

export interface DecodeStep {
  cache: KVCache;
  token: number;
  /** The LoRA adapter this stream runs on; none: the base model. */
  lora?: LoraHandle;
}

/** One item of a forward pass (LlamaModel.pass): tokens going in at the cache's position n. */
export interface PassItem {
  tokens: number[];
  cache: KVCache;
  /** Which logits come back: the last position's (default), every position's, or none. */
  logits?: "last" | "all" | "none";
  /** The LoRA adapter this item's tokens run on; none: the base model. Items of one pass may differ. */
  lora?: LoraHandle;
}

interface Scratch {
  tokens: number; // capacity in tokens (one block)
  normed: number; // f32 [T][widest input]
  xp: number; // f32 [T][widest input], permuted, or quant_x's 16-bit input
  x8: number; // quant_x8's 8-bit input (1.5 bytes per value; the f32 size is kept for simplicity)
  qkv: number; // f32 [T][qkvRows]
  attn: number; // f32 [T][H * D]
  gu: number; // f32 [T][2 I]
  act: number; // f32 [T][I]
  out: number; // f32 [T][hidden]
  bytes: number;
}

/** The load options checked (ConfigError naming the option), with their defaults. */
function checkedOptions(opts: LlamaModelOptions): { mode: WeightsMode; acts: ActivationsMode; placement: WeightPlacement; memoryBytes: number } {
  const mode = opts.weights ?? "auto";
  if (!WEIGHTS_MODES.includes(mode)) throw new ConfigError("weights", `must be one of ${WEIGHTS_MODES.join(", ")}, got ${String(mode)}`);
  const acts = opts.activations ?? DEFAULT_ACTIVATIONS;
  if (!ACTIVATIONS_MODES.includes(acts)) throw new ConfigError("activations", `must be one of ${ACTIVATIONS_MODES.join(", ")}, got ${String(acts)}`);
  const placement = opts.placement ?? "auto";
  if (!PLACEMENTS.includes(placement)) throw new ConfigError("placement", `must be one of ${PLACEMENTS.join(", ")}, got ${String(placement)}`);
  const memoryBytes = opts.weightMemoryBytes ?? WEIGHT_MEMORY_BYTES;
  if (!Number.isInteger(memoryBytes) || memoryBytes < 65536 || memoryBytes > WEIGHT_MEMORY_BYTES) {
    throw new ConfigError("weightMemoryBytes", `must be an integer in [65536, ${WEIGHT_MEMORY_BYTES}], got ${String(memoryBytes)}`);
  }
  loraLimits(opts.lora);
  return { mode, acts, placement, memoryBytes };
}

/**
 * Reads a packed weight image into the main memory's weights ([start, end)) and every weight
 * memory's, in that order; throws when its size is not what this config (`id`, packed `format`)
 * packs to.
 */
function readPackedImage(image: PackedImageReader, rt: KernelRuntime, start: number, end: number, config: { id: string; format: string }): void {
  const ranges = rt.weightRanges();
  const packs = end - start + ranges.reduce((a, r) => a + r.end - r.start, 0);
  if (image.byteLength !== packs) {
    throw new AirmError(
      "MODEL_LOAD",
      `packed weight image has ${image.byteLength} bytes, this config (${config.id}) packs to ${packs} under ${config.format}; rebuild the image from the checkpoint`,
    );
  }
  image.readNext(rt.u8.subarray(start, end));
  for (const r of ranges) {
    const view = rt.weightView(r.memory * 2 ** 32 + r.start);
    image.readNext(view.u8.subarray(view.offset, view.offset + r.end - r.start));
  }
}

/** Numbers of the shape the kernels need, checked once. */
function checkShape(c: ModelConfig): void {
  const need = (ok: boolean, key: string, msg: string): void => {
    if (!ok) throw new ConfigError(key, msg);
  };
  for (const [k, v] of Object.entries({
    hiddenSize: c.hiddenSize,
    intermediateSize: c.intermediateSize,
    numLayers: c.numLayers,
    numHeads: c.numHeads,
    numKvHeads: c.numKvHeads,
    headDim: c.headDim,
    vocabSize: c.vocabSize,
  })) {
    need(Number.isInteger(v) && v > 0, k, `must be a positive integer, got ${v}`);
  }
  need(c.hiddenSize % 8 === 0, "hiddenSize", `must be a multiple of 8 for the wasm kernels, got ${c.hiddenSize}`);
  need(c.intermediateSize % 8 === 0, "intermediateSize", `must be a multiple of 8, got ${c.intermediateSize}`);
  need(c.headDim % 4 === 0, "headDim", `must be a multiple of 4, got ${c.headDim}`);
  need((c.numHeads * c.headDim) % 8 === 0, "numHeads", `numHeads*headDim must be a multiple of 8, got ${c.numHeads * c.headDim}`);
  need(c.numHeads % c.numKvHeads === 0, "numKvHeads", `numHeads (${c.numHeads}) must be a multiple of numKvHeads (${c.numKvHeads})`);
  if (c.slidingWindow) {
    need(
      Number.isInteger(c.slidingWindow.window) && c.slidingWindow.window >= 4,
      "slidingWindow",
      `the window must be an integer of at least 4 positions, got ${c.slidingWindow.window}`,
    );
    need(c.slidingWindow.layers.length === c.numLayers, "slidingWindow", `names ${c.slidingWindow.layers.length} layers, the model has ${c.numLayers}`);
  }
}

/** A loaded model. Create with `LlamaModel.load(checkpoint)`; not safe for concurrent calls. */
export class LlamaModel {
  readonly config: ModelConfig;
  readonly checkpoint: Checkpoint;
  /** sha-256 hex of the kernel source, kernel version and numerics choices: equal fingerprints give equal bits. */
  readonly numericsFingerprint: string;
  readonly threads: 1 | 2;
  /** Bytes of matrix weights one decode step streams (all layers plus the LM head), as held. */
  readonly weightBytesPerToken: number;
  /** KV layout written and read by this model. */
  readonly kvLayout = KV_LAYOUT;
  /** How matrices are held (the load option). */
  readonly weightsMode: WeightsMode;
  /** The input width of the Q4 kernels (the load option). */
  readonly activations: ActivationsMode;
  /** Matrices by kind held in memory (a fused group counts once per segment; the tied LM head is the embedding). */
  readonly weightKinds: Record<WeightKind, number>;

  /** How the matrices are held, e.g. "1 q8, 120 q4 (98.2 MB per token)". */
  weightsSummary(): string {
    const kinds = Object.entries(this.weightKinds)
      .filter(([, n]) => n > 0)
      .map(([k, n]) => `${n} ${k}`)
      .join(", ");
    return `${kinds} (${(this.weightBytesPerToken / 1e6).toFixed(1)} MB per token)`;
  }

  /** @internal */ readonly rt: KernelRuntime;
  /** The paged KV cache every cache of this model takes its blocks from (its whole-context layers' when some slide). */
  readonly kvPool: KVBlockPool;
  /** Where each layer's KV lives: the sliding-window layers in a pool of their own when the model mixes both. */
  readonly homes: LayerHomes;
  /** Bytes of one block of positions over every layer: what the KV budget charges a block of kvPool. */
  readonly kvBlockBytes: number;
  private readonly layers: LayerWeights[];
  private readonly slots: Map<string, WeightSlot>;
  private readonly weightsStart: number;
  private readonly weightsEnd: number;
  private readonly placement: WeightPlacement;
  /** Matrices' bytes in weight memories of their own (0 when they share the main memory). */
  readonly separateWeightBytes: number;
  private readonly embed: Matrix;
  private readonly finalNorm: number;
  private readonly lmHead: Matrix;
  private readonly rope: RopeTable;
  /** Gemma 3's sliding-window layers rotate with their own base; undefined otherwise. */
  private readonly ropeLocal: RopeTable | undefined;
  private readonly qkvRows: number;
  private readonly widest: number;
  private scratch: Scratch | undefined;
  private scores = 0;
  private scoresCap = 0;
  private ropeRows = 0;
  private ropeRowsTokens = 0;
  private logits = 0;
  private logitsRows = 0;
  private tables = 0;
  private tablesCap = 0;
  /** Attention tile descriptors (64 bytes each) and their capacity. */
  private descs = 0;
  private descsCap = 0;
  /** Each thread's scores of a tile (4 queries), and the sink of padded queries' outputs. */
  private tileScratch = 0;
  private tileScratchBytes = 0;
  private resid = 0;
  private residTokens = 0;
  private closed = false;
  /** The LoRA adapters loaded into this model, and which are resident. */
  private readonly loraRegistry: LoraRegistry;

  private constructor(
    ckpt: Checkpoint,
    rt: KernelRuntime,
    layers: LayerWeights[],
    embed: Matrix,
    finalNorm: number,
    lmHead: Matrix,
    slots: Map<string, WeightSlot>,
    weightsStart: number,
    weightsEnd: number,
    weightsMode: WeightsMode,
    placement: WeightPlacement,
    activations: ActivationsMode,
    kv: KVPoolOptions | undefined,
    lora: LoraOptions | undefined,
  ) {
    this.loraRegistry = new LoraRegistry(rt, ckpt.config, { path: ckpt.path, id: ckpt.id }, lora);
    this.weightsMode = weightsMode;
    this.activations = activations;
    this.placement = placement;
    // Every matrix once, in load order (the tied LM head is the embedding).
    const matrices = [...layers.flatMap((L) => [L.wqkv, L.wo, L.wgu, L.wd]), embed, ...(lmHead === embed ? [] : [lmHead])];
    this.weightKinds = { bf16: 0, q8: 0, q4: 0, q4k: 0, q6k: 0, q4a8: 0, q4ka8: 0, q6ka8: 0, q5a8: 0 };
    for (const g of matrices.flatMap((m) => m.segs)) this.weightKinds[g.kind]++;
    const kindList = matrices.map((m) => m.segs.map((g) => g.kind).join("+")).join(",");
    this.slots = slots;
    this.weightsStart = weightsStart;
    this.weightsEnd = weightsEnd;
    this.separateWeightBytes = rt.weightRanges().reduce((a, r) => a + r.end - r.start, 0);
    this.checkpoint = ckpt;
    this.config = ckpt.config;
    this.rt = rt;
    this.threads = rt.threads;
    this.layers = layers;
    this.embed = embed;
    this.finalNorm = finalNorm;
    this.lmHead = lmHead;
    this.weightBytesPerToken = bytesOf([...layers.flatMap((L) => [L.wqkv, L.wo, L.wgu, L.wd]), lmHead]);
    const c = ckpt.config;
    this.rope = new RopeTable(c.headDim, c.ropeTheta, c.ropeScaling);
    this.ropeLocal = c.slidingWindow ? new RopeTable(c.headDim, c.slidingWindow.ropeTheta, null) : undefined;
    const sliding = c.slidingWindow?.layers ?? [];
    const windowed = sliding.filter(Boolean).length;
    if (windowed > 0 && windowed < c.numLayers) {
      // Whole-context layers in kvPool; sliding-window layers in a pool whose blocks leave as the window passes them.
      const shape = (layers: number) => ({ layers, kvHeads: c.numKvHeads, headDim: c.headDim });
      this.kvPool = new KVBlockPool(rt, shape(c.numLayers - windowed), kv);
      const local = new KVBlockPool(rt, shape(windowed), { blockSize: this.kvPool.blockSize });
      const slot: number[] = [];
      const seen = [0, 0];
      for (const w of sliding) slot.push(seen[w ? 1 : 0]++);
      this.homes = { windowed: [...sliding], slot, local: { pool: local, window: c.slidingWindow!.window } };
    } else {
      this.kvPool = new KVBlockPool(rt, { layers: c.numLayers, kvHeads: c.numKvHeads, headDim: c.headDim }, kv);
      this.homes = wholeContextHomes(c.numLayers);
    }
    this.kvBlockBytes = this.kvPool.blockBytes + (this.homes.local?.pool.blockBytes ?? 0);
    this.qkvRows = (c.numHeads + 2 * c.numKvHeads) * c.headDim;
    this.widest = Math.max(c.hiddenSize, c.numHeads * c.headDim, c.intermediateSize);
    // The kind of every matrix is part of the arithmetic: a bf16 and a q8 model never share KV.
    // Stages beyond the Llama block (Qwen3's q/k norm, Gemma 3's) change the arithmetic too; none for Llama and Qwen2.
    const stages = stagesOf(c);
    this.numericsFingerprint = createHash("sha256").update(`${KERNEL_VERSION}\n${rt.kernelSourceSha256}\n${NUMERICS_CHOICES}\nmatrices=${kindList}${stages}`).digest("hex");
  }

  /** Id of the packed weight image layout (see `exportPackedWeights`); part of an artifact key. */
  static readonly packedFormat = LlamaModel.packedFormatFor("auto");

  /** The packed image format of a model loaded with `weights: mode` and `activations: acts`. */
  static packedFormatFor(mode: WeightsMode, placement: WeightPlacement = "auto", acts: ActivationsMode = DEFAULT_ACTIVATIONS): string {
    // auto: matrices in the main memory's range up to SHARED_WEIGHTS_MAX, else after it, weight memory by weight memory.
    const where = placement === "auto" ? "" : `,placement=${placement}`;
    // i8: Q4 / Q4_K / Q6_K images in the byte order of the kernels over 8-bit inputs
    const a8 = acts === "i8" ? ",q4+q4k+q6k=a8-order" : "";
    // Every image's bytes per block of a 4-row group, and the layout version: a stored image of an
    // older layout gets another key, so it is rebuilt, never read as this one.
    const groups = Object.entries(GROUP_BLOCK_BYTES)
      .map(([k, b]) => `${k}${b}`)
      .join("|");
    return `${KERNEL_VERSION};weights=interleave4-bf16|${groups},layouts=${QUANT_IMAGE_LAYOUT},mode=${mode}${where}${a8},fused=qkv+gate_up,norms+bias=f32;v2`;
  }

  /**
   * Packs the checkpoint's weights as bf16 into one wasm memory (q/k/v and gate/up fused row-wise).
   * Throws ConfigError for shapes the kernels cannot run, AirmError MODEL_LOAD for a tensor with the
   * wrong shape or a missing tensor (the TensorSource names the file).
   */
  static async load(ckpt: Checkpoint, opts: LlamaModelOptions = {}): Promise<LlamaModel> {
    return LlamaModel.build(ckpt, opts, undefined);
  }

  /**
   * Builds the model from an image written by `exportPackedWeights` of a model of the same
   * checkpoint and `packedFormat` (no tensor is read or converted). Throws AirmError MODEL_LOAD
   * when the image does not have the size this config packs to.
   */
  static async loadPacked(ckpt: Checkpoint, image: Uint8Array | PackedImageReader, opts: LlamaModelOptions = {}): Promise<LlamaModel> {
    if (image instanceof Uint8Array) {
      let at = 0;
      const bytes = image;
      return LlamaModel.build(ckpt, opts, {
        byteLength: bytes.byteLength,
        readNext(dst) {
          dst.set(bytes.subarray(at, at + dst.length));
          at += dst.length;
        },
      });
    }
    return LlamaModel.build(ckpt, opts, image);
  }

  /**
   * The model of `ckpt` under `opts`, in named stages: check the options, size the weights (and
   * refuse before touching a page when they cannot fit), reserve the runtime's memory, allocate
   * and fill the weights (WeightLoader), or read them from the packed `image`.
   */
  private static async build(ckpt: Checkpoint, opts: LlamaModelOptions, image: PackedImageReader | undefined): Promise<LlamaModel> {
    checkShape(ckpt.config);
    const { mode, acts, placement, memoryBytes } = checkedOptions(opts);
    const { sizes, matrixBytes, vectorBytes } = weightBytes(ckpt.tensors, ckpt.config, mode, acts);
    // Refuse before touching a page: a wasm memory that outgrows the machine dies of OOM later.
    const free = process.availableMemory();
    if (matrixBytes + vectorBytes > free) {
      throw new AirmError(
        "MODEL_LOAD",
        `${ckpt.id} needs ${matrixBytes + vectorBytes} bytes for its weights (${mode} mode), and this process can have ${free} more (MemAvailable, or the cgroup limit); use a smaller or more quantized model, or free memory`,
      );
    }
    const weightMemories = placement === "separate" || matrixBytes > SHARED_WEIGHTS_MAX ? weightMemoriesFor(sizes, memoryBytes) : 0;
    // Reserve what the weights will take up front (the memory grows later as needed).
    const totalBytes = weightMemories > 0 ? vectorBytes : matrixBytes + vectorBytes;
    const rt = await KernelRuntime.create({ threads: opts.threads ?? 1, initialBytes: totalBytes, weightMemories, weightMemoryBytes: opts.weightMemoryBytes });
    try {
      const start = rt.allocationTop;
      const loader = new WeightLoader(rt, ckpt.tensors, mode, acts, image === undefined);
      const { layers, embed, finalNorm, lmHead } = loader.model(ckpt.config);
      const end = rt.allocationTop;
      if (image !== undefined) readPackedImage(image, rt, start, end, { id: ckpt.id, format: LlamaModel.packedFormatFor(mode, placement, acts) });
      return new LlamaModel(ckpt, rt, layers, embed, finalNorm, lmHead, loader.slots, start, end, mode, placement, acts, opts.kv, opts.lora);
    } catch (e) {
      rt.close();
      throw e;
    }
  }

  /**
   * The packed weight image: the exact bytes this model keeps in its memory after converting and
   * packing the checkpoint, as live views (no copy; do not keep them across calls that allocate).
   * `LlamaModel.loadPacked` rebuilds an identical model from their concatenation.
   */
  exportPackedWeights(): { format: string; segments: Uint8Array[] } {
    this.checkOpen();
    const segments = [new Uint8Array(this.rt.memory.buffer, this.weightsStart, this.weightsEnd - this.weightsStart)];
    for (const r of this.rt.weightRanges()) {
      const view = this.rt.weightView(r.memory * 2 ** 32 + r.start);
      segments.push(view.u8.subarray(view.offset, view.offset + r.end - r.start));
    }
    return { format: LlamaModel.packedFormatFor(this.weightsMode, this.placement, this.activations), segments };
  }

  /**
   * Re-reads one tensor (HF name) from `source` into the packed weights, in place; the model then
   * computes exactly as if loaded from a checkpoint holding the new tensor. KV caches computed
   * with the old weights are stale. Throws ConfigError for a name that is not a weight of this
   * model, AirmError MODEL_LOAD for a wrong shape.
   */
  updateTensor(name: string, source: TensorSource): void {
    this.checkOpen();
    const slot = this.slots.get(name);
    if (!slot) throw new ConfigError("tensor", `${name} is not a weight of this ${this.config.architecture} model`);
    if (slot.kind === "vector") {
      writeVectorF32(this.rt, source, name, (slot.ptr >>> 2) + slot.offset, slot.n, slot.plusOne);
      return;
    }
    const { ptr, rowsTotal, cols, row0, rows } = slot;
    expectShape(source, name, [rows, cols]);
    if (slot.weights !== "bf16") {
      fillQuantRows(this.rt, slot.weights, source, name, ptr, row0, rows, cols);
      return;
    }
    const plain = new Uint16Array(rows * cols);
    source.readBf16(name, plain);
    const view = this.rt.weightView(ptr);
    const u16 = view.u16;
    const base = view.offset / 2;
    for (let r = 0; r < rows; r++) {
      for (let col = 0; col < cols; col++) u16[base + imageIndex(row0 + r, col, rowsTotal, cols)] = plain[r * cols + col];
    }
  }

  /**
   * An empty cache (n = 0) of at most S positions over this model's block pool: blocks are taken
   * as positions are written. Throws ConfigError for a bad S.
   */
  newCache(S: number): KVCache {
    this.checkOpen();
    return new PagedKVCache(this.kvPool, this, S, this.homes);
  }

  /** The cache's KV as blobs of layout rngd-pd/v2 (copies): per layer K and V, its blocks of [0, n). */
  exportKV(cache: KVCache): KVBlobs {
    const w = this.own(cache);
    const L = this.config.numLayers;
    return {
      blockSize: this.kvPool.blockSize,
      n: w.n,
      k: Array.from({ length: L }, (_, l) => w.layerBlob(l, "k")),
      v: Array.from({ length: L }, (_, l) => w.layerBlob(l, "v")),
    };
  }

  /**
   * Fills an empty cache with KV of layout rngd-pd/v2 (from exportKV, here or in another
   * process): takes its blocks and writes every layer. Throws KVIntegrityError for another block
   * size or a wrong shape, ContextOverflowError past the cache's S, KVCacheFullError without
   * blocks (nothing changed then).
   */
  importKV(cache: KVCache, kv: KVBlobs, held: readonly number[] = []): void {
    const w = this.own(cache);
    const c = this.config;
    if (kv.blockSize !== this.kvPool.blockSize) {
      throw new KVIntegrityError("blockSize", `KV in blocks of ${kv.blockSize} positions; this cache uses blocks of ${this.kvPool.blockSize} (--block-size)`);
    }
    checkKVBlobs({ layers: c.numLayers, kvHeads: c.numKvHeads, headDim: c.headDim }, kv);
    if (w.n !== 0 || w.blocks.length !== 0) throw new ConfigError("cache", "importKV fills an empty cache");
    const from = kv.from ?? 0;
    if (held.length * kv.blockSize !== from) throw new KVIntegrityError("from", `the KV leaves out ${from} positions; ${held.length} held blocks of ${kv.blockSize} came with it`);
    if (from > 0 && this.homes.local) throw new KVIntegrityError("from", "a model with sliding-window layers takes every block of imported KV");
    // The blocks the blobs leave out are this pool's own, shared (a kept prefix).
    if (held.length > 0) w.adopt(held);
    // the blocks of sliding-window layers that no query from n on reads are not taken
    w.ensure(kv.n, kv.n);
    for (let l = 0; l < c.numLayers; l++) w.writeLayer(l, kv.k[l], kv.v[l], kv.n, held.length);
    w.n = kv.n;
  }

  /** The first sliding-window block a query at position n or later reads (0 when no layer slides apart). */
  liveLocalFrom(n: number): number {
    const local = this.homes.local;
    return local ? firstLiveBlock(n, local.window, this.kvPool.blockSize) : 0;
  }

  /** Returns a cache's blocks to the pool; the cache must not be used afterwards. */
  freeCache(cache: KVCache): void {
    const w = this.own(cache);
    w.clear();
    w.freed = true;
  }

  /**
   * Runs the whole prompt at positions [cache.n, cache.n + tokens.length), writes its K/V into the
   * cache and returns the logits (f32, vocab) of the last position. Throws ContextOverflowError
   * when the prompt does not fit in the cache, ConfigError for an empty prompt or a bad token id.
   */
  prefill(tokens: number[], cache: KVCache, opts: PrefillOptions = {}): Float32Array {
    return this.prefillRows(tokens, cache, [tokens.length - 1], opts)[0];
  }

  /**
   * Like `prefill`, but returns the logits after every prompt position (teacher forcing,
   * perplexity, parity checks): `result[i]` predicts token i + 1. Same kernels and order, so the
   * last row equals what `prefill` returns. Throws as `prefill`.
   */
  prefillAllLogits(tokens: number[], cache: KVCache, opts: PrefillOptions = {}): Float32Array[] {
    return this.prefillRows(
      tokens,
      cache,
      tokens.map((_, i) => i),
      opts,
    );
  }

  private prefillRows(tokens: number[], cache: KVCache, rows: number[], opts: PrefillOptions): Float32Array[] {
    const w = this.own(cache);
    if (tokens.length === 0) throw new ConfigError("tokens", "the prompt is empty; pass at least one token");
    if (w.n + tokens.length > w.S) throw capacityOverflow(w.n + tokens.length, w.S, "prefill");
    const positions = tokens.map((_, i) => w.n + i);
    const logits = this.forward(
      tokens,
      tokens.map(() => w),
      positions,
      rows,
      opts.onLayer,
      opts.lora && tokens.map(() => opts.lora),
    );
    w.n += tokens.length;
    return logits;
  }

  /**
   * `prefill` (or, with `allLogits`, `prefillAllLogits`) that lets the event loop run between
   * blocks of work: it awaits `pause()` (default: setImmediate) after each token block of each
   * layer, so a process serving HTTP stays responsive during a long prompt. Same kernels and
   * order, so the same bits. The caller must not run another forward on this model meanwhile.
   */
  async prefillAsync(tokens: number[], cache: KVCache, opts: PrefillOptions & { allLogits?: boolean; pause?: () => Promise<void> } = {}): Promise<Float32Array[]> {
    const w = this.own(cache);
    if (tokens.length === 0) throw new ConfigError("tokens", "the prompt is empty; pass at least one token");
    if (w.n + tokens.length > w.S) throw capacityOverflow(w.n + tokens.length, w.S, "prefill");
    const rows = opts.allLogits ? tokens.map((_, i) => i) : [tokens.length - 1];
    const steps = this.forwardSteps(
      tokens,
      tokens.map(() => w),
      tokens.map((_, i) => w.n + i),
      rows,
      opts.onLayer,
      opts.lora && tokens.map(() => opts.lora),
    );
    const logits = await drive(steps, opts.pause);
    w.n += tokens.length;
    return logits;
  }

  /**
   * Several prompts in one forward pass: job j's tokens go in at positions [cache.n, ...) of its
   * own cache, and the logits of each job's last position come back in job order (see passAsync).
   */
  async prefillManyAsync(jobs: { tokens: number[]; cache: KVCache }[], opts: PrefillOptions & { pause?: () => Promise<void> } = {}): Promise<Float32Array[]> {
    const rows = await this.passAsync(
      jobs.map((j) => ({ ...j, logits: "last" as const })),
      opts,
    );
    return rows.map((r) => r[0]);
  }

  /**
   * One forward pass over several items, each a run of tokens going in at positions
   * [cache.n, cache.n + tokens.length) of its own cache: prompts, chunks of prompts, decode
   * tokens, all together. Every token's outputs are computed by the same kernels in the same
   * order whatever else is in the pass (the matmul tiles give each token the bits of the
   * one-token kernel; attention reads only the token's own cache), so each item gets the KV bytes
   * and logits it gets alone. Returns per item the logits it asked for: its last position's
   * (`last`, the default), every position's (`all`) or none. Takes the blocks every cache needs
   * first, all or none (KVCacheFullError). Yields to `pause()` (default: setImmediate) after each
   * token block of each layer; `onLayer(l)` fires once layer l of every item is in its cache.
   * Throws ConfigError for an empty item or a cache used twice, ContextOverflowError for an item
   * that does not fit its cache.
   */
  async passAsync(items: PassItem[], opts: PrefillOptions & { pause?: () => Promise<void> } = {}): Promise<Float32Array[][]> {
    if (items.length === 0) return [];
    const plan = this.planPass(items);
    const logits = await drive(this.forwardSteps(plan.tokens, plan.perToken, plan.positions, plan.rows, opts.onLayer, plan.loras), opts.pause);
    return this.finishPass(items, plan, logits);
  }

  /** passAsync without yielding (a decode step, a short prompt). */
  pass(items: PassItem[], opts: PrefillOptions = {}): Float32Array[][] {
    if (items.length === 0) return [];
    const plan = this.planPass(items);
    const logits = this.forward(plan.tokens, plan.perToken, plan.positions, plan.rows, opts.onLayer, plan.loras);
    return this.finishPass(items, plan, logits);
  }

  private planPass(items: PassItem[]): { tokens: number[]; perToken: PagedKVCache[]; positions: number[]; rows: number[]; counts: number[]; loras: PassLoras } {
    const caches = items.map((j) => this.own(j.cache));
    if (new Set(caches).size !== caches.length) throw new ConfigError("items", "each item of a pass needs its own cache");
    const tokens: number[] = [];
    const perToken: PagedKVCache[] = [];
    const positions: number[] = [];
    const rows: number[] = [];
    const counts: number[] = [];
    const loras: (LoraHandle | undefined)[] = [];
    items.forEach((j, i) => {
      const w = caches[i];
      if (j.tokens.length === 0) throw new ConfigError("tokens", "the prompt is empty; pass at least one token");
      if (w.n + j.tokens.length > w.S) throw capacityOverflow(w.n + j.tokens.length, w.S, "prefill");
      const first = tokens.length;
      j.tokens.forEach((t, k) => {
        tokens.push(t);
        perToken.push(w);
        positions.push(w.n + k);
        loras.push(j.lora);
      });
      const want = j.logits ?? "last";
      if (want === "all") for (let k = first; k < tokens.length; k++) rows.push(k);
      else if (want === "last") rows.push(tokens.length - 1);
      counts.push(want === "all" ? j.tokens.length : want === "last" ? 1 : 0);
    });
    return { tokens, perToken, positions, rows, counts, loras };
  }

  private finishPass(items: PassItem[], plan: { counts: number[] }, logits: Float32Array[]): Float32Array[][] {
    const out: Float32Array[][] = [];
    let at = 0;
    items.forEach((j, i) => {
      (j.cache as PagedKVCache).n += j.tokens.length;
      out.push(logits.slice(at, at + plan.counts[i]));
      at += plan.counts[i];
    });
    return out;
  }

  /**
   * Prefill in chunks of `chunkSize` tokens against the live cache; gives the same KV bytes and
   * logits as `prefill` (same kernels, same order). Throws as `prefill`.
   */
  prefillChunk(tokens: number[], cache: KVCache, chunkSize: number, opts: Pick<PrefillOptions, "lora"> = {}): Float32Array {
    if (!Number.isInteger(chunkSize) || chunkSize < 1) throw new ConfigError("chunkSize", `must be a positive integer, got ${chunkSize}`);
    const w = this.own(cache);
    if (tokens.length === 0) throw new ConfigError("tokens", "the prompt is empty; pass at least one token");
    if (w.n + tokens.length > w.S) throw capacityOverflow(w.n + tokens.length, w.S, "prefill");
    let logits: Float32Array | undefined;
    for (let i = 0; i < tokens.length; i += chunkSize) logits = this.prefill(tokens.slice(i, i + chunkSize), cache, { lora: opts.lora });
    return logits!;
  }

  /**
   * One step for B streams: each token goes in at its own cache's position n, its K/V are
   * appended, and the logits of each stream are returned in order. Streams must use distinct
   * caches. Throws ContextOverflowError for a full cache.
   */
  decode(steps: DecodeStep[]): Float32Array[] {
    if (steps.length === 0) return [];
    const caches = steps.map((s) => this.own(s.cache));
    if (new Set(caches).size !== caches.length) throw new ConfigError("steps", "each decode stream needs its own cache");
    for (const w of caches) if (w.n + 1 > w.S) throw capacityOverflow(w.n + 1, w.S, "decode");
    const logits = this.forward(
      steps.map((s) => s.token),
      caches,
      caches.map((w) => w.n),
      steps.map((_, i) => i),
      undefined,
      steps.map((s) => s.lora),
    );
    for (const w of caches) w.n += 1;
    return logits;
  }

  /** Stops the kernel thread; the model must not be used afterwards. */
  /**
   * With threads 2: whether the next passes split their matmuls and attention tiles with the
   * second kernel thread (default true) or run them all on the calling thread. Bits are the same
   * either way; a caller that shares the cores with other busy processes turns it off.
   */
  useSecondThread(on: boolean): void {
    this.rt.secondThread = on;
  }

  close(): void {
    this.closed = true;
    this.rt.close();
  }

  /**
   * Reads the LoRA adapter at `folder`, a PEFT folder (adapter_config.json +
   * adapter_model.safetensors) or a llama.cpp GGUF LoRA file, and registers it under `name`; pass
   * items, decode steps and prefill options then name the handle.
   * It is resident at once when fewer than `maxLoras` are (else the least recently used one no
   * running pass holds goes back to disk; an adapter not resident is read again when a pass uses
   * it). Throws LoraError naming the adapter_config.json or GGUF metadata key (`field`: a rank over
   * maxLoraRank is `r`, another base model `base_model_name_or_path`, a GGUF adapter of another
   * architecture `general.architecture`, an unsupported feature its key) or the
   * tensor (`tensor`: missing, unexpected, wrong shape or dtype, truncated); ConfigError for a name
   * in use.
   */
  loadLora(name: string, folder: string, opts: LoadLoraOptions = {}): LoraHandle {
    this.checkOpen();
    return this.loraRegistry.load(name, folder, opts);
  }

  /** Forgets an adapter (by handle or name) and frees its memory once no running pass holds it. */
  unloadLora(lora: LoraHandle | string): void {
    this.checkOpen();
    this.loraRegistry.unload(lora);
  }

  /** The adapter loaded under `name`, if any. */
  getLora(name: string): LoraHandle | undefined {
    return this.loraRegistry.get(name);
  }

  /** Every loaded adapter, resident or not, in load order. */
  loras(): LoraHandle[] {
    return this.loraRegistry.list();
  }

  /** Whether the adapter's matrices are in memory now (not waiting on disk). */
  loraResident(lora: LoraHandle): boolean {
    return this.loraRegistry.isResident(lora);
  }

  /** Adapters resident at once, and the largest rank accepted (the load options). */
  get loraLimits(): { maxLoras: number; maxLoraRank: number } {
    return { maxLoras: this.loraRegistry.maxLoras, maxLoraRank: this.loraRegistry.maxLoraRank };
  }

  /** Streams this model's per-token weight bytes with the plain read loop (bench roofline). */
  streamWeights(): number {
    let acc = 0;
    for (const M of [...this.layers.flatMap((L) => [L.wqkv, L.wo, L.wgu, L.wd]), this.lmHead]) for (const g of M.segs) acc ^= this.rt.streamRead(g.ptr, g.bytes & ~127);
    return acc;
  }

  // ------------------------------------------------------------------------------------------

  private checkOpen(): void {
    if (this.closed) throw new ConfigError("model", "the model was closed; load it again");
  }

  private own(cache: KVCache): PagedKVCache {
    this.checkOpen();
    if (!(cache instanceof PagedKVCache) || cache.owner !== this) {
      throw new ConfigError("cache", "the KV cache belongs to another model; create it with this model's newCache(S)");
    }
    if (cache.freed) throw new ConfigError("cache", "this KV cache was freed; create a new one with model.newCache(S)");
    const held = Math.min(cache.S, cache.blocks.length * this.kvPool.blockSize);
    if (!Number.isInteger(cache.n) || cache.n < 0 || cache.n > held) {
      throw new ConfigError("cache.n", `must be an integer in [0, ${held}] (positions filled; the cache holds ${cache.blocks.length} blocks), got ${cache.n}`);
    }
    return cache;
  }

  private ensureScratch(T: number): Scratch {
    if (this.scratch && this.scratch.tokens >= T) return this.scratch;
    if (this.scratch) this.rt.free(this.scratch.normed, this.scratch.bytes);
    const c = this.config;
    const cap = Math.max(T, 4);
    const sizes = {
      normed: cap * this.widest,
      xp: cap * this.widest,
      x8: this.weightKinds.q4a8 + this.weightKinds.q4ka8 + this.weightKinds.q6ka8 + this.weightKinds.q5a8 > 0 ? cap * this.widest : 0,
      qkv: cap * this.qkvRows,
      attn: cap * c.numHeads * c.headDim,
      gu: cap * 2 * c.intermediateSize,
      act: cap * c.intermediateSize,
      out: cap * c.hiddenSize,
    };
    const padded = (n: number): number => Math.ceil((n * 4) / 64) * 64;
    const bytes = Object.values(sizes).reduce((a, n) => a + padded(n), 0);
    let at = this.rt.alloc(bytes);
    const s = { tokens: cap, bytes } as Scratch;
    for (const [k, n] of Object.entries(sizes)) {
      (s as unknown as Record<string, number>)[k] = at;
      at += padded(n);
    }
    this.scratch = s;
    return s;
  }

  /** f32 [T][hidden]: the residual stream of every token of a call. */
  private ensureResidual(T: number): number {
    if (T > this.residTokens) {
      if (this.resid) this.rt.free(this.resid, this.residTokens * this.config.hiddenSize * 4);
      this.residTokens = Math.max(T, 4);
      this.resid = this.rt.alloc(this.residTokens * this.config.hiddenSize * 4);
    }
    return this.resid;
  }

  /** f32 [rows][vocab] for the LM head output (rows = streams in decode, 1 in prefill). */
  private ensureLogits(rows: number): number {
    if (rows > this.logitsRows) {
      if (this.logits) this.rt.free(this.logits, this.logitsRows * this.config.vocabSize * 4);
      this.logitsRows = Math.max(rows, 4);
      this.logits = this.rt.alloc(this.logitsRows * this.config.vocabSize * 4);
    }
    return this.logits;
  }

  /** f32 [T][headDim]: per token the RoPE cos row then sin row of its position. */
  private ensureRopeRows(T: number): number {
    const tables = this.ropeLocal ? 2 : 1;
    if (T > this.ropeRowsTokens) {
      if (this.ropeRows) this.rt.free(this.ropeRows, tables * this.ropeRowsTokens * this.config.headDim * 4);
      this.ropeRowsTokens = Math.max(T, 4);
      this.ropeRows = this.rt.alloc(tables * this.ropeRowsTokens * this.config.headDim * 4);
    }
    return this.ropeRows;
  }

  /**
   * Writes each cache's block table (the i32 byte addresses of its blocks, in order) into a
   * scratch region of the main memory; returns where each one starts. With a local pool, the
   * sliding-window layers' tables follow at `localDelta` bytes from each main table (0 for a
   * block out of the window, which no query reads).
   */
  private writeTables(caches: PagedKVCache[]): { tableOf: Map<PagedKVCache, number>; localDelta: number } {
    const total = caches.reduce((a, w) => a + w.blocks.length, 0);
    const local = this.homes.local;
    const entries = local ? 2 * total : total;
    if (entries > this.tablesCap) {
      if (this.tables) this.rt.free(this.tables, this.tablesCap * 4);
      this.tablesCap = Math.max(entries, 64);
      this.tables = this.rt.alloc(this.tablesCap * 4);
    }
    const u32 = this.rt.u32;
    const tableOf = new Map<PagedKVCache, number>();
    const localDelta = local ? total * 4 : 0;
    let at = this.tables;
    for (const w of caches) {
      tableOf.set(w, at);
      for (let j = 0; j < w.blocks.length; j++) {
        u32[at >>> 2] = this.kvPool.address(w.blocks[j]);
        if (local) u32[(at + localDelta) >>> 2] = w.local[j] >= 0 ? local.pool.address(w.local[j]) : 0;
        at += 4;
      }
    }
    return { tableOf, localDelta };
  }

  /**
   * The attention of a pass, block of tokens by block of tokens (TOKEN_BLOCK each): a run of
   * consecutive positions of one cache (a prompt or its chunk) goes four tokens at a time, per
   * query head; a lone token (a decode step) four heads of one GQA group at a time when its
   * group has three or more, else query by query (`singles`, indices within the block). Padding
   * repeats the last query and writes to a sink. Descriptors hold the q and output addresses in
   * the block's scratch, each query's positions, its cache's table and the KV head's offsets
   * within a layer (the kernel adds the layer's).
   */
  private planAttention(caches: PagedKVCache[], positions: number[], tableOf: Map<PagedKVCache, number>, localDelta: number, s: Scratch, maxN: number): AttentionPlan {
    const c = this.config;
    const H = c.numHeads,
      D = c.headDim,
      group = c.numHeads / c.numKvHeads;
    const bs = this.kvPool.blockSize;
    const qStride = this.qkvRows * 4;
    const oStride = H * D * 4;
    const kBytes = this.kvPool.kBytes;
    // scores of 4 queries per thread, then a sink of D floats
    const ps = (Math.ceil(maxN / 16) * 16 + 16) * 4;
    const sink = this.ensureTileScratch(2 * 4 * ps + D * 4 + 64) + 2 * 4 * ps;
    const scratch: [number, number] = [this.tileScratch, this.tileScratch + 4 * ps];
    type Tile = [number[], number[], number[], number, number, number[]]; // q, n, out, table, head g
    const perBlock: { tiles: Tile[]; singles: number[] }[] = [];
    for (let t0 = 0; t0 < positions.length; t0 += TOKEN_BLOCK) {
      const end = Math.min(positions.length, t0 + TOKEN_BLOCK);
      const tiles: Tile[] = [];
      const singles: number[] = [];
      for (let t = t0; t < end; ) {
        let u = t + 1;
        while (u < end && caches[u] === caches[t] && positions[u] === positions[u - 1] + 1) u++;
        const table = tableOf.get(caches[t])!;
        const q = (tok: number, h: number) => s.qkv + (tok - t0) * qStride + h * D * 4;
        const o = (tok: number, h: number) => s.attn + (tok - t0) * oStride + h * D * 4;
        if (u - t >= 2) {
          for (let k = t; k < u; k += 4) {
            const toks = [0, 1, 2, 3].map((i) => Math.min(k + i, u - 1));
            for (let h = 0; h < H; h++) {
              tiles.push([
                toks.map((tok) => q(tok, h)),
                toks.map((tok) => positions[tok] + 1),
                toks.map((tok, i) => (k + i < u ? o(tok, h) : sink)),
                table,
                Math.floor(h / group),
                [],
              ]);
            }
          }
        } else if (group >= 3) {
          for (let g = 0; g < c.numKvHeads; g++) {
            for (let h0 = g * group; h0 < (g + 1) * group; h0 += 4) {
              const heads = [0, 1, 2, 3].map((i) => Math.min(h0 + i, (g + 1) * group - 1));
              tiles.push([heads.map((h) => q(t, h)), heads.map(() => positions[t] + 1), heads.map((h, i) => (h0 + i < (g + 1) * group ? o(t, h) : sink)), table, g, []]);
            }
          }
        } else singles.push(t - t0);
        t = u;
      }
      perBlock.push({ tiles, singles });
    }
    const total = perBlock.reduce((a, b) => a + b.tiles.length, 0);
    // Under a sliding window the descriptors are written twice: without it (full layers) and with
    // it, over the sliding-window layers' tables.
    const window = c.slidingWindow?.window ?? 0;
    const start = this.ensureDescs(window > 0 ? 2 * total : total);
    let at = start;
    const u32 = this.rt.u32;
    const blocks = perBlock.map(({ tiles, singles }) => {
      const desc = at;
      for (const [q, n, out, table, g] of tiles) {
        const w = at >>> 2;
        for (let i = 0; i < 4; i++) {
          u32[w + i] = q[i];
          u32[w + 4 + i] = n[i];
          u32[w + 11 + i] = out[i];
        }
        u32[w + 8] = table;
        u32[w + 9] = g * D * bs * 2;
        u32[w + 10] = kBytes + g * bs * D * 2;
        u32[w + 15] = 0;
        at += 64;
      }
      return { desc, descWindow: desc, count: tiles.length, singles };
    });
    if (window > 0) {
      const bytes = total * 64;
      this.rt.u8.copyWithin(start + bytes, start, start + bytes);
      for (let i = 0; i < total; i++) {
        const w = ((start + bytes) >>> 2) + i * 16;
        u32[w + 8] += localDelta;
        u32[w + 15] = window;
      }
      for (const b of blocks) b.descWindow = b.desc + bytes;
    }
    return { blocks, ps, scratch };
  }

  private ensureDescs(count: number): number {
    if (count > this.descsCap) {
      if (this.descs) this.rt.free(this.descs, this.descsCap * 64);
      this.descsCap = Math.max(count, 64);
      this.descs = this.rt.alloc(this.descsCap * 64);
    }
    return this.descs;
  }

  private ensureTileScratch(bytes: number): number {
    if (bytes > this.tileScratchBytes) {
      if (this.tileScratch) this.rt.free(this.tileScratch, this.tileScratchBytes);
      this.tileScratchBytes = Math.ceil(bytes / 65536) * 65536;
      this.tileScratch = this.rt.alloc(this.tileScratchBytes);
    }
    return this.tileScratch;
  }

  private ensureScores(S: number): number {
    if (S > this.scoresCap) {
      if (this.scores) this.rt.free(this.scores, this.scoresCap * 4 + 64);
      this.scoresCap = Math.ceil(S / 64) * 64;
      this.scores = this.rt.alloc(this.scoresCap * 4 + 64);
    }
    return this.scores;
  }

  /**
   * y = M x for n tokens of f32 x [n][cols] at `src`, through `xp` (packed or 16-bit input) and
   * `x8` (8-bit input), each made once if a segment takes it.
   */
  private mm(M: Matrix, src: number, s: Scratch, y: number, n: number, cols: number, rows: number): void {
    if (M.segs[0].kind === "bf16") {
      this.rt.packX(src, s.xp, n, cols);
      this.rt.matmul(M.segs[0].ptr, s.xp, y, n, cols, rows);
      return;
    }
    let x16 = false;
    let x8 = false;
    for (const g of M.segs) {
      const kind = g.kind as QuantKind;
      const a8 = takesA8(kind);
      if (a8 && !x8) this.rt.quantX8(src, s.x8, n, cols);
      else if (!a8 && !x16) this.rt.quantX(src, s.xp, n, cols);
      x8 ||= a8;
      x16 ||= !a8;
      this.rt.matmulQ(kind, g.ptr, a8 ? s.x8 : s.xp, y, n, cols, rows, g.row0, g.row0 + g.rows);
    }
  }

  /**
   * The forward pass for T tokens, token t at positions[t] of caches[t]. Writes every token's
   * K/V (bf16) into its cache layer by layer, attends over the cache, and returns logits for
   * the token indices in `logitRows`.
   */
  private forward(tokens: number[], caches: PagedKVCache[], positions: number[], logitRows: number[], onLayer?: (l: number) => void, loras?: PassLoras): Float32Array[] {
    const steps = this.forwardSteps(tokens, caches, positions, logitRows, onLayer, loras);
    for (let r = steps.next(); ; r = steps.next()) if (r.done) return r.value;
  }

  /**
   * The forward pass as a generator that yields after each block of tokens in each layer, so an
   * async caller can let its event loop run in between (nothing else may use this model's
   * scratch buffers until it finishes). Stages: prepare the pass (blocks, tables, scratch, RoPE
   * rows, the attention plan), embed, then per layer and block of tokens the attention block
   * (project q/k/v, write K/V, attend, project out) and the MLP block, then the LM head. The LoRA
   * adapters of the tokens (`loras`, one per token) are held resident until it ends.
   */
  private *forwardSteps(
    tokens: number[],
    caches: PagedKVCache[],
    positions: number[],
    logitRows: number[],
    onLayer?: (l: number) => void,
    loras?: PassLoras,
  ): Generator<void, Float32Array[]> {
    const adapted = loras?.some((h) => h !== undefined) ? loras : undefined;
    const resident = adapted ? this.loraRegistry.acquire(adapted) : undefined;
    try {
      return yield* this.passSteps(this.preparePass(tokens, caches, positions, logitRows, resident), tokens, logitRows, onLayer);
    } finally {
      if (adapted) this.loraRegistry.release(adapted);
    }
  }

  /** The stages of a prepared pass after preparePass: embed, the layers block by block, the LM head. */
  private *passSteps(pass: PassState, tokens: number[], logitRows: number[], onLayer?: (l: number) => void): Generator<void, Float32Array[]> {
    this.embedTokens(tokens, pass.resid);
    const T = tokens.length;
    for (let l = 0; l < this.config.numLayers; l++) {
      // Tokens go through a layer in blocks; a block's attention only needs K/V of earlier
      // positions, which earlier blocks (or earlier calls) have written. Per-token results do
      // not depend on the blocking.
      for (let t0 = 0; t0 < T; t0 += TOKEN_BLOCK) {
        const n = Math.min(TOKEN_BLOCK, T - t0);
        this.projectQkvAndWriteKv(pass, l, t0, n);
        if (t0 + n >= T) onLayer?.(l);
        this.attendAndProject(pass, l, t0, n);
        this.mlpBlock(pass, l, t0, n);
        yield;
      }
    }
    return this.lmHeadRows(pass, logitRows);
  }

  /**
   * Everything a pass needs before the first layer: token ids checked, the KV blocks of the
   * positions it writes (all or none), RoPE rows, block tables, scratch and the attention plan.
   */
  private preparePass(tokens: number[], caches: PagedKVCache[], positions: number[], logitRows: number[], lora: (ResidentLora | undefined)[] | undefined): PassState {
    const c = this.config;
    const T = tokens.length;
    for (const id of tokens) {
      if (!Number.isInteger(id) || id < 0 || id >= c.vocabSize) throw new ConfigError("token", `token id ${id} is outside the vocabulary [0, ${c.vocabSize})`);
    }
    // Every cache gets the blocks of the positions this pass writes, before anything changes.
    const ends = new Map<PagedKVCache, number>();
    caches.forEach((w, t) => {
      ends.set(w, Math.max(ends.get(w) ?? 0, positions[t] + 1));
    });
    ensureBlocks(this.kvPool, ends);
    const maxPos = positions.reduce((a, p) => Math.max(a, p), 0);
    this.rope.ensure(maxPos + 1);
    this.ropeLocal?.ensure(maxPos + 1);
    const scores = this.ensureScores(maxPos + 1);
    // Each cache's block table (block byte addresses, i32), where the attention kernel reads it.
    const { tableOf, localDelta } = this.writeTables([...ends.keys()]);
    const R = logitRows.length;
    const logits = this.ensureLogits(R);
    const resid = this.ensureResidual(T);
    const s = this.ensureScratch(Math.min(Math.max(T, R), TOKEN_BLOCK));
    const ropeRows = this.ensureRopeRows(T);
    // The attention work of each block of tokens (the same in every layer): tiles of four queries
    // of one KV head, and the tokens that run query by query.
    const attn = this.planAttention(caches, positions, tableOf, localDelta, s, maxPos + 1);
    this.writeRopeRows(this.rope, positions, ropeRows);
    // the local table's rows (sliding-window layers) follow the global ones
    const ropeRowsLocal = this.ropeLocal ? ropeRows + T * c.headDim * 4 : ropeRows;
    if (this.ropeLocal) this.writeRopeRows(this.ropeLocal, positions, ropeRowsLocal);
    return { caches, positions, tableOf, localDelta, scores, logits, resid, s, ropeRows, ropeRowsLocal, attn, lora };
  }

  /** Each token's cos/sin row (D/2 cos, D/2 sin) of `rope` where the rope_kv kernel reads it. */
  private writeRopeRows(rope: RopeTable, positions: number[], ropeRows: number): void {
    const D = this.config.headDim;
    const half = D >> 1;
    const f32 = this.rt.f32;
    for (let t = 0; t < positions.length; t++) {
      const at = (ropeRows >>> 2) + t * D;
      const from = positions[t] * half;
      for (let i = 0; i < half; i++) {
        f32[at + i] = rope.cos[from + i];
        f32[at + half + i] = rope.sin[from + i];
      }
    }
  }

  /** Embedding rows read out of the image into the residual stream: bf16 widened exactly, quantized blocks as q d (+ m). */
  private embedTokens(tokens: number[], resid: number): void {
    const rt = this.rt;
    const c = this.config;
    const hidden = c.hiddenSize;
    const e = this.embed.segs[0];
    const view = rt.weightView(e.ptr);
    const f32 = rt.f32;
    const u32 = rt.u32;
    for (let t = 0; t < tokens.length; t++) {
      const dst = (resid >>> 2) + t * hidden;
      if (e.kind !== "bf16") {
        dequantImageRow(e.kind, view.u8, view.offset, tokens[t], hidden, f32, dst);
        continue;
      }
      const base = view.offset / 2;
      for (let i = 0; i < hidden; i++) u32[dst + i] = view.u16[base + imageIndex(tokens[t], i, c.vocabSize, hidden)] << 16;
    }
    if (traitsOf(c).embedScale) {
      // Gemma: times sqrt(hidden) in the activation dtype (f32 here), as transformers and llama.cpp do
      const scale = fr(Math.sqrt(hidden));
      const n = (resid >>> 2) + tokens.length * hidden;
      for (let i = resid >>> 2; i < n; i++) f32[i] = fr(f32[i] * scale);
    }
  }

  /** The sliding window of layer l in positions, or 0 for a layer that attends the whole context. */
  private windowOf(l: number): number {
    const w = this.config.slidingWindow;
    return w?.layers[l] ? w.window : 0;
  }

  /** RMSNorm of n rows of `hidden` f32 at `x`, in place, with weights `w`. */
  private normRows(x: number, w: number, n: number): void {
    const hidden = this.config.hiddenSize;
    for (let t = 0; t < n; t++) this.rt.rmsnorm(x + t * hidden * 4, w, x + t * hidden * 4, hidden, this.config.rmsNormEps);
  }

  /**
   * Tokens [t0, t0 + n) of layer l up to their K/V: input norm, the fused q/k/v projection, its
   * bias, the per-head q/k norm (Qwen3), RoPE on q and k, and K/V appended to each token's cache.
   */
  private projectQkvAndWriteKv(pass: PassState, l: number, t0: number, n: number): void {
    const c = this.config;
    const rt = this.rt;
    const L = this.layers[l];
    const { s } = pass;
    const hidden = c.hiddenSize;
    const qkvRows = this.qkvRows;
    const res = pass.resid + t0 * hidden * 4;
    for (let t = 0; t < n; t++) rt.rmsnorm(res + t * hidden * 4, L.inNorm, s.normed + t * hidden * 4, hidden, c.rmsNormEps);
    this.mm(L.wqkv, s.normed, s, s.qkv, n, hidden, qkvRows);
    if (L.bqkv) {
      const b = L.bqkv >>> 2;
      const f32 = rt.f32;
      for (let t = 0; t < n; t++) {
        const q = (s.qkv >>> 2) + t * qkvRows;
        for (let r = 0; r < qkvRows; r++) f32[q + r] = f32[q + r] + f32[b + r];
      }
    }
    this.addLora(pass, l, "qkv", t0, n, s.normed, hidden, s.qkv, qkvRows);
    if (L.qNorm) this.normQkHeads(L, s.qkv, n);
    const H = c.numHeads,
      KV = c.numKvHeads,
      D = c.headDim;
    const pool = this.kvPool;
    const bs = pool.blockSize;
    const rows = this.windowOf(l) > 0 ? pass.ropeRowsLocal : pass.ropeRows;
    for (let t = 0; t < n; t++) {
      // q heads then k heads are contiguous: rotate both, then append K/V (bf16) to the cache
      const q = s.qkv + t * qkvRows * 4;
      const pos = pass.positions[t0 + t];
      const at = pass.caches[t0 + t].layerAddress(Math.floor(pos / bs), l);
      const p = pos % bs;
      rt.ropeKv(q, rows + (t0 + t) * D * 4, H + KV, D, q + H * D * 4, KV, at + p * 2, at + pool.kBytes + p * D * 2, bs);
    }
  }

  /** RMSNorm of each q head (q_norm weights) and k head (k_norm weights) of n tokens' q/k/v rows, in place. */
  private normQkHeads(L: LayerWeights, qkv: number, n: number): void {
    const c = this.config;
    const H = c.numHeads,
      D = c.headDim;
    for (let t = 0; t < n; t++) {
      const row = qkv + t * this.qkvRows * 4;
      for (let h = 0; h < H + c.numKvHeads; h++) this.rt.rmsnorm(row + h * D * 4, h < H ? L.qNorm : L.kNorm, row + h * D * 4, D, c.rmsNormEps);
    }
  }

  /** Attention of tokens [t0, t0 + n) of layer l over their caches, the o projection and the residual add. */
  private attendAndProject(pass: PassState, l: number, t0: number, n: number): void {
    const c = this.config;
    const rt = this.rt;
    const { s, attn } = pass;
    const pool = this.kvPool;
    const D = c.headDim;
    const HD = c.numHeads * D;
    const scale = fr(1 / Math.sqrt(c.queryPreAttnScalar ?? D));
    const lo = this.homes.slot[l] * pool.layerStride;
    const window = this.windowOf(l);
    const tableShift = this.homes.windowed[l] ? pass.localDelta : 0;
    const plan = attn.blocks[t0 / TOKEN_BLOCK];
    // sliding-window layers read the copy of the tile descriptors that carries the window
    rt.attentionTiles(window > 0 ? plan.descWindow : plan.desc, plan.count, pool.blockSize, D, scale, attn.ps, lo, attn.scratch);
    for (const t of plan.singles) {
      const table = pass.tableOf.get(pass.caches[t0 + t])! + tableShift;
      rt.attentionPaged(
        s.qkv + t * this.qkvRows * 4,
        table,
        lo,
        lo + pool.kBytes,
        pool.blockSize,
        D,
        pass.positions[t0 + t] + 1,
        c.numHeads,
        c.numHeads / c.numKvHeads,
        scale,
        pass.scores,
        s.attn + t * HD * 4,
        window,
      );
    }
    const L = this.layers[l];
    this.mm(L.wo, s.attn, s, s.out, n, HD, c.hiddenSize);
    this.addLora(pass, l, "o", t0, n, s.attn, HD, s.out, c.hiddenSize);
    if (L.attnOutNorm) this.normRows(s.out, L.attnOutNorm, n);
    rt.addF32(pass.resid + t0 * c.hiddenSize * 4, s.out, n * c.hiddenSize);
  }

  /** The MLP of tokens [t0, t0 + n) of layer l: its norm, gate/up, SwiGLU (GeGLU for Gemma), down, Gemma's output norm, residual add. */
  private mlpBlock(pass: PassState, l: number, t0: number, n: number): void {
    const c = this.config;
    const rt = this.rt;
    const L = this.layers[l];
    const { s } = pass;
    const hidden = c.hiddenSize,
      I = c.intermediateSize;
    const res = pass.resid + t0 * hidden * 4;
    for (let t = 0; t < n; t++) rt.rmsnorm(res + t * hidden * 4, L.mlpNorm, s.normed + t * hidden * 4, hidden, c.rmsNormEps);
    this.mm(L.wgu, s.normed, s, s.gu, n, hidden, 2 * I);
    this.addLora(pass, l, "gu", t0, n, s.normed, hidden, s.gu, 2 * I);
    if (traitsOf(c).activation === "gelu_tanh") rt.geglu(s.gu, s.act, I, n);
    else rt.swiglu(s.gu, s.act, I, n);
    this.mm(L.wd, s.act, s, s.out, n, I, hidden);
    this.addLora(pass, l, "down", t0, n, s.act, I, s.out, hidden);
    if (L.mlpOutNorm) this.normRows(s.out, L.mlpOutNorm, n);
    rt.addF32(res, s.out, n * hidden);
  }

  /**
   * Adds the LoRA update of each token of [t0, t0 + n) that runs on an adapter to the outputs of
   * fused matmul `group` of layer l: inputs f32 [n][cols] at x, outputs f32 [n][rows] at y.
   */
  private addLora(pass: PassState, l: number, group: LoraGroup, t0: number, n: number, x: number, cols: number, y: number, rows: number): void {
    if (!pass.lora) return;
    applyLora(this.rt, pass.lora, t0, n, l, group, { x, xStride: cols * 4, y, yStride: rows * 4 }, this.loraRegistry.kernelScratch);
  }

  /** Final norm and LM head for the requested rows only; copies of their logits. */
  private lmHeadRows(pass: PassState, logitRows: number[]): Float32Array[] {
    const c = this.config;
    const rt = this.rt;
    const { s, resid, logits } = pass;
    const hidden = c.hiddenSize;
    const R = logitRows.length;
    for (let i0 = 0; i0 < R; i0 += TOKEN_BLOCK) {
      const n = Math.min(TOKEN_BLOCK, R - i0);
      for (let i = 0; i < n; i++) rt.rmsnorm(resid + logitRows[i0 + i] * hidden * 4, this.finalNorm, s.normed + i * hidden * 4, hidden, c.rmsNormEps);
      this.mm(this.lmHead, s.normed, s, logits + i0 * c.vocabSize * 4, n, hidden, c.vocabSize);
    }
    const out: Float32Array[] = [];
    const f32 = rt.f32;
    for (let i = 0; i < R; i++) out.push(f32.slice((logits >>> 2) + i * c.vocabSize, (logits >>> 2) + (i + 1) * c.vocabSize));
    return out;
  }
}

/** What the stages of one forward pass share: its tokens' caches and positions, and the buffers prepared for it. */
interface PassState {
  caches: PagedKVCache[];
  positions: number[];
  tableOf: Map<PagedKVCache, number>;
  /** Bytes from a cache's table to its sliding-window layers' table (0 without a local pool). */
  localDelta: number;
  /** f32 scores of one query (attention_paged). */
  scores: number;
  /** f32 [rows][vocab] of the requested logits. */
  logits: number;
  /** f32 [T][hidden]: the residual stream. */
  resid: number;
  s: Scratch;
  ropeRows: number;
  /** The local RoPE base's rows (sliding-window layers); ropeRows when there is none. */
  ropeRowsLocal: number;
  attn: AttentionPlan;
  /** Each token's resident LoRA adapter (undefined: the base model); undefined when no token has one. */
  lora: (ResidentLora | undefined)[] | undefined;
}

/** The LoRA adapter of each token of a pass (undefined: the base model). */
type PassLoras = readonly (LoraHandle | undefined)[];

/**
 * The attention work of a pass per block of tokens: tile descriptors (`descWindow`: the same tiles
 * carrying the sliding window, for sliding-window layers), the tokens that run query by query, the
 * bytes between one query's scores and the next's, and each thread's score scratch.
 */
interface AttentionPlan {
  blocks: { desc: number; descWindow: number; count: number; singles: number[] }[];
  ps: number;
  scratch: [number, number];
}

/** A write past a cache's capacity (the S it was made with). */
function capacityOverflow(requested: number, S: number, detail: string): ContextOverflowError {
  return new ContextOverflowError(requested, S, detail, "the cache's capacity");
}

/**
 * Takes the blocks every cache needs to write positions up to (excluding) `to.get(cache)`, all
 * or none: throws KVCacheFullError (nothing taken) when the pool lacks them.
 */
function ensureBlocks(pool: KVBlockPool, to: Map<PagedKVCache, number>): void {
  let need = 0;
  for (const [w, end] of to) need += Math.max(0, w.blocksNeeded(end) - w.reservedBlocks);
  if (!pool.makeAvailable(need)) {
    throw new KVCacheFullError(`this pass writes into ${to.size} cache(s) and needs ${need} more KV blocks; ${pool.availableBlocks} of ${pool.totalBlocks} are free`);
  }
  for (const [w, end] of to) w.ensure(end);
}

/** Runs a forward pass generator to its end, awaiting `pause()` (default: setImmediate) at each of its yields. */
async function drive<T>(steps: Generator<void, T>, pause: () => Promise<void> = () => new Promise<void>((r) => setImmediate(r))): Promise<T> {
  try {
    for (let r = steps.next(); ; r = steps.next()) {
      if (r.done) return r.value;
      await pause();
    }
  } finally {
    // a pause that threw leaves the pass unfinished: end it, so it lets go of what it holds (its LoRA adapters)
    steps.return(undefined as T);
  }
}

/** The fingerprint's line for stages beyond the Llama block ("" for Llama and Qwen2). */
function stagesOf(c: ModelConfig): string {
  const t = traitsOf(c);
  const parts: string[] = [];
  if (t.qkNorm) parts.push("qk-rmsnorm(per head, f32, after bias, before rope)");
  if (t.normPlusOne) parts.push("norm-weights=f32(1+w)");
  if (t.sandwichNorms) parts.push("sandwich-norms(attn out, mlp out)");
  if (t.embedScale) parts.push("embed*f32(sqrt(hidden))");
  if (t.activation === "gelu_tanh") parts.push("geglu");
  if (c.queryPreAttnScalar !== undefined) parts.push(`scale=1/sqrt(${c.queryPreAttnScalar})`);
  if (c.slidingWindow)
    parts.push(`sliding-window=${c.slidingWindow.window}@${c.slidingWindow.layers.map((b) => (b ? "s" : "f")).join("")},local-theta=${c.slidingWindow.ropeTheta}`);
  return parts.length ? `\nstages=${parts.join(";")}` : "";
}

/** f32 bits -> bf16 bits, round to nearest even; NaN stays a quiet NaN. */
export function bf16Bits(bits: number): number {
  if ((bits & 0x7fffffff) > 0x7f800000) return ((bits >>> 16) | 0x40) & 0xffff;
  return ((bits + 0x7fff + ((bits >>> 16) & 1)) >>> 16) & 0xffff;
}
