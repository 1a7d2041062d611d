// A generated Qwen3 folder written as GGUF the way llama.cpp's converter writes Qwen3 (arch
// "qwen3", attention.key_length, attn_q_norm / attn_k_norm, q/k rows not permuted: Qwen3 runs
// llama.cpp's NEOX RoPE) loads to the folder's config and tensors, and the model computes the same
// logits from both.
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { hfTensorName } from "../src/checkpoint/gguf-checkpoint.ts";
import { loadCheckpoint } from "../src/checkpoint/load-checkpoint.ts";
import type { Checkpoint } from "../src/checkpoint-types.ts";
import { LlamaModel } from "../src/model/llama-model.ts";
import { makeTinyModel } from "../src/tiny/make-tiny-model.ts";
import { QWEN3_CHAT_TEMPLATE } from "../src/tiny/qwen3-chat-template.ts";
import { TYPE_IDS, f32, ggufBytes, i32s, str, strs, u32, type GgufTensor, type MetaValue } from "./fixtures/io/gguf-writer.ts";

const root = mkdtempSync(join(tmpdir(), "llama-gguf-qwen3-"));
afterAll(() => rmSync(root, { recursive: true, force: true }));

const LAYER_PARTS = ["attn_norm", "attn_q", "attn_k", "attn_v", "attn_q_norm", "attn_k_norm", "attn_output", "ffn_norm", "ffn_gate", "ffn_up", "ffn_down"];

/** The folder's tensors as GGUF tensors (BF16 matrices, F32 vectors, as llama.cpp stores norms), GGUF names, dims reversed. */
function ggufTensors(hf: Checkpoint, layers: number): GgufTensor[] {
  const ggufName: Record<string, string> = {};
  for (const g of ["token_embd.weight", "output_norm.weight", ...Array.from({ length: layers }, (_, l) => LAYER_PARTS.map((p) => `blk.${l}.${p}.weight`)).flat()])
    ggufName[hfTensorName(g)] = g;
  return hf.tensors.list().map((t) => {
    const n = t.shape.reduce((a, b) => a * b, 1);
    const bits = new Uint16Array(n);
    hf.tensors.readBf16(t.name, bits);
    const matrix = t.shape.length === 2;
    const data = matrix ? new Uint8Array(bits.buffer) : new Uint8Array(Float32Array.from(bits, (b) => new Float32Array(new Uint32Array([b << 16]).buffer)[0]!).buffer);
    const name = ggufName[t.name];
    if (!name) throw new Error(`no GGUF name for ${t.name}`);
    return { name, dims: [...t.shape].reverse(), typeId: matrix ? TYPE_IDS.BF16 : TYPE_IDS.F32, data };
  });
}

describe("a Qwen3 GGUF converted from a generated folder", () => {
  const hfDir = join(root, "hf");
  const path = join(root, "qwen3.gguf");
  let hf: Checkpoint;
  let gguf: Checkpoint;

  beforeAll(async () => {
    makeTinyModel({ arch: "qwen3", out: hfDir, vocab: 400 });
    hf = await loadCheckpoint(hfDir);
    const tok = JSON.parse(readFileSync(join(hfDir, "tokenizer.json"), "utf8"));
    const vocab = Object.entries(tok.model.vocab as Record<string, number>)
      .sort((a, b) => a[1] - b[1])
      .map(([t]) => t);
    const metadata: Record<string, MetaValue> = {
      "general.architecture": str("qwen3"),
      "general.name": str("tiny-qwen3"),
      "qwen3.block_count": u32(2),
      "qwen3.context_length": u32(2048),
      "qwen3.embedding_length": u32(64),
      "qwen3.feed_forward_length": u32(128),
      "qwen3.attention.head_count": u32(4),
      "qwen3.attention.head_count_kv": u32(2),
      "qwen3.attention.key_length": u32(32),
      "qwen3.attention.value_length": u32(32),
      "qwen3.rope.freq_base": f32(1e6),
      "qwen3.attention.layer_norm_rms_epsilon": f32(1e-6),
      "tokenizer.ggml.model": str("gpt2"),
      "tokenizer.ggml.pre": str("qwen2"),
      "tokenizer.ggml.tokens": strs(vocab),
      "tokenizer.ggml.token_type": i32s(vocab.map((_, id) => (id < 3 ? 3 : 1))),
      "tokenizer.ggml.merges": strs((tok.model.merges as [string, string][]).map(([a, b]) => `${a} ${b}`)),
      "tokenizer.ggml.bos_token_id": u32(1),
      "tokenizer.ggml.eos_token_id": u32(2),
      "tokenizer.chat_template": str(QWEN3_CHAT_TEMPLATE),
    };
    writeFileSync(path, ggufBytes({ version: 3, metadata, tensors: ggufTensors(hf, 2) }));
    gguf = await loadCheckpoint(path);
  });
  afterAll(() => {
    hf?.tensors.close();
    gguf?.tensors.close();
  });

  it("maps attn_q_norm / attn_k_norm and reads key_length as head_dim", () => {
    expect(hfTensorName("blk.3.attn_q_norm.weight")).toBe("model.layers.3.self_attn.q_norm.weight");
    expect(hfTensorName("blk.3.attn_k_norm.weight")).toBe("model.layers.3.self_attn.k_norm.weight");
    const { storedDtype: _d, ...hfConfig } = hf.config;
    expect(gguf.config).toEqual({ ...hfConfig, rmsNormEps: Math.fround(1e-6) });
    expect(gguf.config.headDim).toBe(32);
  });

  it("holds the folder's tensors bit for bit (q/k rows not permuted for Qwen3)", () => {
    for (const t of hf.tensors.list()) {
      const n = t.shape.reduce((a, b) => a * b, 1);
      const a = new Uint16Array(n);
      const b = new Uint16Array(n);
      hf.tensors.readBf16(t.name, a);
      gguf.tensors.readBf16(t.name, b);
      expect(Buffer.from(b.buffer).equals(Buffer.from(a.buffer)), t.name).toBe(true);
    }
  });

  it("gives the folder's logits and chat prompt", async () => {
    const msgs = [{ role: "user" as const, content: "What is the capital of France?" }];
    const text = hf.renderChat!(msgs, { addGenerationPrompt: true });
    expect(gguf.renderChat!(msgs, { addGenerationPrompt: true })).toBe(text);
    const ids = hf.tokenizer.encode(text);
    expect(gguf.tokenizer.encode(text)).toEqual(ids);
    const run = async (ck: Checkpoint) => {
      const m = await LlamaModel.load(ck);
      try {
        const cache = m.newCache(64);
        return m.prefillAllLogits(ids, cache);
      } finally {
        m.close();
      }
    };
    const [a, b] = [await run(hf), await run(gguf)];
    expect(b.length).toBe(ids.length);
    for (let i = 0; i < a.length; i++) expect(Buffer.from(b[i]!.buffer).equals(Buffer.from(a[i]!.buffer)), `position ${i}`).toBe(true);
  });
});
