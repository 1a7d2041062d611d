// llama.cpp's GGUF LoRA files, without llama.cpp (lora-llamacpp.test.ts runs them in it): a PEFT
// folder and its peftToGguf conversion load with the same rank, scale, targets, layers and
// fingerprint and give the same logits bit for bit (Llama, whose q/k rows llama.cpp permutes;
// Qwen2 with biases; Gemma 3); the file holds what convert_lora_to_gguf.py writes (checked here
// against the PEFT tensors, with this test's own name table and q/k permutation); every refusal
// names the metadata key or the tensor; the registry reads a GGUF adapter again after eviction;
// and `airm-model lora-to-gguf` writes the same file.
import { mkdirSync, mkdtempSync, readFileSync, readSync, rmSync, truncateSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { ModelConfig } from "../src/checkpoint-types.ts";
import { bf16ToF32 } from "../src/checkpoint/bf16-convert.ts";
import { closeGguf, type GgufFile, openGguf } from "../src/checkpoint/gguf-file.ts";
import { loadCheckpoint } from "../src/checkpoint/load-checkpoint.ts";
import { LoraError } from "../src/lora/lora-error.ts";
import type { LoraHandle } from "../src/lora/lora-registry.ts";
import { ggufAlpha, peftToGguf } from "../src/lora/peft-to-gguf.ts";
import { LlamaModel } from "../src/model/llama-model.ts";
import { makeTinyModel } from "../src/tiny/make-tiny-model.ts";
import { main as airmModel } from "../src/tiny/airm-model-cli.ts";
import { makeTinyLora, type TinyLoraOptions } from "../src/tiny/make-tiny-lora.ts";
import { TYPE_IDS, f32, ggufBytes, type GgufTensor, type MetaValue, permuteForGguf, str } from "./fixtures/io/gguf-writer.ts";
import { storedTensors } from "./model-helpers/lora-adapters.ts";
import { randomCheckpoint, tinyConfig, tinyGemma3Config, tinyQwen2Config } from "./model-helpers/random-checkpoint.ts";

const fr = Math.fround;
const root = mkdtempSync(join(tmpdir(), "airm-lora-gguf-"));
afterAll(() => rmSync(root, { recursive: true, force: true }));

const CONFIGS: Record<string, ModelConfig> = {
  llama: tinyConfig(),
  qwen2: tinyQwen2Config(),
  gemma3: tinyGemma3Config(),
};

/** As lora-engine.test.ts: ranks 4, 8 (rsLoRA, BF16) and 3, different targets and layers. */
const ADAPTERS: Record<string, Omit<TinyLoraOptions, "out" | "model" | "baseModel">> = {
  qv: { r: 4, alpha: 8, targets: ["q_proj", "v_proj"], seed: 1 },
  all: { r: 8, alpha: 16, useRslora: true, targets: "all-linear", dtype: "bf16", seed: 2 },
  late: { r: 3, alpha: 4, targets: ["o_proj", "gate_proj", "up_proj", "down_proj"], layers: [1], seed: 3 },
};

const prompt = [1, 40, 41, 42, 99, 7, 250, 13, 13, 64, 200, 5, 77, 31, 18, 260, 3];
const bits = (x: Float32Array) => Buffer.from(x.buffer, x.byteOffset, x.byteLength);

/** The PEFT folder of adapter `a` for `arch` and its GGUF conversion (under a folder named `tag`). */
function writeBoth(arch: string, a: string, tag = arch): { dir: string; gguf: string } {
  const dir = join(root, tag, a);
  makeTinyLora({ ...ADAPTERS[a], out: dir, model: CONFIGS[arch], baseModel: `random-${arch}-3` });
  const gguf = `${dir}.gguf`;
  peftToGguf(dir, gguf, CONFIGS[arch]);
  return { dir, gguf };
}

/** Logits of the prompt's prefill, then of three decode steps, on `lora`. */
function run(m: LlamaModel, lora: LoraHandle | undefined): Buffer[] {
  const cache = m.newCache(prompt.length + 3);
  const out = [bits(m.prefill(prompt, cache, { lora }))];
  for (let s = 0; s < 3; s++) out.push(bits(m.decode([{ cache, token: 5 + s, lora }])[0]));
  m.freeCache(cache);
  return out;
}

describe.each(Object.keys(CONFIGS))("%s: a PEFT folder and its GGUF conversion", (arch) => {
  let m: LlamaModel;
  const files: Record<string, { dir: string; gguf: string }> = {};
  beforeAll(async () => {
    m = await LlamaModel.load(randomCheckpoint(CONFIGS[arch], 3), { lora: { maxLoras: 6 } });
    for (const a of Object.keys(ADAPTERS)) files[a] = writeBoth(arch, a);
  });
  afterAll(() => m.close());

  it.each(Object.keys(ADAPTERS))("adapter %s: same rank, scale, targets, layers and fingerprint; the same logits bit for bit, which the adapter moves", (a) => {
    const peft = m.loadLora(`${a}-peft`, files[a].dir);
    const gguf = m.loadLora(`${a}-gguf`, files[a].gguf);
    try {
      expect(gguf.folder).toBe(files[a].gguf);
      for (const key of ["rank", "scale", "targets", "layers", "fingerprint"] as const) expect(gguf[key], key).toEqual(peft[key]);
      const want = run(m, peft);
      const got = run(m, gguf);
      got.forEach((l, i) => expect(l.equals(want[i]), `logits ${i}`).toBe(true));
      const base = run(m, undefined);
      expect(want.every((l, i) => !l.equals(base[i]))).toBe(true);
    } finally {
      m.unloadLora(peft);
      m.unloadLora(gguf);
    }
  });
});

/** PEFT projection -> llama.cpp tensor, written out here (not taken from src/lora). */
const GGUF_PART: Record<string, string> = {
  "self_attn.q_proj": "attn_q",
  "self_attn.k_proj": "attn_k",
  "self_attn.v_proj": "attn_v",
  "self_attn.o_proj": "attn_output",
  "mlp.gate_proj": "ffn_gate",
  "mlp.up_proj": "ffn_up",
  "mlp.down_proj": "ffn_down",
};

/** The GGUF name of a PEFT LoRA tensor name. */
function ggufNameOf(peft: string): string {
  const m = /^base_model\.model\.model\.layers\.(\d+)\.(\w+\.\w+)\.lora_([AB])\.weight$/.exec(peft);
  if (!m) throw new Error(`not a PEFT LoRA name: ${peft}`);
  return `blk.${m[1]}.${GGUF_PART[m[2]!]}.weight.lora_${m[3]!.toLowerCase()}`;
}

/** A stored tensor's values as f32. */
function valuesOf(t: ReturnType<typeof storedTensors>[number]): Float32Array {
  const b = t.bytes();
  const view = new DataView(b.buffer, b.byteOffset, b.byteLength);
  const n = t.shape.reduce((x, y) => x * y, 1);
  return Float32Array.from({ length: n }, (_, i) => (t.dtype === "F32" ? view.getFloat32(i * 4, true) : bf16ToF32(view.getUint16(i * 2, true))));
}

/** A GGUF tensor's data as f32. */
function ggufValues(f: GgufFile, name: string): Float32Array {
  const t = f.tensors.find((x) => x.name === name)!;
  const b = Buffer.alloc(t.byteLength);
  readSync(f.fd, b, 0, t.byteLength, t.start);
  return new Float32Array(b.buffer, b.byteOffset, t.byteLength / 4);
}

describe.each(["llama", "qwen2"])("%s: the GGUF file holds what llama.cpp's converter writes", (arch) => {
  it.each(Object.keys(ADAPTERS))("adapter %s: metadata, names, GGUF dims, F32 values, q/k rows of B permuted for llama only", (a) => {
    const c = CONFIGS[arch];
    const { dir, gguf } = writeBoth(arch, a, `${arch}-file`);
    const peft = storedTensors(dir);
    const o = ADAPTERS[a];
    const f = openGguf(gguf);
    try {
      expect(f.metadata.get("general.type")).toBe("adapter");
      expect(f.metadata.get("general.architecture")).toBe(arch);
      expect(f.metadata.get("adapter.type")).toBe("lora");
      const alpha = f.metadata.get("adapter.lora.alpha") as number;
      const scale = fr(o.useRslora ? o.alpha! / Math.sqrt(o.r) : o.alpha! / o.r);
      expect(fr(alpha / o.r)).toBe(scale);
      if (!o.useRslora) expect(alpha).toBe(o.alpha);
      expect(f.tensors.map((t) => t.name).sort()).toEqual(peft.map((t) => ggufNameOf(t.name)).sort());
      for (const t of peft) {
        const g = f.tensors.find((x) => x.name === ggufNameOf(t.name))!;
        expect(g.typeId).toBe(TYPE_IDS.F32);
        expect(g.dims).toEqual([...t.shape].reverse());
        let want = valuesOf(t);
        const heads = arch !== "llama" || !t.name.endsWith("lora_B.weight") ? 0 : t.name.includes("q_proj") ? c.numHeads : t.name.includes("k_proj") ? c.numKvHeads : 0;
        if (heads) want = permuteForGguf(want, t.shape[0]!, t.shape[1]!, heads);
        expect(bits(ggufValues(f, g.name)).equals(bits(want)), g.name).toBe(true);
      }
    } finally {
      closeGguf(f);
    }
  });
});

it("ggufAlpha: the f32 alpha whose f32 alpha / r is the scale (lora_alpha itself when it is an f32, without rsLoRA), else one f32 step off; a zero scale names lora_alpha", () => {
  let inexact = 0;
  for (const r of [1, 2, 3, 7, 8, 16, 48, 64]) {
    for (const alpha of [1, 0.1, 16, 32, 5.5, 1e-3, -8]) {
      for (const [scale, hint] of [
        [fr(alpha / r), alpha],
        [fr(alpha / Math.sqrt(r)), undefined],
      ]) {
        const got = ggufAlpha(scale!, r, "x", hint);
        const off = Math.abs(fr(got.alpha / r) - scale!);
        expect(got.exact).toBe(off === 0);
        expect(off).toBeLessThanOrEqual(Math.abs(scale!) * 2 ** -23);
        if (hint !== undefined && fr(alpha) === alpha) expect([got.alpha, got.exact]).toEqual([alpha, true]);
        if (!got.exact) inexact++;
      }
    }
  }
  console.log(`scales no f32 alpha gives exactly: ${inexact} of 112`);
  expect(inexact).toBeGreaterThan(0);
  expect(() => ggufAlpha(0, 8, "x")).toThrow(expect.objectContaining({ field: "lora_alpha" }));
});

describe("a GGUF adapter refused, naming the metadata key or the tensor", () => {
  const config = CONFIGS.llama;
  let model: LlamaModel;
  let good: { metadata: Record<string, MetaValue>; tensors: GgufTensor[] };
  let count = 0;
  beforeAll(async () => {
    model = await LlamaModel.load(randomCheckpoint(config, 3), { lora: { maxLoraRank: 6 } });
    const { gguf } = writeBoth("llama", "qv", "refusals");
    const f = openGguf(gguf);
    const tensors = f.tensors.map((t) => ({ name: t.name, dims: t.dims, typeId: t.typeId, data: new Uint8Array(ggufValues(f, t.name).slice().buffer) }));
    closeGguf(f);
    good = {
      metadata: { "general.architecture": str("llama"), "general.type": str("adapter"), "adapter.type": str("lora"), "adapter.lora.alpha": f32(8) },
      tensors,
    };
  });
  afterAll(() => model.close());

  /** A file of `good` with metadata and tensors edited. */
  function variant(meta: Record<string, MetaValue | undefined> = {}, edit: (ts: GgufTensor[]) => GgufTensor[] = (ts) => ts): string {
    const metadata = Object.fromEntries(Object.entries({ ...good.metadata, ...meta }).filter(([, v]) => v !== undefined)) as Record<string, MetaValue>;
    const path = join(root, `variant-${count++}.gguf`);
    writeFileSync(path, ggufBytes({ metadata, tensors: edit(good.tensors.map((t) => ({ ...t }))) }));
    return path;
  }

  function refusal(path: string): LoraError {
    try {
      model.loadLora(`bad${count++}`, path);
    } catch (e) {
      expect(e).toBeInstanceOf(LoraError);
      return e as LoraError;
    }
    throw new Error(`${path} loaded`);
  }

  const Q_A = "blk.0.attn_q.weight.lora_a";
  const Q_B = "blk.0.attn_q.weight.lora_b";
  const f32Tensor = (name: string, dims: number[], fill = 0.01): GgufTensor => ({
    name,
    dims,
    typeId: TYPE_IDS.F32,
    data: new Uint8Array(new Float32Array(dims[0]! * dims[1]!).fill(fill).buffer),
  });

  it("accepts the file, and without adapter.lora.alpha runs at scale 1 (llama.cpp's rule)", () => {
    const h = model.loadLora(`ok${count++}`, variant());
    expect([h.rank, h.scale]).toEqual([4, 2]);
    const h1 = model.loadLora(`ok${count++}`, variant({ "adapter.lora.alpha": undefined }));
    expect(h1.scale).toBe(1);
    expect(h1.fingerprint).not.toBe(h.fingerprint);
  });

  it.each([
    ["general.type", { "general.type": str("model") }],
    ["general.type", { "general.type": undefined }],
    ["general.architecture", { "general.architecture": str("qwen2") }],
    ["adapter.type", { "adapter.type": str("control_vector") }],
    ["adapter.alora.invocation_tokens", { "adapter.alora.invocation_tokens": { type: "arr", elem: "u32", value: [5, 6] } as MetaValue }],
    ["adapter.lora.alpha", { "adapter.lora.alpha": str("eight") }],
  ] as [string, Record<string, MetaValue | undefined>][])("metadata: %s", (field, meta) => {
    const e = refusal(variant(meta));
    expect(e.field).toBe(field);
    expect(e.message).toContain(field);
  });

  it("a rank over maxLoraRank names r", () => {
    const { gguf } = writeBoth("llama", "all", "refusals");
    const e = refusal(gguf);
    expect(e.field).toBe("r");
    expect(e.message).toMatch(/rank 8 .* limit of 6/);
  });

  it.each([
    ["half a pair", Q_B, (ts: GgufTensor[]) => ts.filter((t) => t.name !== Q_B)],
    ["wrong dims", Q_A, (ts: GgufTensor[]) => ts.map((t) => (t.name === Q_A ? f32Tensor(Q_A, [32, 4]) : t))],
    ["another rank", Q_B, (ts: GgufTensor[]) => ts.map((t) => (t.name === Q_B ? f32Tensor(Q_B, [2, 64]) : t))],
    ["a quantised type", Q_A, (ts: GgufTensor[]) => ts.map((t) => (t.name === Q_A ? { ...t, typeId: TYPE_IDS.Q8_0, data: new Uint8Array((64 * 4 * 34) / 32) } : t))],
    ["a norm", "blk.0.attn_norm.weight", (ts: GgufTensor[]) => [...ts, { name: "blk.0.attn_norm.weight", dims: [64], typeId: TYPE_IDS.F32, data: new Uint8Array(256) }]],
    ["the embeddings", "token_embd.weight.lora_a", (ts: GgufTensor[]) => [...ts, f32Tensor("token_embd.weight.lora_a", [4, 512])]],
    ["a layer the model lacks", "blk.9.attn_q.weight.lora_a", (ts: GgufTensor[]) => [...ts, f32Tensor("blk.9.attn_q.weight.lora_a", [64, 4])]],
    ["a NaN", Q_A, (ts: GgufTensor[]) => ts.map((t) => (t.name === Q_A ? f32Tensor(Q_A, [64, 4], Number.NaN) : t))],
  ] as [string, string, (ts: GgufTensor[]) => GgufTensor[]][])("tensor: %s names %s", (_what, tensor, edit) => {
    const e = refusal(variant({}, edit));
    expect(e.tensor).toBe(tensor);
    expect(e.message).toContain(tensor);
  });

  it("a truncated file, a file that is no GGUF and a path that does not exist are LoraErrors naming the file", () => {
    const cut = variant();
    truncateSync(cut, 900);
    expect(refusal(cut).message).toContain(cut);
    const text = join(root, "adapter.txt");
    writeFileSync(text, "not an adapter");
    expect(refusal(text).message).toMatch(/not a GGUF file/);
    expect(refusal(join(root, "nowhere")).message).toMatch(/does not exist/);
  });
});

describe("the registry and GGUF adapters", () => {
  it("reads an evicted GGUF adapter again with the same bits, and refuses one changed on disk", async () => {
    const m = await LlamaModel.load(randomCheckpoint(CONFIGS.llama, 3), { lora: { maxLoras: 1 } });
    try {
      const a = writeBoth("llama", "qv", "registry");
      const b = writeBoth("llama", "late", "registry");
      const ha = m.loadLora("a", a.gguf);
      const first = run(m, ha);
      const hb = m.loadLora("b", b.gguf);
      expect(m.loraResident(ha)).toBe(false);
      run(m, ha).forEach((l, i) => expect(l.equals(first[i])).toBe(true));
      expect(m.loraResident(hb)).toBe(false);
      peftToGguf(a.dir, b.gguf, CONFIGS.llama);
      expect(() => run(m, hb)).toThrow(/changed on disk/);
    } finally {
      m.close();
    }
  });
});

describe("airm-model lora-to-gguf", () => {
  it("writes peftToGguf's file, taking the base model from --base or base_model_name_or_path; without a base it is a usage error", async () => {
    const hf = join(root, "cli", "base");
    makeTinyModel({ arch: "llama", out: hf, layers: 2, hidden: 64, heads: 4, kvHeads: 2, vocab: 400 });
    const base = await loadCheckpoint(hf);
    base.tensors.close();
    const tiny = base.config;
    const dir = join(root, "cli", "adapter");
    makeTinyLora({ ...ADAPTERS.all, out: dir, model: tiny, baseModel: hf });
    const want = join(root, "cli", "want.gguf");
    peftToGguf(dir, want, tiny);
    for (const extra of [[], ["--base", hf]]) {
      const out = join(root, "cli", `out${extra.length}.gguf`);
      expect(await airmModel(["lora-to-gguf", dir, out, ...extra])).toBe(0);
      expect(readFileSync(out).equals(readFileSync(want))).toBe(true);
    }
    const elsewhere = join(root, "cli", "elsewhere");
    mkdirSync(elsewhere, { recursive: true });
    makeTinyLora({ ...ADAPTERS.all, out: elsewhere, model: tiny, baseModel: "org/not-here" });
    expect(await airmModel(["lora-to-gguf", elsewhere, join(root, "cli", "x.gguf")])).toBe(2);
  });
});
