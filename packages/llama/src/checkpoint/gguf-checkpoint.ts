// A GGUF file as a Checkpoint: llama/qwen2/qwen3/gemma3 metadata -> ModelConfig, GGUF tensor names -> Hugging
// Face names (undoing llama.cpp's q/k row permutation for rotate-half RoPE), dequantisation to
// bf16 on read, and the tokenizer, chat template and sampling defaults from metadata. Parsing is
// gguf-file.ts's job.

import { createHash } from "node:crypto";
import { readSync } from "node:fs";
import { basename } from "node:path";
import type { Architecture, Checkpoint, ModelConfig, RopeScaling, TensorInfo, TensorSource } from "../checkpoint-types.ts";
import { compileChatTemplate } from "../tokenizer/chat-template.ts";
import { ggufTokenizer } from "../tokenizer/gguf-tokenizer.ts";
import { ARCHITECTURE_TRAITS, traitsOf } from "./architecture-traits.ts";
import { DEQUANT_TYPES, dequantToBf16, type DequantType } from "./gguf-dequant.ts";
import { GGML_TYPES, closeGguf, openGguf, type GgufFile, type GgufTensorInfo } from "./gguf-file.ts";
import { expectedTensors } from "./expected-tensors.ts";
import { checkTensors, makeCheckpoint } from "./make-checkpoint.ts";
import { GgufMetadata } from "./gguf-metadata.ts";
import { ModelLoadError } from "./model-load-error.ts";
import { readExactly } from "./safetensors-source.ts";
import { GGUF_SAMPLING_KEYS, samplingDefaultsOf } from "./sampling-defaults.ts";

const CHUNK_BLOCKS = 64 * 1024;

/** Gemma 3's four norms per layer under llama.cpp's names (its ffn_norm is the pre-feedforward norm). */
const GEMMA3_NORMS: Record<string, string> = {
  post_attention_norm: "post_attention_layernorm",
  ffn_norm: "pre_feedforward_layernorm",
  post_ffw_norm: "post_feedforward_layernorm",
};

/** HF name of a GGUF tensor name (unknown names are kept as they are); `architecture` picks Gemma 3's norm names. */
export function hfTensorName(gguf: string, architecture?: Architecture): string {
  const top: Record<string, string> = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
  };
  if (top[gguf]) return top[gguf]!;
  const m = /^blk\.(\d+)\.([a-z_]+)\.(weight|bias)$/.exec(gguf);
  if (!m) return gguf;
  const parts: Record<string, string> = {
    attn_norm: "input_layernorm",
    attn_q: "self_attn.q_proj",
    attn_k: "self_attn.k_proj",
    attn_v: "self_attn.v_proj",
    attn_output: "self_attn.o_proj",
    ffn_norm: "post_attention_layernorm",
    attn_q_norm: "self_attn.q_norm",
    attn_k_norm: "self_attn.k_norm",
    ffn_gate: "mlp.gate_proj",
    ffn_up: "mlp.up_proj",
    ffn_down: "mlp.down_proj",
  };
  const part = (architecture === "gemma3" ? GEMMA3_NORMS[m[2]!] : undefined) ?? parts[m[2]!];
  return part ? `model.layers.${m[1]}.${part}.${m[3]}` : gguf;
}

const ARCHITECTURES: Record<string, Architecture> = Object.fromEntries(
  (Object.entries(ARCHITECTURE_TRAITS) as [Architecture, { ggufName: string }][]).map(([arch, t]) => [t.ggufName, arch]),
);

/**
 * Llama 3.1 rope scaling as GGUF carries it: the F32 tensor `rope_freqs.weight` of head_dim / 2
 * divisors of the inverse frequencies (null without it). Throws ModelLoadError for another
 * shape or type, or a factor that is not finite and positive.
 */
function ropeFreqFactors(file: GgufFile, headDim: number): RopeScaling | null {
  const t = file.tensors.find((x) => x.name === "rope_freqs.weight");
  if (!t) return null;
  if (t.type !== "F32" || t.dims.length !== 1 || t.dims[0] !== headDim / 2) {
    throw new ModelLoadError(file.path, `tensor "rope_freqs.weight" must be F32 [${headDim / 2}] (head_dim / 2), got ${t.type} [${t.dims.join(", ")}]`, {
      item: "rope_freqs.weight",
    });
  }
  const buf = Buffer.alloc(t.byteLength);
  if (readSync(file.fd, buf, 0, t.byteLength, t.start) !== t.byteLength)
    throw new ModelLoadError(file.path, `tensor "rope_freqs.weight" is cut short`, { item: "rope_freqs.weight" });
  const factors = Array.from(new Float32Array(buf.buffer, buf.byteOffset, headDim / 2));
  if (!factors.every((f) => Number.isFinite(f) && f > 0))
    throw new ModelLoadError(file.path, `tensor "rope_freqs.weight" holds a factor that is not finite and positive`, { item: "rope_freqs.weight" });
  return { type: "freq_factors", factors };
}

/** ModelConfig from GGUF metadata. Throws ModelLoadError naming the missing or unsupported key. */
export function ggufModelConfig(file: GgufFile): ModelConfig {
  const md = new GgufMetadata(file);
  const archName = md.str("general.architecture");
  const architecture = ARCHITECTURES[archName];
  if (!architecture)
    throw new ModelLoadError(file.path, `architecture "${archName}" (general.architecture) is not supported; supported are ${Object.keys(ARCHITECTURES).join(", ")}`, {
      item: "general.architecture",
    });
  const a = archName;
  const hiddenSize = md.int(`${a}.embedding_length`);
  const numHeads = md.int(`${a}.attention.head_count`);
  const numKvHeads = md.int(`${a}.attention.head_count_kv`, numHeads);
  const headDim = md.int(`${a}.attention.key_length`, hiddenSize / numHeads);
  if (!Number.isInteger(headDim) || numKvHeads === 0 || numHeads % numKvHeads !== 0)
    throw new ModelLoadError(file.path, `head counts ${numHeads}/${numKvHeads} do not fit embedding_length ${hiddenSize}`, { item: `${a}.attention.head_count` });
  const scaling = md.raw(`${a}.rope.scaling.type`);
  if (scaling !== undefined && scaling !== "none")
    throw new ModelLoadError(file.path, `rope scaling "${String(scaling)}" (${a}.rope.scaling.type) is not supported`, { item: `${a}.rope.scaling.type` });
  const ropeScaling = ropeFreqFactors(file, headDim);
  const tokens = md.has("tokenizer.ggml.tokens") ? (md.raw("tokenizer.ggml.tokens") as unknown[]).length : undefined;
  const vocabSize = md.int(`${a}.vocab_size`, tokens ?? file.tensors.find((t) => t.name === "token_embd.weight")?.dims[1] ?? 0);
  if (vocabSize === 0) throw new ModelLoadError(file.path, `metadata key "${a}.vocab_size" is missing and there is no tokenizer.ggml.tokens`, { item: `${a}.vocab_size` });
  const bos = md.has("tokenizer.ggml.bos_token_id") ? md.int("tokenizer.ggml.bos_token_id") : null;
  const eos: number[] = [];
  for (const key of ["tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id"]) {
    if (md.has(key)) {
      const id = md.int(key);
      if (!eos.includes(id)) eos.push(id);
    }
  }
  const numLayers = md.int(`${a}.block_count`);
  return {
    architecture,
    hiddenSize,
    intermediateSize: md.int(`${a}.feed_forward_length`),
    numLayers,
    numHeads,
    numKvHeads,
    headDim,
    vocabSize,
    rmsNormEps: md.num(`${a}.attention.layer_norm_rms_epsilon`),
    ropeTheta: md.num(`${a}.rope.freq_base`, 10000),
    ropeScaling,
    maxPositionEmbeddings: md.int(`${a}.context_length`, 2048),
    tieWordEmbeddings: !file.tensors.some((t) => t.name === "output.weight"),
    attentionBias: file.tensors.some((t) => /^blk\.\d+\.attn_q\.bias$/.test(t.name)),
    bosTokenId: bos,
    eosTokenIds: eos,
    ...(architecture === "gemma3" ? ggufGemma3(file, md, numLayers, hiddenSize, numHeads, headDim) : {}),
  };
}

/**
 * Gemma 3 as llama.cpp reads it: the window from `gemma3.attention.sliding_window`, every sixth
 * layer global (llama.cpp's fixed pattern, unless the file names one), the local RoPE base 10000
 * (llama.cpp's, unless `rope.freq_base_swa` says), and the attention scale 1/sqrt(key_length)
 * (the 62-layer 27B: 1/sqrt(hidden / heads)), which is query_pre_attn_scalar in the HF configs.
 * Soft-capping keys are refused: this engine computes none.
 */
function ggufGemma3(file: GgufFile, md: GgufMetadata, layers: number, hidden: number, heads: number, headDim: number): Pick<ModelConfig, "slidingWindow" | "queryPreAttnScalar"> {
  for (const key of ["gemma3.final_logit_softcapping", "gemma3.attn_logit_softcapping"]) {
    if (md.has(key)) throw new ModelLoadError(file.path, `${key} is not supported (no soft-capping is computed here)`, { item: key });
  }
  const window = md.int("gemma3.attention.sliding_window");
  if (window < 4)
    throw new ModelLoadError(file.path, `gemma3.attention.sliding_window ${window} is below 4, which the attention kernels need`, { item: "gemma3.attention.sliding_window" });
  const pattern = md.raw("gemma3.attention.sliding_window_pattern");
  let sliding: boolean[];
  if (Array.isArray(pattern)) sliding = pattern.map((v) => v === true || v === 1);
  else {
    const every = pattern === undefined ? 6 : md.int("gemma3.attention.sliding_window_pattern");
    sliding = Array.from({ length: layers }, (_, i) => (i + 1) % every !== 0);
  }
  if (sliding.length !== layers)
    throw new ModelLoadError(file.path, `gemma3.attention.sliding_window_pattern names ${sliding.length} layers, the file has ${layers}`, {
      item: "gemma3.attention.sliding_window_pattern",
    });
  return {
    slidingWindow: { window, layers: sliding, ropeTheta: md.num("gemma3.rope.freq_base_swa", 10000) },
    queryPreAttnScalar: layers === 62 ? hidden / heads : headDim,
  };
}

/** TensorSource over a GGUF file, by Hugging Face names. */
export class GgufTensorSource implements TensorSource {
  private readonly byName = new Map<string, GgufTensorInfo & { hfName: string; shape: number[] }>();
  private readonly shaCache = new Map<string, string>();
  private closed = false;

  /**
   * `permuteHeads` maps HF q/k weight names to the head count llama.cpp permuted them with;
   * `shiftedNorms` names the norms llama.cpp stored as w + 1 (Gemma), read back as w.
   */
  constructor(
    private readonly file: GgufFile,
    private readonly permuteHeads: Map<string, number>,
    architecture?: Architecture,
    private readonly shiftedNorms: ReadonlySet<string> = new Set(),
  ) {
    for (const t of file.tensors) {
      const hfName = hfTensorName(t.name, architecture);
      if (this.byName.has(hfName)) throw new ModelLoadError(file.path, `tensor "${t.name}" maps to "${hfName}", which another tensor already has`, { item: t.name });
      this.byName.set(hfName, { ...t, hfName, shape: [...t.dims].reverse() });
    }
  }

  list(): TensorInfo[] {
    return [...this.byName.values()].map((t) => ({ name: t.hfName, dtype: t.type, shape: [...t.shape], file: this.file.path }));
  }
  has(name: string): boolean {
    return this.byName.has(name);
  }
  info(name: string): TensorInfo {
    const t = this.stored(name);
    return { name, dtype: t.type, shape: [...t.shape], file: this.file.path };
  }
  private stored(name: string) {
    const t = this.byName.get(name);
    if (!t) throw new ModelLoadError(this.file.path, `tensor "${name}" is missing from the checkpoint`, { item: name });
    return t;
  }

  readBf16(name: string, dst: Uint16Array): void {
    const t = this.stored(name);
    if (!(DEQUANT_TYPES as readonly string[]).includes(t.type)) {
      throw new ModelLoadError(this.file.path, `tensor "${t.name}" (${name}) has type ${t.type}; supported are ${DEQUANT_TYPES.join(", ")}`, { item: t.name });
    }
    const count = t.shape.reduce((a, b) => a * b, 1);
    if (dst.length !== count) throw new ModelLoadError(this.file.path, `tensor "${t.name}" has ${count} elements but the destination holds ${dst.length}`, { item: t.name });
    if (this.shiftedNorms.has(name)) {
      this.readShiftedNorm(t, dst);
      return;
    }
    const heads = this.permuteHeads.get(name);
    const target = heads === undefined ? dst : new Uint16Array(count);
    const info = GGML_TYPES[t.typeId]!;
    const perChunk = CHUNK_BLOCKS * info.blockSize;
    const buf = new Uint8Array((Math.min(count, perChunk) / info.blockSize) * info.typeSize);
    for (let done = 0; done < count; done += perChunk) {
      const n = Math.min(perChunk, count - done);
      const bytes = (n / info.blockSize) * info.typeSize;
      const view = buf.subarray(0, bytes);
      readExactly(this.file.fd, this.file.path, view, t.start + (done / info.blockSize) * info.typeSize, `the end of tensor "${t.name}"`);
      dequantToBf16(t.type as DequantType, view, n, target, done);
    }
    if (heads !== undefined) unpermuteRows(target, dst, t.shape[0]!, count / t.shape[0]!, heads);
  }

  /**
   * A norm llama.cpp's converter stored as f32(w + 1) (Gemma's (1 + w) convention), read back as w:
   * f32(stored - 1), then bf16. For w from a bf16 checkpoint (|w| >= 2^-16, or 0) both steps are
   * exact, so the model's f32(1 + w) equals the stored value bit for bit, as from the HF folder.
   */
  private readShiftedNorm(t: GgufTensorInfo & { hfName: string }, dst: Uint16Array): void {
    if (t.type !== "F32")
      throw new ModelLoadError(this.file.path, `norm "${t.name}" is ${t.type}; llama.cpp stores Gemma norms (w + 1) as F32, and only F32 is read back as w`, { item: t.name });
    const raw = new Uint8Array(dst.length * 4);
    readExactly(this.file.fd, this.file.path, raw, t.start, `the end of tensor "${t.name}"`);
    const f = new Float32Array(raw.buffer);
    for (let i = 0; i < f.length; i++) f[i] = Math.fround(f[i]! - 1);
    dequantToBf16("F32", raw, dst.length, dst, 0);
  }

  readStored(name: string): Uint8Array {
    const t = this.stored(name);
    const out = new Uint8Array(t.byteLength);
    readExactly(this.file.fd, this.file.path, out, t.start, `the end of tensor "${t.name}"`);
    const heads = this.permuteHeads.get(name);
    if (heads === undefined) return out;
    // Whole rows move, so the un-permutation works on stored rows of blocks as on elements.
    const rows = t.shape[0]!;
    const dst = new Uint8Array(t.byteLength);
    unpermuteRows(out, dst, rows, t.byteLength / rows, heads);
    return dst;
  }

  sha256(name: string): string {
    const cached = this.shaCache.get(name);
    if (cached) return cached;
    const t = this.stored(name);
    const hash = createHash("sha256");
    const chunk = new Uint8Array(Math.min(4 << 20, Math.max(1, t.byteLength)));
    for (let done = 0; done < t.byteLength; done += chunk.length) {
      const view = chunk.subarray(0, Math.min(chunk.length, t.byteLength - done));
      readExactly(this.file.fd, this.file.path, view, t.start + done, `the end of tensor "${t.name}"`);
      hash.update(view);
    }
    const hex = hash.digest("hex");
    this.shaCache.set(name, hex);
    return hex;
  }

  close(): void {
    if (this.closed) return;
    this.closed = true;
    closeGguf(this.file);
  }
}

/**
 * Undoes llama.cpp's rope permutation of q/k rows. convert_hf_to_gguf reshapes the rows of each
 * head as [2, headDim/2] and swaps the axes, so GGUF row h*hd + 2j + i holds HF row h*hd + i*hd/2 + j.
 */
export function unpermuteRows<A extends Uint8Array | Uint16Array>(src: A, dst: A, rows: number, rowLen: number, heads: number): void {
  const hd = rows / heads;
  const half = hd / 2;
  for (let h = 0; h < heads; h++) {
    for (let i = 0; i < 2; i++) {
      for (let j = 0; j < half; j++) {
        const from = (h * hd + 2 * j + i) * rowLen;
        const to = (h * hd + i * half + j) * rowLen;
        dst.set(src.subarray(from, from + rowLen), to);
      }
    }
  }
}

/** llama.cpp's rope permutation of q/k rows, as convert_hf_to_gguf applies it (the inverse of unpermuteRows). */
export function permuteRows<A extends Uint8Array | Uint16Array>(src: A, dst: A, rows: number, rowLen: number, heads: number): void {
  const hd = rows / heads;
  const half = hd / 2;
  for (let h = 0; h < heads; h++) {
    for (let i = 0; i < 2; i++) {
      for (let j = 0; j < half; j++) {
        const from = (h * hd + i * half + j) * rowLen;
        const to = (h * hd + 2 * j + i) * rowLen;
        dst.set(src.subarray(from, from + rowLen), to);
      }
    }
  }
}

/** Opens a GGUF file as a Checkpoint (see loadCheckpoint). */
export function loadGgufCheckpoint(path: string): Checkpoint {
  const file = openGguf(path);
  try {
    const config = ggufModelConfig(file);
    const permute = new Map<string, number>();
    if (traitsOf(config).ggufPermutesQk) {
      for (let l = 0; l < config.numLayers; l++) {
        permute.set(`model.layers.${l}.self_attn.q_proj.weight`, config.numHeads);
        permute.set(`model.layers.${l}.self_attn.k_proj.weight`, config.numKvHeads);
        permute.set(`model.layers.${l}.self_attn.q_proj.bias`, config.numHeads);
        permute.set(`model.layers.${l}.self_attn.k_proj.bias`, config.numKvHeads);
      }
    }
    const shifted = new Set(
      traitsOf(config).normPlusOne
        ? expectedTensors(config)
            .filter((t) => t.name.endsWith("norm.weight"))
            .map((t) => t.name)
        : [],
    );
    const tensors = new GgufTensorSource(file, permute, config.architecture, shifted);
    checkTensors(config, tensors, path, DEQUANT_TYPES);
    const { tokenizer, chatTemplate, bosToken, eosToken } = ggufTokenizer(file, config);
    const renderChat = chatTemplate === undefined ? undefined : compileChatTemplate(chatTemplate, { bosToken, eosToken }, path);
    const eos = config.eosTokenIds.length ? config.eosTokenIds : tokenizer.eosTokenIds;
    return makeCheckpoint({
      path,
      id: basename(path).replace(/\.gguf$/i, ""),
      config: { ...config, eosTokenIds: [...eos] },
      tensors,
      tokenizer,
      renderChat,
      generation: { eosTokenIds: [...eos], ...samplingDefaultsOf((k) => file.metadata.get(k), GGUF_SAMPLING_KEYS, { from: "GGUF metadata", f32: true }) },
    });
  } catch (e) {
    closeGguf(file);
    throw e;
  }
}
