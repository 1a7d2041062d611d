import { mkdtempSync, readFileSync, rmSync, truncateSync, statSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, describe, expect, it } from "vitest";
import { isAirmError } from "@airm/rm-core";
import { loadCheckpoint } from "../src/checkpoint/load-checkpoint.ts";
import { ModelLoadError } from "../src/checkpoint/model-load-error.ts";
import { f32ToBf16, f16BitsToF32 } from "../src/checkpoint/bf16-convert.ts";
import { LLAMA_CONFIG, QWEN2_CONFIG, writeHfFolder } from "./fixtures/io/hf-folder.ts";

const root = mkdtempSync(join(tmpdir(), "llama-ckpt-"));
afterAll(() => rmSync(root, { recursive: true, force: true }));
let n = 0;
const folder = () => join(root, `m${n++}`);

/** bf16 bits of an f32 by comparing the two neighbours (independent of the bit trick). */
function refBf16(v: number): number {
  const f = new Float32Array([v]);
  const bits = new Uint32Array(f.buffer)[0]!;
  const lo = bits >>> 16;
  const asF32 = (b: number) => new Float32Array(new Uint32Array([(b << 16) >>> 0]).buffer)[0]!;
  const dLo = Math.abs(f[0]! - asF32(lo));
  const dHi = Math.abs(asF32(lo + 1) - f[0]!);
  if (dLo < dHi) return lo;
  if (dHi < dLo) return lo + 1;
  return lo % 2 === 0 ? lo : lo + 1;
}

async function expectLoadError(path: string, ...parts: string[]): Promise<ModelLoadError> {
  const err = await loadCheckpoint(path).then(
    () => undefined,
    (e: unknown) => e,
  );
  expect(err).toBeInstanceOf(ModelLoadError);
  expect(isAirmError(err, "MODEL_LOAD")).toBe(true);
  for (const p of parts) expect((err as Error).message).toContain(p);
  return err as ModelLoadError;
}

describe("bf16 conversion", () => {
  it("rounds f32 to nearest even and keeps specials", () => {
    expect(f32ToBf16(1)).toBe(0x3f80);
    expect(f32ToBf16(1 + 2 ** -8)).toBe(0x3f80); // tie -> even (down)
    expect(f32ToBf16(1 + 3 * 2 ** -8)).toBe(0x3f82); // tie -> even (up)
    expect(f32ToBf16(1 + 2 ** -8 + 2 ** -20)).toBe(0x3f81);
    expect(f32ToBf16(-0)).toBe(0x8000);
    expect(f32ToBf16(Infinity)).toBe(0x7f80);
    expect(f32ToBf16(3.4028234663852886e38)).toBe(0x7f80); // max f32 rounds to inf
    const nan = f32ToBf16(NaN);
    expect(nan & 0x7f80).toBe(0x7f80);
    expect(nan & 0x7f).not.toBe(0);
    for (const v of [0.1, -0.3333, 123.456, 1e-30, -7e20]) expect(f32ToBf16(v)).toBe(refBf16(v));
  });
  it("decodes f16", () => {
    expect(f16BitsToF32(0x3c00)).toBe(1);
    expect(f16BitsToF32(0xc000)).toBe(-2);
    expect(f16BitsToF32(0x0001)).toBe(2 ** -24);
    expect(f16BitsToF32(0x7bff)).toBe(65504);
    expect(f16BitsToF32(0x7c00)).toBe(Infinity);
  });
});

describe("loadCheckpoint on Hugging Face folders", () => {
  it("loads a Llama 3.1-style config with rope scaling, GQA and untied head", async () => {
    const dir = folder();
    writeHfFolder(dir, { config: LLAMA_CONFIG, generationConfig: { eos_token_id: [2, 0], temperature: 0.6, top_p: 0.9 } });
    const ck = await loadCheckpoint(dir);
    try {
      expect(ck.config).toMatchObject({
        architecture: "llama",
        hiddenSize: 16,
        numHeads: 4,
        numKvHeads: 2,
        headDim: 4,
        numLayers: 2,
        vocabSize: 259,
        ropeTheta: 500000,
        tieWordEmbeddings: false,
        attentionBias: false,
        bosTokenId: 1,
        eosTokenIds: [2],
        ropeScaling: { type: "llama3", factor: 8, lowFreqFactor: 1, highFreqFactor: 4, originalMaxPositionEmbeddings: 8192 },
      });
      expect(ck.generation).toEqual({ eosTokenIds: [2, 0], temperature: 0.6, topP: 0.9, samplingFrom: "generation_config.json" });
      expect(ck.tensors.has("lm_head.weight")).toBe(true);
      expect(ck.tensors.info("model.layers.1.self_attn.k_proj.weight").shape).toEqual([8, 16]);
      const dst = new Uint16Array(8 * 16);
      ck.tensors.readBf16("model.layers.1.self_attn.k_proj.weight", dst);
      expect(dst[5]).not.toBe(0);
      expect(ck.fingerprint).toMatch(/^[0-9a-f]{64}$/);
      expect(ck.renderChat?.([{ role: "user", content: "hi" }], { addGenerationPrompt: true })).toBe("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n");
      const ids = ck.tokenizer.encode("héllo <|im_end|>");
      expect(ids.at(-1)).toBe(2);
      expect(ck.tokenizer.decode(ids)).toBe("héllo <|im_end|>");
      expect(ck.tokenizer.decode(ids, { skipSpecialTokens: true })).toBe("héllo ");
      expect(ck.tokenizer.decode([])).toBe("");
      expect(ck.tokenizer.eosTokenIds).toEqual([2, 0]);
    } finally {
      ck.tensors.close();
    }
  });

  it("loads Qwen2 with bias and tied embeddings; converts F32 and F16 to bf16 exactly", async () => {
    const dirBf = folder();
    const dirF32 = folder();
    const dirF16 = folder();
    writeHfFolder(dirBf, { config: QWEN2_CONFIG, dtype: "BF16" });
    writeHfFolder(dirF32, { config: QWEN2_CONFIG, dtype: "F32" });
    writeHfFolder(dirF16, { config: QWEN2_CONFIG, dtype: "F16", shards: 3 });
    const f32 = await loadCheckpoint(dirF32);
    const f16 = await loadCheckpoint(dirF16);
    const bf = await loadCheckpoint(dirBf);
    try {
      expect(f32.config).toMatchObject({ architecture: "qwen2", attentionBias: true, tieWordEmbeddings: true, headDim: 8, numKvHeads: 1, ropeScaling: null });
      expect(f32.tensors.has("model.layers.0.self_attn.q_proj.bias")).toBe(true);
      expect(f32.tensors.has("lm_head.weight")).toBe(false);
      const name = "model.layers.1.mlp.down_proj.weight";
      const count = 16 * 24;
      // F32: expected bits computed from the stored f32 values with the neighbour rule
      const raw = readFileSync(join(dirF32, "model.safetensors"));
      const headerLen = Number(raw.readBigUInt64LE(0));
      const header = JSON.parse(raw.subarray(8, 8 + headerLen).toString());
      const [b] = header[name].data_offsets as [number, number];
      const stored = new Float32Array(raw.buffer.slice(raw.byteOffset + 8 + headerLen + b, raw.byteOffset + 8 + headerLen + b + count * 4));
      const got = new Uint16Array(count);
      f32.tensors.readBf16(name, got);
      const want = Uint16Array.from(stored, (v) => refBf16(v));
      expect([...got]).toEqual([...want]);
      // F16 via shards: every value equals the rounded f16 value
      const got16 = new Uint16Array(count);
      f16.tensors.readBf16(name, got16);
      expect(f16.tensors.info(name).dtype).toBe("F16");
      expect(f16.tensors.info(name).file).toMatch(/model-0000\d-of-00003\.safetensors$/);
      const bfGot = new Uint16Array(count);
      bf.tensors.readBf16(name, bfGot);
      let close = 0;
      for (let i = 0; i < count; i++) if (Math.abs(got16[i]! - bfGot[i]!) <= 1) close++;
      expect(close).toBe(count);
      // fingerprints: differ by stored dtype, stable across loads
      expect(f32.fingerprint).not.toBe(f16.fingerprint);
      const again = await loadCheckpoint(dirF32);
      expect(again.fingerprint).toBe(f32.fingerprint);
      again.tensors.close();
      expect(f16.tensors.sha256(name)).toMatch(/^[0-9a-f]{64}$/);
      expect(() => f16.tensors.readBf16(name, new Uint16Array(3))).toThrow(ModelLoadError);
    } finally {
      f32.tensors.close();
      f16.tensors.close();
      bf.tensors.close();
    }
  });

  it("reads a transformers-5 folder: chat_template.jinja only, rope_parameters, dtype; and prefers the .jinja file over tokenizer_config.json", async () => {
    const { rope_theta: _t, rope_scaling: _s, ...rest } = LLAMA_CONFIG;
    const config5 = { ...rest, dtype: "bfloat16", rope_parameters: { ...LLAMA_CONFIG.rope_scaling, rope_theta: LLAMA_CONFIG.rope_theta } };
    const d5 = folder();
    writeHfFolder(d5, { config: config5, templateIn: "jinja" });
    const d4 = folder();
    writeHfFolder(d4, { config: LLAMA_CONFIG });
    const [c5, c4] = [await loadCheckpoint(d5), await loadCheckpoint(d4)];
    try {
      const chat = [{ role: "user", content: "hi" }];
      expect(c5.renderChat?.(chat, { addGenerationPrompt: true })).toBe("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n");
      const { storedDtype, ...same5 } = c5.config;
      expect(storedDtype).toBe("bfloat16");
      expect(same5).toEqual(c4.config);
      // both present: the .jinja file wins, as in transformers
      writeFileSync(join(d4, "chat_template.jinja"), "{{ messages[0]['content'] }}!");
      const both = await loadCheckpoint(d4);
      expect(both.renderChat?.(chat)).toBe("hi!");
      both.tensors.close();
    } finally {
      c5.tensors.close();
      c4.tensors.close();
    }
  });

  it("f16 conversion matches the neighbour rule on stored values", async () => {
    const dir = folder();
    writeHfFolder(dir, { config: QWEN2_CONFIG, dtype: "F16" });
    const ck = await loadCheckpoint(dir);
    try {
      const name = "model.norm.weight";
      const raw = readFileSync(join(dir, "model.safetensors"));
      const headerLen = Number(raw.readBigUInt64LE(0));
      const header = JSON.parse(raw.subarray(8, 8 + headerLen).toString());
      const [b] = header[name].data_offsets as [number, number];
      const got = new Uint16Array(16);
      ck.tensors.readBf16(name, got);
      for (let i = 0; i < 16; i++) expect(got[i]).toBe(refBf16(f16BitsToF32(raw.readUInt16LE(8 + headerLen + b + i * 2))));
    } finally {
      ck.tensors.close();
    }
  });

  it("fingerprint changes when one weight byte changes and ignores config key order", async () => {
    const a = folder();
    const b = folder();
    writeHfFolder(a, { config: QWEN2_CONFIG });
    writeHfFolder(b, { config: Object.fromEntries(Object.entries(QWEN2_CONFIG).reverse()) });
    const ca = await loadCheckpoint(a);
    const cb = await loadCheckpoint(b);
    const fa = ca.fingerprint;
    expect(cb.fingerprint).toBe(fa);
    ca.tensors.close();
    cb.tensors.close();
    const file = join(b, "model.safetensors");
    const bytes = readFileSync(file);
    bytes[bytes.length - 1] ^= 1;
    writeFileSync(file, bytes);
    const cc = await loadCheckpoint(b);
    expect(cc.fingerprint).not.toBe(fa);
    cc.tensors.close();
  });

  it("rejects unsupported architectures, naming the file and the architecture", async () => {
    const dir = folder();
    writeHfFolder(dir, { config: LLAMA_CONFIG });
    writeFileSync(join(dir, "config.json"), JSON.stringify({ ...LLAMA_CONFIG, architectures: ["MistralForCausalLM"] }));
    await expectLoadError(dir, "config.json", "MistralForCausalLM");
  });

  it("rejects a missing tensor, naming it", async () => {
    const dir = folder();
    writeHfFolder(dir, { config: LLAMA_CONFIG, skipTensor: "model.layers.1.mlp.up_proj.weight" });
    const err = await expectLoadError(dir, "model.layers.1.mlp.up_proj.weight", "missing");
    expect(err.item).toBe("model.layers.1.mlp.up_proj.weight");
  });

  it("rejects an unsupported dtype, naming file and tensor", async () => {
    const dir = folder();
    writeHfFolder(dir, { config: QWEN2_CONFIG, dtypeOf: (n) => (n === "model.norm.weight" ? "F32" : "BF16") });
    // rewrite the dtype in the header to I32 (same element size as F32)
    const file = join(dir, "model.safetensors");
    const bytes = readFileSync(file);
    const headerLen = Number(bytes.readBigUInt64LE(0));
    const header = bytes
      .subarray(8, 8 + headerLen)
      .toString()
      .replace('"model.norm.weight":{"dtype":"F32"', '"model.norm.weight":{"dtype":"I32"');
    bytes.write(header, 8);
    writeFileSync(file, bytes);
    await expectLoadError(dir, "model.safetensors", "model.norm.weight", "I32");
  });

  it("rejects a truncated file, naming the file and the tensor whose range runs past the end", async () => {
    const dir = folder();
    writeHfFolder(dir, { config: QWEN2_CONFIG });
    const file = join(dir, "model.safetensors");
    truncateSync(file, statSync(file).size - 10);
    await expectLoadError(dir, "model.safetensors", "model.norm.weight", "truncated");
  });

  it("rejects a header longer than the file and garbage headers", async () => {
    const dir = folder();
    writeHfFolder(dir, { config: QWEN2_CONFIG });
    const file = join(dir, "model.safetensors");
    const bytes = readFileSync(file);
    bytes.writeBigUInt64LE(BigInt(bytes.length * 4), 0);
    writeFileSync(file, bytes);
    await expectLoadError(dir, "model.safetensors", "header length");
    bytes.writeBigUInt64LE(16n, 0);
    writeFileSync(file, bytes);
    await expectLoadError(dir, "model.safetensors", "not valid UTF-8 JSON");
    writeFileSync(file, Buffer.from([1, 2, 3]));
    await expectLoadError(dir, "model.safetensors");
  });

  it("rejects a shard listed in the index that is missing, and a missing config", async () => {
    const dir = folder();
    writeHfFolder(dir, { config: QWEN2_CONFIG, shards: 2 });
    rmSync(join(dir, "model-00002-of-00002.safetensors"));
    await expectLoadError(dir, "model-00002-of-00002.safetensors", "missing");
    rmSync(join(dir, "config.json"));
    await expectLoadError(dir, "config.json", "missing");
    await expectLoadError(join(dir, "nope"), "does not exist");
  });

  it("rejects a tensor whose shape disagrees with the config", async () => {
    const dir = folder();
    writeHfFolder(dir, { config: QWEN2_CONFIG });
    writeFileSync(join(dir, "config.json"), JSON.stringify({ ...QWEN2_CONFIG, intermediate_size: 32 }));
    await expectLoadError(dir, "model.layers.0.mlp.gate_proj.weight", "shape");
  });
});
