// Loading a checkpoint's weights into a kernel runtime: the image each matrix takes under a
// weights mode (bf16, or block types the integer kernels run), its size before anything is
// allocated, and the loader that allocates and fills them (or leaves them for a packed image to
// fill) and records where each tensor went. LlamaModel.build runs these stages in order.
import { AirmError } from "@airm/rm-core";
import type { ModelConfig, TensorSource } from "../checkpoint-types.ts";
import { traitsOf } from "../checkpoint/architecture-traits.ts";
import type { KernelRuntime } from "../kernels/kernel-runtime.ts";
import {
  A8_KIND,
  kindOfStored,
  packStoredRows,
  quantImageBytes,
  quantizable,
  quantizeBf16Rows,
  STORED_TYPES,
  takesA8,
  type QuantKind,
  type WeightKind,
} from "../kernels/quant-image.ts";
import { interleaveRows } from "../kernels/weight-image.ts";

const fr = Math.fround;

/**
 * How matrix weights are held in memory. `auto`: GGUF Q8_0 / Q4_0 / Q4_1 / Q4_K / Q6_K blocks
 * kept as stored and run by the integer kernels, every other matrix as bf16. `bf16`: every matrix
 * dequantised to bf16. `q8_0` / `q4_1`: as `auto`, and float (F32/F16/BF16) matrices quantized to
 * that block type at load. A matrix whose rows are not a multiple of 4 or columns of 32 (256 for
 * K-quants), or a fused group with a part none of the kernels takes, stays bf16; a fused group of
 * different block types runs as segments.
 */
export type WeightsMode = "auto" | "bf16" | "q8_0" | "q4_1";
export const WEIGHTS_MODES: readonly WeightsMode[] = ["auto", "bf16", "q8_0", "q4_1"];

/**
 * The integer width of the inputs of the Q4_0 / Q4_1 / Q4_K / Q6_K kernels. `i8`: inputs quantized
 * to 8 bits per block of 32 (llama.cpp's scheme), exact integer dot products over wasm relaxed
 * SIMD (kernels.wat: q4a8, q4ka8, q6ka8), about 1.8x the 16-bit kernels' multiply-adds per second.
 * `i16`: 16-bit inputs (the more precise, slower kernels). Q8_0 matrices take 16-bit inputs either
 * way. It changes the arithmetic, so it is part of the numerics fingerprint (PD peers must agree).
 */
export type ActivationsMode = "i8" | "i16";
export const ACTIVATIONS_MODES: readonly ActivationsMode[] = ["i8", "i16"];
/** The default: see docs/decisions.md for the measurements it was chosen from. */
export const DEFAULT_ACTIVATIONS: ActivationsMode = "i8";

/**
 * A run of rows of a (fused) weight matrix held in one kind: its image address, first output row,
 * row count and image bytes. A fused group whose parts are stored in different block types (Q4_K
 * q/k with a Q6_K v, as Q4_K_M files have) is several segments over one input.
 */
export interface Segment {
  ptr: number;
  kind: WeightKind;
  row0: number;
  rows: number;
  bytes: number;
}

export interface Matrix {
  segs: Segment[];
}

const FLOAT_TYPES = ["F32", "F16", "BF16"];

/** The kind a stored block type takes under `acts` (one over 8-bit inputs only, as q5a8, needs them), if any. */
function storedKind(dtype: string, acts: ActivationsMode): QuantKind | undefined {
  const k = kindOfStored(dtype);
  return k !== undefined && takesA8(k) && acts !== "i8" ? undefined : k;
}

/**
 * The kind of each part of a fused group under `mode`, or "bf16" for the whole group. With 8-bit
 * activations, Q4_0 / Q4_1 / Q4_K / Q6_K parts take the kernels over 8-bit inputs.
 */
function planKinds(parts: { dtype: string; rows: number }[], cols: number, mode: WeightsMode, acts: ActivationsMode): QuantKind[] | "bf16" {
  if (mode === "bf16") return "bf16";
  const kinds = parts.map((p) => storedKind(p.dtype, acts) ?? (FLOAT_TYPES.includes(p.dtype) ? (mode === "q8_0" ? "q8" : mode === "q4_1" ? "q4" : undefined) : undefined));
  if (kinds.some((k, i) => k === undefined || !quantizable(parts[i].rows, cols, k))) return "bf16";
  return (kinds as QuantKind[]).map((k) => (acts === "i8" ? (A8_KIND[k] ?? k) : k));
}

type Part = { name: string; rows: number };

/**
 * The image segments of one (fused) matrix group under `mode`: one bf16 image of all its rows, or
 * runs of consecutive parts of one block kind, each its own image (bytes: the image's size).
 */
function planSegments(
  src: TensorSource,
  names: Part[],
  cols: number,
  mode: WeightsMode,
  acts: ActivationsMode,
): { kind: WeightKind; row0: number; rows: number; bytes: number; parts: Part[] }[] {
  const plan = planKinds(
    names.map((n) => ({ dtype: src.info(n.name).dtype, rows: n.rows })),
    cols,
    mode,
    acts,
  );
  if (plan === "bf16") {
    const rows = names.reduce((a, n) => a + n.rows, 0);
    return [{ kind: "bf16", row0: 0, rows, bytes: rows * cols * 2, parts: names }];
  }
  const segs: { kind: WeightKind; row0: number; rows: number; bytes: number; parts: Part[] }[] = [];
  let at = 0;
  names.forEach((n, i) => {
    const last = segs.at(-1);
    if (last && last.kind === plan[i]) {
      last.rows += n.rows;
      last.parts.push(n);
    } else segs.push({ kind: plan[i], row0: at, rows: n.rows, bytes: 0, parts: [n] });
    at += n.rows;
  });
  for (const seg of segs) seg.bytes = quantImageBytes(seg.kind as QuantKind, seg.rows, cols);
  return segs;
}

type Group = { names: Part[]; cols: number };

/** The matrix groups of layer `l` of `c`, fused as they are held: q/k/v, o, gate/up, down. */
function layerGroups(c: ModelConfig, l: number): { wqkv: Group; wo: Group; wgu: Group; wd: Group } {
  const { numHeads: H, numKvHeads: KV, headDim: D, hiddenSize: hidden, intermediateSize: I } = c;
  const p = `model.layers.${l}.`;
  return {
    wqkv: {
      names: [
        { name: `${p}self_attn.q_proj.weight`, rows: H * D },
        { name: `${p}self_attn.k_proj.weight`, rows: KV * D },
        { name: `${p}self_attn.v_proj.weight`, rows: KV * D },
      ],
      cols: hidden,
    },
    wo: { names: [{ name: `${p}self_attn.o_proj.weight`, rows: hidden }], cols: H * D },
    wgu: {
      names: [
        { name: `${p}mlp.gate_proj.weight`, rows: I },
        { name: `${p}mlp.up_proj.weight`, rows: I },
      ],
      cols: hidden,
    },
    wd: { names: [{ name: `${p}mlp.down_proj.weight`, rows: hidden }], cols: I },
  };
}

/** The embedding and, unless tied to it, the LM head. */
function outputGroups(c: ModelConfig): { embed: Group; lmHead: Group | null } {
  return {
    embed: { names: [{ name: "model.embed_tokens.weight", rows: c.vocabSize }], cols: c.hiddenSize },
    lmHead: c.tieWordEmbeddings ? null : { names: [{ name: "lm_head.weight", rows: c.vocabSize }], cols: c.hiddenSize },
  };
}

/** The matrix groups of `c` in load order (the order WeightLoader allocates their images in). */
function matrixGroups(c: ModelConfig): Group[] {
  const out: Group[] = [];
  for (let l = 0; l < c.numLayers; l++) {
    const g = layerGroups(c, l);
    out.push(g.wqkv, g.wo, g.wgu, g.wd);
  }
  const { embed, lmHead } = outputGroups(c);
  return lmHead ? [...out, embed, lmHead] : [...out, embed];
}

/**
 * Weight memories of `memoryBytes` that images of `sizes` fill in order, none spanning two (as
 * KernelRuntime.allocWeights places them).
 */
export function weightMemoriesFor(sizes: number[], memoryBytes: number): number {
  let memories = 1;
  let top = 64;
  for (const bytes of sizes) {
    const size = Math.ceil(Math.max(bytes, 1) / 64) * 64;
    if (size > memoryBytes - 64) throw new AirmError("MODEL_LOAD", `a weight matrix image of ${bytes} bytes does not fit a wasm32 weight memory (${memoryBytes} bytes)`);
    if (top + size > memoryBytes) {
      memories++;
      top = 64;
    }
    top += size;
  }
  return memories;
}

/** Writes tensor `name` as rows [row0, row0 + rows) of a quantized image at `ptr` (blocks kept, or quantized from bf16). */
export function fillQuantRows(rt: KernelRuntime, kind: QuantKind, src: TensorSource, name: string, ptr: number, row0: number, rows: number, cols: number): void {
  const info = src.info(name);
  let raw: Uint8Array;
  let type: string;
  if ((STORED_TYPES[kind] as readonly string[]).includes(info.dtype)) {
    if (!src.readStored) throw new AirmError("MODEL_LOAD", `${info.file}: tensor ${name} is ${info.dtype} but its source cannot give stored blocks`);
    raw = src.readStored(name);
    type = info.dtype;
  } else {
    const plain = new Uint16Array(rows * cols);
    src.readBf16(name, plain);
    type = kind === "q8" ? "Q8_0" : "Q4_1"; // float matrices quantize to q8 or q4 / q4a8 (Q4_1)
    raw = quantizeBf16Rows(type as "Q8_0" | "Q4_1", plain, rows, cols);
  }
  const view = rt.weightView(ptr);
  packStoredRows(kind, type, raw, view.u8, view.offset, row0, rows, cols, info.file, name);
}

export interface LayerWeights {
  inNorm: number; // f32 [hidden]: before attention
  mlpNorm: number; // f32 [hidden]: before the MLP (Llama's post_attention_layernorm, Gemma's pre_feedforward_layernorm)
  attnOutNorm: number; // f32 [hidden] on the attention output (Gemma's post_attention_layernorm) or 0
  mlpOutNorm: number; // f32 [hidden] on the MLP output (Gemma's post_feedforward_layernorm) or 0
  qNorm: number; // f32 [D] (Qwen3) or 0
  kNorm: number; // f32 [D] (Qwen3) or 0
  wqkv: Matrix; // [(H + 2 KV) * D][hidden]
  bqkv: number; // f32 [(H + 2 KV) * D] or 0
  wo: Matrix; // [hidden][H * D]
  wgu: Matrix; // [2 I][hidden]: gate rows, then up rows
  wd: Matrix; // [hidden][I]
}

/** Where one HF tensor lives in the packed weights. */
export type WeightSlot =
  | { kind: "matrix"; ptr: number; rowsTotal: number; cols: number; row0: number; rows: number; weights: WeightKind }
  | { kind: "vector"; ptr: number; offset: number; n: number; plusOne: boolean };

export function expectShape(src: TensorSource, name: string, shape: number[]): void {
  const info = src.info(name);
  if (info.shape.length !== shape.length || info.shape.some((v, i) => v !== shape[i])) {
    throw new AirmError("MODEL_LOAD", `${info.file}: tensor ${name} has shape [${info.shape.join(", ")}], config.json implies [${shape.join(", ")}]`);
  }
}

/**
 * Reads a 1-D tensor and stores it widened to f32 at f32 index `at` of the runtime's memory;
 * `plusOne` stores f32(1 + w) instead (Gemma's norms).
 */
export function writeVectorF32(rt: KernelRuntime, src: TensorSource, name: string, at: number, n: number, plusOne = false): void {
  expectShape(src, name, [n]);
  const tmp = new Uint16Array(n);
  src.readBf16(name, tmp);
  const u32 = rt.u32;
  for (let i = 0; i < n; i++) u32[at + i] = tmp[i] << 16;
  if (plusOne) {
    const f32 = rt.f32;
    for (let i = 0; i < n; i++) f32[at + i] = fr(1 + f32[at + i]);
  }
}

/** What the weights of `c` take under `mode` and `acts`, before anything is allocated: each matrix image's bytes, and the f32 vectors'. */
export function weightBytes(src: TensorSource, c: ModelConfig, mode: WeightsMode, acts: ActivationsMode): { sizes: number[]; matrixBytes: number; vectorBytes: number } {
  const groups = matrixGroups(c);
  for (const g of groups) for (const { name, rows } of g.names) expectShape(src, name, [rows, g.cols]);
  const sizes = groups.flatMap((g) => planSegments(src, g.names, g.cols, mode, acts).map((seg) => seg.bytes));
  const qkvRows = (c.numHeads + 2 * c.numKvHeads) * c.headDim;
  const vectorBytes = 4 * (c.numLayers * (4 * c.hiddenSize + qkvRows + 2 * c.headDim) + c.hiddenSize) + 64 * 16 * c.numLayers;
  return { sizes, matrixBytes: sizes.reduce((a, b) => a + b, 0), vectorBytes };
}

/**
 * Allocates the model's weights in `rt` in load order, filling each from the checkpoint unless a
 * packed image will (`fill` false), and records every tensor's slot.
 */
export class WeightLoader {
  readonly slots = new Map<string, WeightSlot>();

  constructor(
    private readonly rt: KernelRuntime,
    private readonly src: TensorSource,
    private readonly mode: WeightsMode,
    private readonly acts: ActivationsMode,
    private readonly fill: boolean,
  ) {}

  /** One (fused) matrix group: a bf16 image of all its rows, or a segment per run of one block kind. */
  matrix(names: Part[], cols: number): Matrix {
    const segs = planSegments(this.src, names, cols, this.mode, this.acts);
    if (segs[0].kind === "bf16") return this.bf16Matrix(names, cols, segs[0].bytes);
    const out: Segment[] = [];
    for (const seg of segs) {
      const kind = seg.kind as QuantKind;
      const ptr = this.rt.allocWeights(seg.bytes);
      let within = 0;
      for (const { name, rows: r } of seg.parts) {
        this.slots.set(name, { kind: "matrix", ptr, rowsTotal: seg.rows, cols, row0: within, rows: r, weights: kind });
        if (this.fill) fillQuantRows(this.rt, kind, this.src, name, ptr, within, r, cols);
        within += r;
      }
      out.push({ ptr, kind, row0: seg.row0, rows: seg.rows, bytes: seg.bytes });
    }
    return { segs: out };
  }

  private bf16Matrix(names: Part[], cols: number, bytes: number): Matrix {
    const rows = names.reduce((a, n) => a + n.rows, 0);
    const ptr = this.rt.allocWeights(bytes);
    let at = 0;
    for (const { name, rows: r } of names) {
      this.slots.set(name, { kind: "matrix", ptr, rowsTotal: rows, cols, row0: at, rows: r, weights: "bf16" });
      at += r;
    }
    if (this.fill) {
      const plain = new Uint16Array(rows * cols);
      let off = 0;
      for (const { name, rows: r } of names) {
        this.src.readBf16(name, plain.subarray(off, off + r * cols));
        off += r * cols;
      }
      const view = this.rt.weightView(ptr);
      interleaveRows(plain, view.u16, view.offset / 2, rows, cols);
    }
    return { segs: [{ ptr, kind: "bf16", row0: 0, rows, bytes }] };
  }

  /** 1-D tensors widened to f32, one after another; `plusOne` holds f32(1 + w) (Gemma's norms). */
  vectorF32(names: { name: string; n: number }[], plusOne = false): number {
    const total = names.reduce((a, n) => a + n.n, 0);
    const ptr = this.rt.alloc(total * 4);
    let at = 0;
    for (const { name, n } of names) {
      this.slots.set(name, { kind: "vector", ptr, offset: at, n, plusOne });
      if (this.fill) writeVectorF32(this.rt, this.src, name, (ptr >>> 2) + at, n, plusOne);
      at += n;
    }
    return ptr;
  }

  /** Every layer's weights, then the embedding, the final norm and the LM head (the order matrixGroups gives). */
  model(c: ModelConfig): { layers: LayerWeights[]; embed: Matrix; finalNorm: number; lmHead: Matrix } {
    const traits = traitsOf(c);
    // Gemma's norms act as (1 + w): held as f32(1 + w), which is what transformers multiplies by
    const norm = (name: string, n: number): number => this.vectorF32([{ name, n }], traits.normPlusOne);
    const layers: LayerWeights[] = [];
    for (let l = 0; l < c.numLayers; l++) layers.push(this.layer(c, l, norm, traits));
    const out = outputGroups(c);
    const embed = this.group(out.embed);
    const finalNorm = norm("model.norm.weight", c.hiddenSize);
    const lmHead = out.lmHead ? this.group(out.lmHead) : embed;
    return { layers, embed, finalNorm, lmHead };
  }

  private group(g: Group): Matrix {
    return this.matrix(g.names, g.cols);
  }

  /** Layer `l`'s weights in allocation order: its norms, then its matrices and vectors as LayerWeights lists them. */
  private layer(c: ModelConfig, l: number, norm: (name: string, n: number) => number, traits: ReturnType<typeof traitsOf>): LayerWeights {
    const { numHeads: H, numKvHeads: KV, headDim: D, hiddenSize: hidden } = c;
    const p = `model.layers.${l}.`;
    const g = layerGroups(c, l);
    const sandwich = traits.sandwichNorms;
    return {
      inNorm: norm(`${p}input_layernorm.weight`, hidden),
      mlpNorm: norm(sandwich ? `${p}pre_feedforward_layernorm.weight` : `${p}post_attention_layernorm.weight`, hidden),
      attnOutNorm: sandwich ? norm(`${p}post_attention_layernorm.weight`, hidden) : 0,
      mlpOutNorm: sandwich ? norm(`${p}post_feedforward_layernorm.weight`, hidden) : 0,
      wqkv: this.group(g.wqkv),
      bqkv: c.attentionBias
        ? this.vectorF32([
            { name: `${p}self_attn.q_proj.bias`, n: H * D },
            { name: `${p}self_attn.k_proj.bias`, n: KV * D },
            { name: `${p}self_attn.v_proj.bias`, n: KV * D },
          ])
        : 0,
      qNorm: traits.qkNorm ? norm(`${p}self_attn.q_norm.weight`, D) : 0,
      kNorm: traits.qkNorm ? norm(`${p}self_attn.k_norm.weight`, D) : 0,
      wo: this.group(g.wo),
      wgu: this.group(g.wgu),
      wd: this.group(g.wd),
    };
  }
}
