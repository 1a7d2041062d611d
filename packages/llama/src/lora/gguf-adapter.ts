// llama.cpp's LoRA adapter files (GGUF, as convert_lora_to_gguf.py writes them and
// llama-adapter.cpp reads them): metadata `general.type` = "adapter", `general.architecture` (the
// base model's), `adapter.type` = "lora", `adapter.lora.alpha` (f32; absent or 0: scale 1); for
// each adapted projection `blk.{i}.{attn_q|attn_k|attn_v|attn_output|ffn_gate|ffn_up|ffn_down}
// .weight.lora_a` (GGUF dims [in, r], PEFT's A [r, in]) and `.lora_b` ([r, out], PEFT's B
// [out, r]), whose rows of attn_q / attn_k are in llama.cpp's rope order for the llama
// architecture. The scale is alpha / r, r being lora_b's ne[0]. Reads them into the same
// LoraAdapterData as a PEFT folder (B rows back in Hugging Face order), checked by key and tensor.
import { closeSync, openSync, readSync } from "node:fs";
import type { ModelConfig } from "../checkpoint-types.ts";
import { traitsOf } from "../checkpoint/architecture-traits.ts";
import { unpermuteRows } from "../checkpoint/gguf-checkpoint.ts";
import { closeGguf, type GgufFile, type GgufTensorInfo, openGguf } from "../checkpoint/gguf-file.ts";
import { readExactly } from "../checkpoint/safetensors-source.ts";
import type { LoraAdapterConfig } from "./adapter-config.ts";
import { asLoraError, fingerprintOf, type LoraAdapterData, type LoraDtype, type LoraModuleWeights, sortModules, toF32 } from "./adapter-data.ts";
import { LoraError } from "./lora-error.ts";
import { LORA_PROJECTIONS, type LoraProjection, projectionShape } from "./projections.ts";

const fr = Math.fround;

/** The GGUF metadata keys of a LoRA adapter (gguf-py's Keys.General.TYPE, Keys.Adapter.*). */
export const GGUF_LORA_KEYS = {
  type: "general.type",
  architecture: "general.architecture",
  adapterType: "adapter.type",
  alpha: "adapter.lora.alpha",
  aloraTokens: "adapter.alora.invocation_tokens",
} as const;

/** llama.cpp's tensor name of each projection (gguf-py's MODEL_TENSOR names). */
export const GGUF_PROJECTION_NAMES: Record<LoraProjection, string> = {
  q_proj: "attn_q",
  k_proj: "attn_k",
  v_proj: "attn_v",
  o_proj: "attn_output",
  gate_proj: "ffn_gate",
  up_proj: "ffn_up",
  down_proj: "ffn_down",
};

const PROJECTION_OF = new Map(Object.entries(GGUF_PROJECTION_NAMES).map(([p, g]) => [g, p as LoraProjection]));
const GGUF_TENSOR = /^blk\.(\d+)\.([a-z_]+)\.weight\.lora_([ab])$/;

/** The GGUF name of a LoRA weight: `blk.{layer}.{attn_q|...}.weight.lora_a` (A) or `.lora_b` (B). */
export function ggufLoraTensorName(layer: number, proj: LoraProjection, which: "A" | "B"): string {
  return `blk.${layer}.${GGUF_PROJECTION_NAMES[proj]}.weight.lora_${which === "A" ? "a" : "b"}`;
}

/** Layer, projection and A/B of a GGUF LoRA tensor name, or undefined for any other name. */
export function parseGgufLoraTensorName(name: string): { layer: number; proj: LoraProjection; which: "A" | "B" } | undefined {
  const m = GGUF_TENSOR.exec(name);
  const proj = m ? PROJECTION_OF.get(m[2]!) : undefined;
  if (!m || !proj) return undefined;
  return { layer: Number(m[1]), proj, which: m[3] === "a" ? "A" : "B" };
}

/** Whether llama.cpp's converter permuted this projection's output rows (q and k of the llama architecture), and with how many heads. */
export function permutedHeads(model: ModelConfig, proj: LoraProjection): number | undefined {
  if (!traitsOf(model).ggufPermutesQk) return undefined;
  if (proj === "q_proj") return model.numHeads;
  if (proj === "k_proj") return model.numKvHeads;
  return undefined;
}

/** Whether `path` is a GGUF file (its first four bytes are the magic). */
export function isGgufAdapterPath(path: string): boolean {
  const fd = openSync(path, "r");
  try {
    const magic = Buffer.alloc(4);
    return readSync(fd, magic, 0, 4, 0) === 4 && magic.toString("latin1") === "GGUF";
  } finally {
    closeSync(fd);
  }
}

/** The metadata value of `key` as a string, or undefined. */
function metaString(file: GgufFile, key: string): string | undefined {
  const v = file.metadata.get(key);
  return typeof v === "string" ? v : undefined;
}

/**
 * Checks the adapter's metadata as llama.cpp does (general.type, general.architecture,
 * adapter.type), refuses aLoRA, and returns adapter.lora.alpha (null when absent or 0: scale 1).
 */
function checkMetadata(file: GgufFile, model: ModelConfig): number | null {
  const k = GGUF_LORA_KEYS;
  const type = metaString(file, k.type);
  if (type !== "adapter")
    throw new LoraError(file.path, `${k.type}: is ${JSON.stringify(type ?? null)}, a LoRA adapter file says "adapter" (a model file cannot be loaded as an adapter)`, {
      field: k.type,
    });
  const arch = metaString(file, k.architecture);
  const want = traitsOf(model).ggufName;
  if (arch !== want)
    throw new LoraError(file.path, `${k.architecture}: the adapter is for ${JSON.stringify(arch ?? null)}, this model is ${JSON.stringify(want)}`, { field: k.architecture });
  const adapterType = metaString(file, k.adapterType);
  if (adapterType !== "lora")
    throw new LoraError(file.path, `${k.adapterType}: only "lora" adapters are supported, got ${JSON.stringify(adapterType ?? null)}`, { field: k.adapterType });
  if (file.metadata.has(k.aloraTokens)) throw new LoraError(file.path, `${k.aloraTokens}: activated LoRA (aLoRA) is not supported`, { field: k.aloraTokens });
  const alpha = file.metadata.get(k.alpha);
  if (alpha === undefined || alpha === 0) return null;
  if (typeof alpha !== "number" || !Number.isFinite(alpha)) throw new LoraError(file.path, `${k.alpha}: must be a finite number, got ${String(alpha)}`, { field: k.alpha });
  return alpha;
}

/** Why a tensor that is no LoRA A/B of the seven projections is refused. */
function unexpectedTensor(file: string, name: string): LoraError {
  let why = "is not a LoRA weight blk.N.{attn_q|attn_k|attn_v|attn_output|ffn_gate|ffn_up|ffn_down}.weight.lora_a|lora_b";
  if (name.endsWith("_norm.weight"))
    why = "is a norm (mergekit-extract-lora adapters carry them; llama.cpp ignores them): this engine computes only low-rank updates and does not drop part of an adapter";
  else if (/^(token_embd|output)\.weight\.lora_[ab]$/.test(name)) why = "adapts the embeddings or the LM head, which this engine does not";
  return new LoraError(file, `tensor "${name}" ${why}`, { tensor: name });
}

interface TensorPair {
  layer: number;
  proj: LoraProjection;
  a: GgufTensorInfo;
  b: GgufTensorInfo;
}

/** Every lora_a/lora_b pair by layer and projection; refuses any other tensor, another type, a layer past the model's or half a pair, naming the tensor. */
function pairTensors(file: GgufFile, model: ModelConfig): TensorPair[] {
  const pairs = new Map<string, Partial<TensorPair> & { layer: number; proj: LoraProjection }>();
  for (const t of file.tensors) {
    const parsed = parseGgufLoraTensorName(t.name);
    if (!parsed) throw unexpectedTensor(file.path, t.name);
    if (parsed.layer >= model.numLayers)
      throw new LoraError(file.path, `tensor "${t.name}": layer ${parsed.layer} does not exist, the model has ${model.numLayers} layers`, { tensor: t.name });
    if (t.type !== "F32" && t.type !== "F16" && t.type !== "BF16")
      throw new LoraError(file.path, `tensor "${t.name}" has type ${t.type}; supported are F32, F16 and BF16`, { tensor: t.name });
    const key = `${parsed.layer}.${parsed.proj}`;
    const pair = pairs.get(key) ?? { layer: parsed.layer, proj: parsed.proj };
    pair[parsed.which === "A" ? "a" : "b"] = t;
    pairs.set(key, pair);
  }
  if (pairs.size === 0) throw new LoraError(file.path, "holds no LoRA tensor");
  return [...pairs.values()].map((p) => {
    for (const which of ["A", "B"] as const) {
      const missing = ggufLoraTensorName(p.layer, p.proj, which);
      if (!p[which === "A" ? "a" : "b"]) throw new LoraError(file.path, `tensor "${missing}" is missing (its pair is there)`, { tensor: missing });
    }
    return p as TensorPair;
  });
}

/** The adapter's rank: lora_a's ne[1] of the first pair, within `maxRank` (else LoraError naming r). */
function rankOf(file: GgufFile, first: TensorPair, maxRank: number): number {
  const r = first.a.dims[1] ?? 0;
  if (!Number.isInteger(r) || r < 1) throw new LoraError(file.path, `tensor "${first.a.name}" has dims [${first.a.dims.join(", ")}], no rank`, { tensor: first.a.name });
  if (r > maxRank)
    throw new LoraError(file.path, `r: rank ${r} (ne[1] of "${first.a.name}") is over this engine's limit of ${maxRank} (maxLoraRank, --max-lora-rank)`, { field: "r" });
  return r;
}

/** Refuses a pair whose dims are not A [in, r] and B [r, out] for this model, naming the tensor. */
function checkShapes(path: string, p: TensorPair, model: ModelConfig, r: number): void {
  const s = projectionShape(model, p.proj);
  // each tensor, the dims it needs, and which of them is the model's (the other is the rank)
  const wanted: [GgufTensorInfo, number[], number][] = [
    [p.a, [s.in, r], 0],
    [p.b, [r, s.out], 1],
  ];
  for (const [t, want, modelDim] of wanted) {
    if (t.dims.length === 2 && t.dims[0] === want[0] && t.dims[1] === want[1]) continue;
    const rankOnly = t.dims.length === 2 && t.dims[modelDim] === want[modelDim];
    const note = rankOnly ? `; its rank differs from the adapter's r = ${r} (per-module ranks are not supported)` : "";
    throw new LoraError(path, `tensor "${t.name}" has dims [${t.dims.join(", ")}], this model and r need [${want.join(", ")}] (GGUF order, innermost first)${note}`, {
      tensor: t.name,
    });
  }
}

/** One tensor's values as f32. */
function readTensor(file: GgufFile, t: GgufTensorInfo): Float32Array {
  const bytes = new Uint8Array(t.byteLength);
  try {
    readExactly(file.fd, file.path, bytes, t.start, `the end of tensor "${t.name}"`);
  } catch (e) {
    throw asLoraError(e, file.path, t.name);
  }
  return toF32(bytes, t.type as LoraDtype, t.dims[0]! * t.dims[1]!, file.path, t.name);
}

/** A pair's A [r][in] and B [out][r] as PEFT stores them (B's q/k rows back from llama.cpp's rope order). */
function readPair(file: GgufFile, p: TensorPair, model: ModelConfig, r: number): LoraModuleWeights {
  const a = readTensor(file, p.a);
  let b = readTensor(file, p.b);
  const heads = permutedHeads(model, p.proj);
  if (heads !== undefined) {
    const out = new Float32Array(b.length);
    unpermuteRows(new Uint8Array(b.buffer), new Uint8Array(out.buffer), b.length / r, r * 4, heads);
    b = out;
  }
  return { layer: p.layer, proj: p.proj, a, b };
}

/** The arithmetic of the file: r, scale alpha / r as llama.cpp computes it in f32 (1 without alpha), and what it targets. */
function configOf(r: number, alpha: number | null, modules: LoraModuleWeights[]): LoraAdapterConfig {
  const projs = new Set(modules.map((m) => m.proj));
  return {
    r,
    alpha: alpha ?? r,
    useRslora: false,
    scale: alpha === null ? 1 : fr(alpha / r),
    targets: { kind: "list", names: LORA_PROJECTIONS.filter((p) => projs.has(p)) },
    layers: [...new Set(modules.map((m) => m.layer))].sort((x, y) => x - y),
    baseModel: null,
  };
}

/**
 * Reads the llama.cpp GGUF LoRA file at `path` for a model of config `model`. Throws LoraError
 * naming the metadata key (`field`: general.type, general.architecture, adapter.type, a rank over
 * `maxRank` as `r`) or the tensor (`tensor`: unexpected, half a pair, of the wrong dims or type,
 * truncated, non-finite).
 */
export function readGgufLoraAdapter(path: string, model: ModelConfig, maxRank: number): LoraAdapterData {
  let file: GgufFile;
  try {
    file = openGguf(path);
  } catch (e) {
    throw asLoraError(e, path);
  }
  try {
    const alpha = checkMetadata(file, model);
    const pairs = pairTensors(file, model);
    const r = rankOf(file, pairs[0]!, maxRank);
    for (const p of pairs) checkShapes(path, p, model, r);
    const modules = sortModules(pairs.map((p) => readPair(file, p, model, r)));
    const config = configOf(r, alpha, modules);
    return { folder: path, config, modules, fingerprint: fingerprintOf(config, modules) };
  } finally {
    closeGguf(file);
  }
}
