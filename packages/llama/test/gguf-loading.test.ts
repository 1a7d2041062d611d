import { mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { isAirmError } from "@airm/rm-core";
import { f32ToBf16, bf16ToF32, f16BitsToF32 } from "../src/checkpoint/bf16-convert.ts";
import { GgufTensorSource, hfTensorName } from "../src/checkpoint/gguf-checkpoint.ts";
import { openGguf } from "../src/checkpoint/gguf-file.ts";
import { loadCheckpoint } from "../src/checkpoint/load-checkpoint.ts";
import { ModelLoadError } from "../src/checkpoint/model-load-error.ts";
import type { Checkpoint } from "../src/checkpoint-types.ts";
import { listModels } from "../src/model-cache/model-cache.ts";
import { IncrementalDetokenizer } from "@airm/rm-core";
import { makeTinyModel, CHATML_TEMPLATE } from "../src/tiny/make-tiny-model.ts";
import { LlamaModel } from "../src/model/llama-model.ts";
import { ropeInverseFrequencies } from "../src/model/rope.ts";
import { randomBlocks } from "./model-helpers/quant-blocks.ts";
import {
  TYPE_IDS,
  f16Bits,
  f32,
  ggufBytes,
  i32s,
  lcg,
  permuteForGguf,
  quantQ4_0,
  quantQ4_1,
  quantQ8_0,
  str,
  strs,
  u32,
  type GgufTensor,
  type MetaValue,
} from "./fixtures/io/gguf-writer.ts";

const root = mkdtempSync(join(tmpdir(), "llama-gguf-"));
afterAll(() => rmSync(root, { recursive: true, force: true }));

/** Plain reference: bf16 of an f32 by the neighbour rule. */
function refBf16(v: number): number {
  const f = new Float32Array([v]);
  const lo = new Uint32Array(f.buffer)[0]! >>> 16;
  const dLo = Math.abs(f[0]! - bf16ToF32(lo));
  const dHi = Math.abs(bf16ToF32(lo + 1) - f[0]!);
  return dLo < dHi ? lo : dHi < dLo ? lo + 1 : lo % 2 === 0 ? lo : lo + 1;
}

function expectModelLoadError(fn: () => unknown, ...parts: string[]): void {
  let err: unknown;
  try {
    fn();
  } catch (e) {
    err = e;
  }
  expect(err).toBeInstanceOf(ModelLoadError);
  expect(isAirmError(err, "MODEL_LOAD")).toBe(true);
  for (const p of parts) expect((err as Error).message).toContain(p);
}

describe("GGUF dequantisation", () => {
  const rows = 6;
  const cols = 64;
  const count = rows * cols;
  const next = lcg(11);
  const f32Values = Float32Array.from({ length: count }, () => ((next() % 20001) - 10000) / 7777);
  const f16Values = Float32Array.from({ length: count }, (_, i) => f16BitsToF32(f16Bits([0.5, -1.25, 3.0078125, 0.0001220703125, -65504, 1][i % 6]!)));
  const bf16Bits = Uint16Array.from({ length: count }, () => next() & 0x7f7f);
  const q8 = quantQ8_0(count, 1);
  const q40 = quantQ4_0(count, 2);
  const q41 = quantQ4_1(count, 3);
  const f16Data = new Uint8Array(count * 2);
  f16Values.forEach((v, i) => new DataView(f16Data.buffer).setUint16(i * 2, f16Bits(v), true));
  const tensors: GgufTensor[] = [
    { name: "t.f32", dims: [cols, rows], typeId: TYPE_IDS.F32, data: new Uint8Array(f32Values.buffer.slice(0)) },
    { name: "t.f16", dims: [cols, rows], typeId: TYPE_IDS.F16, data: f16Data },
    { name: "t.bf16", dims: [cols, rows], typeId: TYPE_IDS.BF16, data: new Uint8Array(bf16Bits.buffer.slice(0)) },
    { name: "t.q8_0", dims: [cols, rows], typeId: TYPE_IDS.Q8_0, data: q8.data },
    { name: "t.q4_0", dims: [cols, rows], typeId: TYPE_IDS.Q4_0, data: q40.data },
    { name: "t.q4_1", dims: [cols, rows], typeId: TYPE_IDS.Q4_1, data: q41.data },
    { name: "t.q8_k", dims: [256, 1], typeId: TYPE_IDS.Q8_K, data: new Uint8Array(292) },
  ];
  const expected: Record<string, Uint16Array> = {
    "t.f32": Uint16Array.from(f32Values, refBf16),
    "t.f16": Uint16Array.from(f16Values, refBf16),
    "t.bf16": bf16Bits,
    "t.q8_0": Uint16Array.from(q8.expected, refBf16),
    "t.q4_0": Uint16Array.from(q40.expected, refBf16),
    "t.q4_1": Uint16Array.from(q41.expected, refBf16),
  };

  for (const [version, alignment] of [
    [2, 32],
    [3, 32],
    [3, 64],
  ] as const) {
    it(`reads every supported type exactly (GGUF v${version}, alignment ${alignment})`, () => {
      const path = join(root, `types-v${version}-a${alignment}.gguf`);
      writeFileSync(path, ggufBytes({ version, alignment, metadata: { "general.architecture": str("llama"), "test.count": u32(7) }, tensors }));
      const file = openGguf(path);
      const source = new GgufTensorSource(file, new Map());
      try {
        expect(file.version).toBe(version);
        expect(file.alignment).toBe(alignment);
        expect(file.metadata.get("test.count")).toBe(7);
        for (const [name, want] of Object.entries(expected)) {
          expect(source.info(name).shape).toEqual([rows, cols]);
          const got = new Uint16Array(count);
          source.readBf16(name, got);
          expect([...got], name).toEqual([...want]);
        }
        expect(source.info("t.q4_1").dtype).toBe("Q4_1");
        expectModelLoadError(() => source.readBf16("t.q8_k", new Uint16Array(256)), "t.q8_k", "Q8_K");
      } finally {
        source.close();
      }
    });
  }

  it("puts low nibbles at elements 0-15 and high nibbles at 16-31", () => {
    const data = new Uint8Array(20);
    const dv = new DataView(data.buffer);
    dv.setUint16(0, f16Bits(1), true);
    dv.setUint16(2, f16Bits(-8), true);
    for (let j = 0; j < 16; j++) data[4 + j] = j | ((15 - j) << 4);
    const path = join(root, "nibbles.gguf");
    writeFileSync(path, ggufBytes({ metadata: {}, tensors: [{ name: "n", dims: [32], typeId: TYPE_IDS.Q4_1, data }] }));
    const source = new GgufTensorSource(openGguf(path), new Map());
    const got = new Uint16Array(32);
    source.readBf16("n", got);
    source.close();
    const values = Array.from(got, bf16ToF32);
    expect(values.slice(0, 16)).toEqual(Array.from({ length: 16 }, (_, j) => j - 8));
    expect(values.slice(16)).toEqual(Array.from({ length: 16 }, (_, j) => 7 - j));
  });

  it("maps GGUF names to Hugging Face names", () => {
    expect(hfTensorName("token_embd.weight")).toBe("model.embed_tokens.weight");
    expect(hfTensorName("blk.12.attn_output.weight")).toBe("model.layers.12.self_attn.o_proj.weight");
    expect(hfTensorName("blk.0.attn_q.bias")).toBe("model.layers.0.self_attn.q_proj.bias");
    expect(hfTensorName("blk.3.ffn_gate.weight")).toBe("model.layers.3.mlp.gate_proj.weight");
    expect(hfTensorName("blk.3.ffn_norm.weight")).toBe("model.layers.3.post_attention_layernorm.weight");
    expect(hfTensorName("output_norm.weight")).toBe("model.norm.weight");
    expect(hfTensorName("output.weight")).toBe("lm_head.weight");
  });
});

describe("loadCheckpoint on a GGUF file converted from a generated model", () => {
  const hfDir = join(root, "hf");
  let hf: Checkpoint;
  let metadata: Record<string, MetaValue>;
  let tensors: GgufTensor[];

  beforeAll(async () => {
    makeTinyModel({ arch: "llama", out: hfDir, layers: 2, hidden: 64, heads: 4, kvHeads: 2, vocab: 400 });
    hf = await loadCheckpoint(hfDir);
    const tok = JSON.parse(readFileSync(join(hfDir, "tokenizer.json"), "utf8"));
    const vocab = Object.entries(tok.model.vocab as Record<string, number>)
      .sort((a, b) => a[1] - b[1])
      .map(([t]) => t);
    metadata = {
      "general.architecture": str("llama"),
      "general.name": str("tiny"),
      "llama.block_count": u32(2),
      "llama.context_length": u32(2048),
      "llama.embedding_length": u32(64),
      "llama.feed_forward_length": u32(128),
      "llama.attention.head_count": u32(4),
      "llama.attention.head_count_kv": u32(2),
      "llama.rope.freq_base": f32(10000),
      "llama.attention.layer_norm_rms_epsilon": f32(1e-5),
      "llama.vocab_size": u32(400),
      "tokenizer.ggml.model": str("gpt2"),
      "tokenizer.ggml.pre": str("gpt2"),
      "tokenizer.ggml.tokens": strs(vocab),
      "tokenizer.ggml.token_type": i32s(vocab.map((_, id) => (id < 3 ? 3 : 1))),
      "tokenizer.ggml.merges": strs((tok.model.merges as [string, string][]).map(([a, b]) => `${a} ${b}`)),
      "tokenizer.ggml.bos_token_id": u32(1),
      "tokenizer.ggml.eos_token_id": u32(2),
      "tokenizer.ggml.padding_token_id": u32(0),
      "tokenizer.chat_template": str(CHATML_TEMPLATE),
    };
    const ggufName: Record<string, string> = {};
    for (const g of [
      "token_embd.weight",
      "output_norm.weight",
      "output.weight",
      ...[0, 1].flatMap((l) => ["attn_norm", "attn_q", "attn_k", "attn_v", "attn_output", "ffn_norm", "ffn_gate", "ffn_up", "ffn_down"].map((p) => `blk.${l}.${p}.weight`)),
    ])
      ggufName[hfTensorName(g)] = g;
    tensors = hf.tensors.list().map((t, i) => {
      const n = t.shape.reduce((a, b) => a * b, 1);
      const bits = new Uint16Array(n);
      hf.tensors.readBf16(t.name, bits);
      let values: Float32Array = Float32Array.from(bits, bf16ToF32);
      const rows = t.shape[0]!;
      if (t.name.endsWith("q_proj.weight")) values = permuteForGguf(values, rows, n / rows, 4);
      if (t.name.endsWith("k_proj.weight")) values = permuteForGguf(values, rows, n / rows, 2);
      const useBf16 = i % 2 === 0 && t.shape.length === 2;
      const data = useBf16 ? new Uint8Array(Uint16Array.from(values, f32ToBf16).buffer) : new Uint8Array(values.buffer);
      return { name: ggufName[t.name]!, dims: [...t.shape].reverse(), typeId: useBf16 ? TYPE_IDS.BF16 : TYPE_IDS.F32, data };
    });
  });
  afterAll(() => hf?.tensors.close());

  it("gives the same config, tensors (q/k un-permuted), tokenizer and chat template as the HF folder", async () => {
    const path = join(root, "tiny.gguf");
    writeFileSync(path, ggufBytes({ version: 3, metadata, tensors }));
    const ck = await loadCheckpoint(path);
    try {
      expect(ck.id).toBe("tiny");
      // GGUF stores quantised types, so it names no float dtype; the rest is equal
      const { storedDtype: _d, ...hfConfig } = hf.config;
      expect(ck.config).toEqual({ ...hfConfig, maxPositionEmbeddings: 2048, rmsNormEps: Math.fround(1e-5) });
      expect(ck.generation.eosTokenIds).toEqual([2]);
      for (const t of hf.tensors.list()) {
        const n = t.shape.reduce((a, b) => a * b, 1);
        const a = new Uint16Array(n);
        const b = new Uint16Array(n);
        hf.tensors.readBf16(t.name, a);
        ck.tensors.readBf16(t.name, b);
        expect(Buffer.from(b.buffer).equals(Buffer.from(a.buffer)), t.name).toBe(true);
        expect(ck.tensors.info(t.name).shape).toEqual(t.shape);
      }
      for (const text of ["The capital of France is Paris.", "안녕하세요 🙂 hello", "<|im_start|>user\nHi<|im_end|>\n", "  spaces  and\ttabs\n\nnewlines 42"]) {
        const ids = ck.tokenizer.encode(text);
        expect(ids).toEqual(hf.tokenizer.encode(text));
        expect(ck.tokenizer.decode(ids)).toBe(text);
      }
      const msgs = [{ role: "user", content: "What is the capital of France?" }];
      expect(ck.renderChat!(msgs, { addGenerationPrompt: true })).toBe(hf.renderChat!(msgs, { addGenerationPrompt: true }));
      expect(ck.tokenizer.decode([1, 2], { skipSpecialTokens: true })).toBe("");
      expect(ck.fingerprint).toMatch(/^[0-9a-f]{64}$/);
      expect(ck.fingerprint).not.toBe(hf.fingerprint);
    } finally {
      ck.tensors.close();
    }
  });

  it("reads the sampling defaults llama.cpp reads (general.sampling.*), float32 as their decimals; none without them", async () => {
    const path = join(root, "sampling.gguf");
    writeFileSync(path, ggufBytes({ metadata, tensors }));
    const none = await loadCheckpoint(path);
    none.tensors.close();
    expect(none.generation).toEqual({ eosTokenIds: [2], samplingFrom: "GGUF metadata" });
    const sampling: Record<string, MetaValue> = {
      "general.sampling.temp": f32(0.7),
      "general.sampling.top_p": f32(0.95),
      "general.sampling.top_k": { type: "i32", value: 20 },
      "general.sampling.min_p": f32(0.05),
      "general.sampling.penalty_repeat": f32(1.05),
      "general.sampling.xtc_probability": f32(0.5), // a sampler this server has not: not read
    };
    writeFileSync(path, ggufBytes({ metadata: { ...metadata, ...sampling }, tensors }));
    const ck = await loadCheckpoint(path);
    ck.tensors.close();
    expect(ck.generation).toEqual({ eosTokenIds: [2], temperature: 0.7, topP: 0.95, topK: 20, minP: 0.05, repetitionPenalty: 1.05, samplingFrom: "GGUF metadata" });
    // out of its request field's range: left out and named, the load goes on
    writeFileSync(path, ggufBytes({ metadata: { ...metadata, "general.sampling.temp": f32(5), "general.sampling.top_k": u32(40) }, tensors }));
    const bad = await loadCheckpoint(path);
    bad.tensors.close();
    expect(bad.generation).toMatchObject({ topK: 40, samplingIgnored: ["general.sampling.temp=5 (temperature must be a number in [0, 2])"] });
    expect(bad.generation.temperature).toBeUndefined();
  });

  it("treats a missing output.weight as tied embeddings", async () => {
    const path = join(root, "tied.gguf");
    writeFileSync(path, ggufBytes({ metadata, tensors: tensors.filter((t) => t.name !== "output.weight") }));
    const ck = await loadCheckpoint(path);
    expect(ck.config.tieWordEmbeddings).toBe(true);
    expect(ck.tensors.has("lm_head.weight")).toBe(false);
    ck.tensors.close();
  });

  it("reads Llama 3.1 rope scaling from rope_freqs.weight (llama.cpp's per-pair divisors) and refuses a wrong one by name", async () => {
    // The factors llama.cpp's converter writes for rope_scaling {factor 8, low 1, high 4, original 64}
    // at head_dim 16, theta 10000: pairs in all three regimes (kept, blended, divided by 8).
    const llama3 = { type: "llama3" as const, factor: 8, lowFreqFactor: 1, highFreqFactor: 4, originalMaxPositionEmbeddings: 64 };
    const factors = new Float32Array(8);
    for (let i = 0; i < 8; i++) {
      const wavelen = (2 * Math.PI) / (1 / 10000 ** ((2 * i) / 16));
      const smooth = (64 / wavelen - 1) / (4 - 1);
      factors[i] = wavelen < 64 / 4 ? 1 : wavelen > 64 / 1 ? 8 : 1 / ((1 - smooth) / 8 + smooth);
    }
    expect(new Set(factors).size).toBeGreaterThan(2);
    const withFreqs = (data: Uint8Array, dims: number[], typeId: number = TYPE_IDS.F32) =>
      ggufBytes({ metadata, tensors: [...tensors, { name: "rope_freqs.weight", dims, typeId, data }] });
    const path = join(root, "rope-freqs.gguf");
    writeFileSync(path, withFreqs(new Uint8Array(factors.buffer), [8]));
    const ck = await loadCheckpoint(path);
    try {
      expect(ck.config.ropeScaling).toEqual({ type: "freq_factors", factors: Array.from(factors) });
      const fromGguf = ropeInverseFrequencies(16, 10000, ck.config.ropeScaling);
      const fromHf = ropeInverseFrequencies(16, 10000, llama3);
      for (let i = 0; i < 8; i++) expect(Math.abs(fromGguf[i] - fromHf[i]) / fromHf[i], `pair ${i}`).toBeLessThan(1e-6);
      const model = await LlamaModel.load(ck);
      const cache = model.newCache(8);
      expect(model.prefill([5, 6, 7], cache).every(Number.isFinite)).toBe(true);
      model.close();
    } finally {
      ck.tensors.close();
    }
    for (const [name, bytes] of [
      ["rope-short", withFreqs(new Uint8Array(factors.buffer, 0, 16), [4])],
      ["rope-zero", withFreqs(new Uint8Array(32), [8])],
    ] as const) {
      const bad = join(root, `${name}.gguf`);
      writeFileSync(bad, bytes);
      const err = await loadCheckpoint(bad).then(
        () => undefined,
        (e: unknown) => e,
      );
      expect(err, name).toBeInstanceOf(ModelLoadError);
      expect((err as Error).message).toContain("rope_freqs.weight");
    }
  });

  it("runs a Q4_K_M-style file (Q4_K q/k/gate/up/embeddings, Q6_K v/down/output, one Q8_0 v) on the K-quant kernels, close to its bf16 dequantisation", async () => {
    // hidden 256 so that K-quant rows (256 per block) fit; random blocks, unit norms
    const dims = { hidden: 256, ffn: 512, heads: 4, kv: 2, vocab: 400 };
    const hd = dims.hidden / dims.heads;
    const r = (() => {
      let a = 12345;
      return () => {
        a = (Math.imul(a, 1664525) + 1013904223) >>> 0;
        return a / 2 ** 32 - 0.5;
      };
    })();
    const kq = (name: string, rows: number, cols: number, type: "Q4_K" | "Q6_K" | "Q8_0"): GgufTensor => ({
      name,
      dims: [cols, rows],
      typeId: type === "Q4_K" ? 12 : type === "Q6_K" ? 14 : TYPE_IDS.Q8_0,
      data: randomBlocks(type, rows, cols, r),
    });
    const ones = (name: string, n: number): GgufTensor => ({ name, dims: [n], typeId: TYPE_IDS.F32, data: new Uint8Array(new Float32Array(n).fill(1).buffer) });
    const kt: GgufTensor[] = [
      kq("token_embd.weight", dims.vocab, dims.hidden, "Q4_K"),
      ones("output_norm.weight", dims.hidden),
      kq("output.weight", dims.vocab, dims.hidden, "Q6_K"),
    ];
    for (const l of [0, 1]) {
      kt.push(ones(`blk.${l}.attn_norm.weight`, dims.hidden), ones(`blk.${l}.ffn_norm.weight`, dims.hidden));
      kt.push(kq(`blk.${l}.attn_q.weight`, dims.heads * hd, dims.hidden, "Q4_K"), kq(`blk.${l}.attn_k.weight`, dims.kv * hd, dims.hidden, "Q4_K"));
      kt.push(kq(`blk.${l}.attn_v.weight`, dims.kv * hd, dims.hidden, l === 1 ? "Q8_0" : "Q6_K"), kq(`blk.${l}.attn_output.weight`, dims.hidden, dims.heads * hd, "Q4_K"));
      kt.push(kq(`blk.${l}.ffn_gate.weight`, dims.ffn, dims.hidden, "Q4_K"), kq(`blk.${l}.ffn_up.weight`, dims.ffn, dims.hidden, "Q4_K"));
      kt.push(kq(`blk.${l}.ffn_down.weight`, dims.hidden, dims.ffn, "Q6_K"));
    }
    const md = {
      ...metadata,
      "llama.embedding_length": u32(dims.hidden),
      "llama.feed_forward_length": u32(dims.ffn),
      "llama.attention.head_count": u32(dims.heads),
      "llama.attention.head_count_kv": u32(dims.kv),
    };
    const path = join(root, "tiny-q4km.gguf");
    writeFileSync(path, ggufBytes({ version: 3, metadata: md, tensors: kt }));
    const ck = await loadCheckpoint(path);
    const quant = await LlamaModel.load(ck);
    const quant16 = await LlamaModel.load(ck, { activations: "i16" });
    const plain = await LlamaModel.load(ck, { weights: "bf16" });
    try {
      // per layer: qkv = a q4k segment (q, k) + a q6k segment (v; layer 1: q8), o, gate/up (q4k), down (q6k); embeddings q4k, output q6k
      // (8-bit inputs, the default: the kinds over 8-bit inputs)
      // (layer 1's v is Q8_0: its fused q/k/v runs a q4ka8 segment on the 8-bit input and a q8 one on the 16-bit input)
      expect(quant.weightKinds).toEqual({ bf16: 0, q8: 1, q4: 0, q4k: 0, q6k: 0, q4a8: 0, q4ka8: 7, q6ka8: 4, q5a8: 0 });
      expect(quant16.weightKinds).toEqual({ bf16: 0, q8: 1, q4: 0, q4k: 7, q6k: 4, q4a8: 0, q4ka8: 0, q6ka8: 0, q5a8: 0 });
      expect(plain.weightKinds.bf16).toBe(10);
      expect(quant.weightBytesPerToken).toBeLessThan(plain.weightBytesPerToken / 2);
      expect(quant.numericsFingerprint).not.toBe(plain.numericsFingerprint);
      const prompt = [1, 17, 33, 250, 8, 91, 140, 3, 66];
      const a = quant.newCache(32);
      const b = plain.newCache(32);
      const la = quant.prefill(prompt, a);
      const lb = plain.prefill(prompt, b);
      const l16 = quant16.prefill(prompt, quant16.newCache(32));
      const rel = (l: Float32Array): number => {
        let maxDiff = 0;
        let maxRef = 0;
        for (let i = 0; i < lb.length; i++) {
          maxDiff = Math.max(maxDiff, Math.abs(l[i] - lb[i]));
          maxRef = Math.max(maxRef, Math.abs(lb[i]));
        }
        expect(maxRef).toBeGreaterThan(0.1);
        return maxDiff / maxRef;
      };
      console.log(`Q4_K_M-style file against its bf16 dequantisation: max |dlogit| / max |logit| ${rel(l16).toFixed(4)} with 16-bit inputs, ${rel(la).toFixed(4)} with 8-bit`);
      expect(rel(l16)).toBeLessThan(3e-2);
      expect(rel(la)).toBeLessThan(3e-2);
      // the same prompt token by token fills the same KV and gives the same bits (the 1-token kernels)
      const c = quant.newCache(32);
      let last: Float32Array | undefined;
      for (const t of prompt) last = quant.decode([{ cache: c, token: t }])[0];
      expect(Buffer.from(last!.buffer).equals(Buffer.from(la.buffer))).toBe(true);
      // and two threads (each segment's rows split) give the same bits
      const two = await LlamaModel.load(ck, { threads: 2 });
      try {
        expect(Buffer.from(two.prefill(prompt, two.newCache(32)).buffer).equals(Buffer.from(la.buffer))).toBe(true);
      } finally {
        two.close();
      }
    } finally {
      quant.close();
      quant16.close();
      plain.close();
      ck.tensors.close();
    }
  });

  it("names the missing key, the missing tensor, the unsupported type and the truncated tensor", async () => {
    const without = (key: string) => Object.fromEntries(Object.entries(metadata).filter(([k]) => k !== key));
    const cases: Array<{ name: string; bytes: () => Buffer; parts: string[] }> = [
      { name: "nokey", bytes: () => ggufBytes({ metadata: without("llama.block_count"), tensors }), parts: ["llama.block_count", "missing"] },
      {
        name: "noffn",
        bytes: () => ggufBytes({ metadata, tensors: tensors.filter((t) => t.name !== "blk.1.ffn_up.weight") }),
        parts: ["model.layers.1.mlp.up_proj.weight", "missing"],
      },
      { name: "notok", bytes: () => ggufBytes({ metadata: without("tokenizer.ggml.merges"), tensors }), parts: ["tokenizer.ggml.merges"] },
      { name: "wpm", bytes: () => ggufBytes({ metadata: { ...metadata, "tokenizer.ggml.model": str("bert") }, tensors }), parts: ["tokenizer.ggml.model", "bert"] },
      { name: "spm-no-scores", bytes: () => ggufBytes({ metadata: { ...metadata, "tokenizer.ggml.model": str("llama") }, tensors }), parts: ["tokenizer.ggml.scores"] },
      { name: "arch", bytes: () => ggufBytes({ metadata: { ...metadata, "general.architecture": str("falcon") }, tensors }), parts: ["falcon", "general.architecture"] },
      {
        name: "q8k",
        bytes: () =>
          ggufBytes({ metadata, tensors: tensors.map((t) => (t.name === "output_norm.weight" ? { ...t, dims: [256], typeId: TYPE_IDS.Q8_K, data: new Uint8Array(292) } : t)) }),
        parts: ["model.norm.weight"],
      },
      {
        name: "unknown-type",
        bytes: () => ggufBytes({ metadata, tensors: tensors.map((t) => (t.name === "blk.0.ffn_up.weight" ? { ...t, typeId: 99 } : t)) }),
        parts: ["blk.0.ffn_up.weight", "unknown GGML type 99"],
      },
      { name: "truncated", bytes: () => ggufBytes({ metadata, tensors }).subarray(0, -100), parts: ["truncated", tensors.at(-1)!.name] },
      { name: "truncated-meta", bytes: () => ggufBytes({ metadata, tensors }).subarray(0, 2000), parts: ["truncated"] },
      { name: "magic", bytes: () => Buffer.from("GGML0000000000000000"), parts: ["GGUF magic"] },
      {
        name: "v1",
        bytes: () => {
          const b = ggufBytes({ metadata, tensors });
          b.writeUInt32LE(1, 4);
          return b;
        },
        parts: ["version 1"],
      },
    ];
    for (const c of cases) {
      const path = join(root, `${c.name}.gguf`);
      writeFileSync(path, c.bytes());
      const err = await loadCheckpoint(path).then(
        () => undefined,
        (e: unknown) => e,
      );
      expect(err, c.name).toBeInstanceOf(ModelLoadError);
      for (const p of [path, ...c.parts]) expect((err as Error).message, c.name).toContain(p);
    }
  });
});

describe("the cached SmolLM2-135M-Instruct GGUF (when present)", () => {
  const cached = listModels().find((m) => m.name === "smollm2-135m-instruct");
  const present = cached !== undefined;
  const path = cached?.path ?? "";
  it.skipIf(!present)("loads with SmolLM2's shape, tokenizer and chat template", async () => {
    const ck = await loadCheckpoint(path);
    try {
      expect(ck.config).toMatchObject({
        architecture: "llama",
        numLayers: 30,
        hiddenSize: 576,
        numHeads: 9,
        numKvHeads: 3,
        headDim: 64,
        intermediateSize: 1536,
        vocabSize: 49152,
        tieWordEmbeddings: true,
        ropeTheta: 100000,
        eosTokenIds: [2],
      });
      const prompt = ck.renderChat!([{ role: "user", content: "What is the capital of France?" }], { addGenerationPrompt: true });
      expect(prompt.endsWith("<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n")).toBe(true);
      const ids = ck.tokenizer.encode(prompt);
      expect(ids.slice(0, 3)).toEqual([1, 9690, 198]);
      expect(ck.tokenizer.decode(ids)).toBe(prompt);
      expect(ck.tensors.info("model.layers.0.self_attn.q_proj.weight").dtype).toBe("Q4_1");
      const text = "서울은 한국의 수도입니다 🇰🇷 and Paris is the capital of France 🥐.";
      const textIds = ck.tokenizer.encode(text);
      const d = new IncrementalDetokenizer(ck.tokenizer);
      const pieces = textIds.map((id) => d.push(id));
      pieces.push(d.flush());
      for (const p of pieces) expect(p).not.toContain("\uFFFD");
      expect(pieces.join("")).toBe(text);
    } finally {
      ck.tensors.close();
    }
  });
});
