// A generated Gemma 3 folder written as GGUF the way llama.cpp's converter writes Gemma 3 (arch
// "gemma3", key_length, attention.sliding_window, its norm names - ffn_norm is the pre-feedforward
// norm - and every norm stored as F32 w + 1) loads to the folder's config and tensors, and the
// model computes the same logits from both. And the real Gemma 3 270M Q4_K_M when it is cached.
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { bf16ToF32 } from "../src/checkpoint/bf16-convert.ts";
import { hfTensorName } from "../src/checkpoint/gguf-checkpoint.ts";
import { loadCheckpoint } from "../src/checkpoint/load-checkpoint.ts";
import type { Checkpoint } from "../src/checkpoint-types.ts";
import { LlamaModel } from "../src/model/llama-model.ts";
import { makeTinyModel } from "../src/tiny/make-tiny-model.ts";
import { TYPE_IDS, f32, ggufBytes, i32s, str, strs, u32, type GgufTensor, type MetaValue } from "./fixtures/io/gguf-writer.ts";

const root = mkdtempSync(join(tmpdir(), "llama-gguf-gemma3-"));
afterAll(() => rmSync(root, { recursive: true, force: true }));

const LAYERS = 3;
const PARTS = [
  "attn_norm",
  "attn_q",
  "attn_k",
  "attn_v",
  "attn_q_norm",
  "attn_k_norm",
  "attn_output",
  "post_attention_norm",
  "ffn_norm",
  "post_ffw_norm",
  "ffn_gate",
  "ffn_up",
  "ffn_down",
];

/** The folder's tensors under llama.cpp's Gemma 3 names: BF16 matrices, norms as F32 w + 1 (computed in f32, as the converter does). */
function ggufTensors(hf: Checkpoint): GgufTensor[] {
  const ggufName: Record<string, string> = {};
  for (const g of ["token_embd.weight", "output_norm.weight", ...Array.from({ length: LAYERS }, (_, l) => PARTS.map((p) => `blk.${l}.${p}.weight`)).flat()])
    ggufName[hfTensorName(g, "gemma3")] = g;
  return hf.tensors.list().map((t) => {
    const n = t.shape.reduce((a, b) => a * b, 1);
    const bits = new Uint16Array(n);
    hf.tensors.readBf16(t.name, bits);
    const matrix = t.shape.length === 2;
    const data = matrix ? new Uint8Array(bits.buffer) : new Uint8Array(Float32Array.from(bits, (b) => Math.fround(bf16ToF32(b) + 1)).buffer);
    const name = ggufName[t.name];
    if (!name) throw new Error(`no GGUF name for ${t.name}`);
    return { name, dims: [...t.shape].reverse(), typeId: matrix ? TYPE_IDS.BF16 : TYPE_IDS.F32, data };
  });
}

describe("a Gemma 3 GGUF converted from a generated folder", () => {
  const hfDir = join(root, "hf");
  const path = join(root, "gemma3.gguf");
  let hf: Checkpoint;
  let gguf: Checkpoint;

  beforeAll(async () => {
    // every other layer local, as make-tiny writes it; the GGUF names that pattern (llama.cpp's default is 6)
    makeTinyModel({ arch: "gemma3", out: hfDir, layers: LAYERS, vocab: 400, kvHeads: 1, slidingWindow: 6 });
    hf = await loadCheckpoint(hfDir);
    const tok = JSON.parse(readFileSync(join(hfDir, "tokenizer.json"), "utf8"));
    const vocab = Object.entries(tok.model.vocab as Record<string, number>)
      .sort((a, b) => a[1] - b[1])
      .map(([t]) => t);
    const metadata: Record<string, MetaValue> = {
      "general.architecture": str("gemma3"),
      "general.name": str("tiny-gemma3"),
      "gemma3.block_count": u32(LAYERS),
      "gemma3.context_length": u32(2048),
      "gemma3.embedding_length": u32(64),
      "gemma3.feed_forward_length": u32(128),
      "gemma3.attention.head_count": u32(4),
      "gemma3.attention.head_count_kv": u32(1),
      "gemma3.attention.key_length": u32(32),
      "gemma3.attention.value_length": u32(32),
      "gemma3.attention.sliding_window": u32(6),
      "gemma3.attention.sliding_window_pattern": u32(2),
      "gemma3.rope.freq_base": f32(1e6),
      "gemma3.attention.layer_norm_rms_epsilon": f32(1e-6),
      "tokenizer.ggml.model": str("gpt2"),
      "tokenizer.ggml.tokens": strs(vocab),
      "tokenizer.ggml.token_type": i32s(vocab.map((_, id) => (id < 3 ? 3 : 1))),
      "tokenizer.ggml.merges": strs((tok.model.merges as [string, string][]).map(([a, b]) => `${a} ${b}`)),
      "tokenizer.ggml.bos_token_id": u32(1),
      "tokenizer.ggml.eos_token_id": u32(2),
    };
    writeFileSync(path, ggufBytes({ version: 3, metadata, tensors: ggufTensors(hf) }));
    gguf = await loadCheckpoint(path);
  });
  afterAll(() => {
    hf?.tensors.close();
    gguf?.tensors.close();
  });

  it("maps llama.cpp's Gemma 3 norm names, and reads the window, the pattern and the scale", () => {
    expect(hfTensorName("blk.2.ffn_norm.weight", "gemma3")).toBe("model.layers.2.pre_feedforward_layernorm.weight");
    expect(hfTensorName("blk.2.ffn_norm.weight")).toBe("model.layers.2.post_attention_layernorm.weight");
    expect(hfTensorName("blk.2.post_ffw_norm.weight", "gemma3")).toBe("model.layers.2.post_feedforward_layernorm.weight");
    const { storedDtype: _d, ...hfConfig } = hf.config;
    // the HF config's query_pre_attn_scalar is 24; llama.cpp scales by 1/sqrt(key_length) (32)
    expect(gguf.config).toEqual({ ...hfConfig, rmsNormEps: Math.fround(1e-6), queryPreAttnScalar: 32 });
  });

  it("reads each norm's w + 1 back as the folder's w, bit for bit, and every other tensor as stored", () => {
    for (const t of hf.tensors.list()) {
      const n = t.shape.reduce((a, b) => a * b, 1);
      const a = new Uint16Array(n);
      const b = new Uint16Array(n);
      hf.tensors.readBf16(t.name, a);
      gguf.tensors.readBf16(t.name, b);
      expect(Buffer.from(b.buffer).equals(Buffer.from(a.buffer)), t.name).toBe(true);
    }
  });

  it("gives the folder's logits once the scale matches (the same effective norm weights f32(1 + w))", async () => {
    const ids = hf.tokenizer.encode("The capital of France is Paris, and the capital of Korea is Seoul.");
    expect(ids.length).toBeGreaterThan(12); // past the window of 6
    const run = async (ck: Checkpoint) => {
      const m = await LlamaModel.load(ck);
      try {
        return m.prefillAllLogits(ids, m.newCache(64));
      } finally {
        m.close();
      }
    };
    const same = { ...gguf, config: { ...gguf.config, queryPreAttnScalar: hf.config.queryPreAttnScalar } };
    const [a, b] = [await run(hf), await run(same)];
    for (let i = 0; i < a.length; i++) expect(Buffer.from(b[i]!.buffer).equals(Buffer.from(a[i]!.buffer)), `position ${i}`).toBe(true);
  });
});
