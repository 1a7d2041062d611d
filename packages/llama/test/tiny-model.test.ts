import { execFile } from "node:child_process";
import { promisify } from "node:util";
import { createHash } from "node:crypto";
import { mkdtempSync, readdirSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, describe, expect, it } from "vitest";
import { isAirmError } from "@airm/rm-core";
import { loadCheckpoint } from "../src/checkpoint/load-checkpoint.ts";
import { makeTinyModel } from "../src/tiny/make-tiny-model.ts";
import { trainByteLevelBpe, byteLevelWords } from "../src/tokenizer/byte-level-bpe.ts";
import { IncrementalDetokenizer } from "@airm/rm-core";
import { TRAINING_CORPUS } from "../src/tiny/training-corpus.ts";

const root = mkdtempSync(join(tmpdir(), "llama-tiny-"));
afterAll(() => rmSync(root, { recursive: true, force: true }));
const bin = new URL("../bin/airm-model.mjs", import.meta.url).pathname;

function folderBytes(dir: string): Map<string, Buffer> {
  return new Map(
    readdirSync(dir)
      .sort()
      .map((f) => [f, readFileSync(join(dir, f))]),
  );
}

describe("airm-model make-tiny", () => {
  it("writes byte-identical folders for the same flags (CLI, twice) and different ones for another seed", async () => {
    const a = join(root, "a");
    const b = join(root, "b");
    const c = join(root, "c");
    const run = promisify(execFile);
    await Promise.all([
      run(process.execPath, [bin, "make-tiny", "--arch", "llama", "--out", a]),
      run(process.execPath, [bin, "make-tiny", "--arch", "llama", "--out", b]),
      run(process.execPath, [bin, "make-tiny", "--arch", "llama", "--out", c, "--seed", "7"]),
    ]);
    const fa = folderBytes(a);
    const fb = folderBytes(b);
    expect([...fa.keys()]).toEqual(["config.json", "generation_config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"]);
    for (const [name, bytes] of fa) expect(bytes.equals(fb.get(name)!), name).toBe(true);
    // Pinned: the generator's output must not depend on the platform or Node version. A deliberate
    // change to the corpus, the PRNG or the file layout updates these (and the model's golden tokens).
    const sha = (name: string) => createHash("sha256").update(fa.get(name)!).digest("hex");
    expect(sha("model.safetensors")).toBe("81488f2d15c410a91b86816f3b2e501993c8f6a0e3fc91cf32642dd6c3250072");
    expect(sha("tokenizer.json")).toBe("ee770dfc23a8ebdd883a6474d304a6d738b43ab499c2ac37787fd4d3a82e2fe3");
    const fc = folderBytes(c);
    expect(fc.get("model.safetensors")!.equals(fa.get("model.safetensors")!)).toBe(false);
    expect(fc.get("tokenizer.json")!.equals(fa.get("tokenizer.json")!)).toBe(true);
  });

  it("prints help describing every option, and rejects bad flags with exit code 2", async () => {
    const run = promisify(execFile);
    const [help, bad] = await Promise.all([
      run(process.execPath, [bin, "make-tiny", "--help"], { encoding: "utf8" }),
      run(process.execPath, [bin, "make-tiny", "--arch", "gpt", "--out", join(root, "x")], { encoding: "utf8" }).then(
        () => ({ code: 0, stderr: "" }),
        (e: { code: number; stderr: string }) => ({ code: e.code, stderr: e.stderr }),
      ),
    ]);
    for (const flag of [
      "--arch",
      "--out",
      "--preset",
      "--layers",
      "--hidden",
      "--heads",
      "--kv-heads",
      "--intermediate",
      "--vocab",
      "--seed",
      "--shards",
      "--dtype",
      "--tie-embeddings",
      "--max-position",
    ])
      expect(help.stdout).toContain(flag);
    expect(bad.code).toBe(2);
    expect(bad.stderr).toContain("--arch");
  });

  it("loads both architectures and round-trips the tokenizer", async () => {
    for (const arch of ["llama", "qwen2"] as const) {
      const dir = join(root, `load-${arch}`);
      makeTinyModel({ arch, out: dir, shards: arch === "qwen2" ? 3 : 1 });
      const ck = await loadCheckpoint(dir);
      try {
        expect(ck.config).toMatchObject({
          architecture: arch,
          numLayers: 2,
          hiddenSize: 64,
          numHeads: 4,
          numKvHeads: 2,
          headDim: 16,
          intermediateSize: 128,
          vocabSize: 512,
          tieWordEmbeddings: arch === "qwen2",
          attentionBias: arch === "qwen2",
          bosTokenId: 1,
          eosTokenIds: [2],
        });
        expect(ck.generation.eosTokenIds).toEqual([2, 0]);
        expect(ck.tokenizer.vocabSize).toBe(512);
        if (arch === "qwen2") {
          expect(readdirSync(dir).filter((f) => f.endsWith(".safetensors"))).toHaveLength(3);
          expect(ck.tensors.has("model.layers.0.self_attn.k_proj.bias")).toBe(true);
        }
        for (const text of ["The capital of France is Paris.", "안녕하세요 🙂 hello there", "<|im_start|>user\nHi!<|im_end|>\n", "Ünïcödé – ok 12345"]) {
          const ids = ck.tokenizer.encode(text);
          expect(ck.tokenizer.decode(ids)).toBe(text);
          const d = new IncrementalDetokenizer(ck.tokenizer);
          const pieces = ids.map((id) => d.push(id));
          pieces.push(d.flush());
          expect(pieces.join("")).toBe(text);
          for (const p of pieces) expect(p).not.toContain("\uFFFD");
        }
        // merges compress common English: fewer tokens than bytes
        const english = "The capital of France is Paris.";
        expect(ck.tokenizer.encode(english).length).toBeLessThan(Buffer.byteLength(english) / 2);
        const chat = ck.renderChat!([{ role: "user", content: "Hi" }], { addGenerationPrompt: true });
        expect(chat).toBe("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
        expect(ck.tokenizer.encode(chat).filter((id) => id === 1)).toHaveLength(2);
        // weights: norms are exactly 1.0, linear weights spread around 0 with about 1/sqrt(in) std
        const norm = new Uint16Array(64);
        ck.tensors.readBf16("model.norm.weight", norm);
        expect([...new Set(norm)]).toEqual([0x3f80]);
        const q = new Uint16Array(64 * 64);
        ck.tensors.readBf16("model.layers.0.self_attn.q_proj.weight", q);
        const f = new Float32Array(new Uint32Array(Array.from(q, (b) => b << 16)).buffer);
        const mean = f.reduce((a, v) => a + v, 0) / f.length;
        const std = Math.sqrt(f.reduce((a, v) => a + (v - mean) ** 2, 0) / f.length);
        expect(Math.abs(mean)).toBeLessThan(0.01);
        expect(std).toBeGreaterThan(0.1);
        expect(std).toBeLessThan(0.15);
      } finally {
        ck.tensors.close();
      }
    }
  });

  it("qwen3: head_dim twice hidden / heads, per-head q/k norms of 1 + noise, no biases, Qwen3's chat template", async () => {
    const dir = join(root, "load-qwen3");
    makeTinyModel({ arch: "qwen3", out: dir });
    const ck = await loadCheckpoint(dir);
    try {
      expect(ck.config).toMatchObject({
        architecture: "qwen3",
        hiddenSize: 64,
        numHeads: 4,
        numKvHeads: 2,
        headDim: 32,
        tieWordEmbeddings: true,
        attentionBias: false,
        ropeTheta: 1e6,
      });
      expect(ck.configDefaults).toEqual([]);
      expect(ck.tensors.info("model.layers.1.self_attn.q_proj.weight").shape).toEqual([128, 64]);
      expect(ck.tensors.info("model.layers.1.self_attn.k_norm.weight").shape).toEqual([32]);
      expect(ck.tensors.has("model.layers.0.self_attn.q_proj.bias")).toBe(false);
      const qn = new Uint16Array(32);
      const kn = new Uint16Array(32);
      ck.tensors.readBf16("model.layers.0.self_attn.q_norm.weight", qn);
      ck.tensors.readBf16("model.layers.0.self_attn.k_norm.weight", kn);
      const values = (b: Uint16Array) => Array.from(b, (x) => new Float32Array(new Uint32Array([x << 16]).buffer)[0]);
      const mean = values(qn).reduce((a, v) => a + v, 0) / 32;
      expect(Math.abs(mean - 1)).toBeLessThan(0.15);
      expect(new Set(values(qn)).size).toBeGreaterThan(8);
      expect(Buffer.from(qn.buffer).equals(Buffer.from(kn.buffer))).toBe(false);
      // Qwen3's template: the reasoning of an earlier turn is dropped, tools go into the system turn
      const turns = [
        { role: "user" as const, content: "Hi" },
        { role: "assistant" as const, content: "<think>\nhmm\n</think>\n\nHello" },
        { role: "user" as const, content: "Capital of France?" },
      ];
      expect(ck.renderChat!(turns, { addGenerationPrompt: true })).toBe(
        "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello<|im_end|>\n<|im_start|>user\nCapital of France?<|im_end|>\n<|im_start|>assistant\n",
      );
      const withTools = ck.renderChat!([{ role: "user", content: "Weather?" }], { addGenerationPrompt: true, tools: [{ name: "get", parameters: { type: "object" } }] });
      expect(withTools).toContain('<tools>\n{"type": "function", "function": {"name": "get", "parameters": {"type": "object"}}}\n</tools>');
    } finally {
      ck.tensors.close();
    }
  });

  it("the f32 dtype stores the same values (same bf16 after loading)", async () => {
    const a = join(root, "dt-bf16");
    const b = join(root, "dt-f32");
    makeTinyModel({ arch: "llama", out: a, layers: 1 });
    makeTinyModel({ arch: "llama", out: b, layers: 1, dtype: "f32", shards: 2 });
    const ca = await loadCheckpoint(a);
    const cb = await loadCheckpoint(b);
    try {
      for (const t of ca.tensors.list()) {
        const n = t.shape.reduce((x, y) => x * y, 1);
        const x = new Uint16Array(n);
        const y = new Uint16Array(n);
        ca.tensors.readBf16(t.name, x);
        cb.tensors.readBf16(t.name, y);
        expect(Buffer.from(x.buffer).equals(Buffer.from(y.buffer)), t.name).toBe(true);
      }
    } finally {
      ca.tensors.close();
      cb.tensors.close();
    }
  });

  it("regenerating into a folder with more shards leaves no stale files", () => {
    const dir = join(root, "regen");
    makeTinyModel({ arch: "llama", out: dir, shards: 4 });
    makeTinyModel({ arch: "llama", out: dir, shards: 2 });
    expect(
      readdirSync(dir)
        .filter((f) => f.endsWith(".safetensors"))
        .sort(),
    ).toEqual(["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]);
  });

  it("--preset 135m has SmolLM2-135M's shape and a full 49152-token vocabulary", async () => {
    const dir = join(root, "preset");
    makeTinyModel({ arch: "llama", out: dir, preset: "135m", layers: 1 });
    const ck = await loadCheckpoint(dir);
    try {
      expect(ck.config).toMatchObject({
        numLayers: 1,
        hiddenSize: 576,
        numHeads: 9,
        numKvHeads: 3,
        headDim: 64,
        intermediateSize: 1536,
        vocabSize: 49152,
        tieWordEmbeddings: true,
        ropeTheta: 100000,
        maxPositionEmbeddings: 8192,
      });
      expect(ck.tokenizer.vocabSize).toBe(49152);
      const high = [40000, 45000, 49151];
      for (const id of high) expect(ck.tokenizer.idToToken(id)).toBeDefined();
      expect(ck.tokenizer.decode(high)).not.toContain("\uFFFD");
      expect(ck.tensors.info("model.embed_tokens.weight").shape).toEqual([49152, 576]);
    } finally {
      ck.tensors.close();
    }
  });

  it("rejects shapes that do not fit together with a ConfigError", () => {
    const bad = [{ heads: 3 }, { kvHeads: 3 }, { vocab: 100 }, { shards: 0 }];
    for (const opt of bad) {
      let err: unknown;
      try {
        makeTinyModel({ arch: "llama", out: join(root, "bad"), ...opt });
      } catch (e) {
        err = e;
      }
      expect(isAirmError(err, "CONFIG"), JSON.stringify(opt)).toBe(true);
    }
  });
});

describe("byte-level BPE training", () => {
  it("is deterministic, learns frequent words first and fills big vocabularies", () => {
    const a = trainByteLevelBpe(TRAINING_CORPUS, { vocabSize: 600, specialTokens: ["<s>"] });
    const b = trainByteLevelBpe(TRAINING_CORPUS, { vocabSize: 600, specialTokens: ["<s>"] });
    expect(a).toEqual(b);
    expect(a.vocab).toHaveLength(600);
    expect(a.vocab.slice(0, 1)).toEqual(["<s>"]);
    expect(a.vocab).toContain("Ġthe");
    expect(new Set(a.vocab).size).toBe(600);
    const big = trainByteLevelBpe(TRAINING_CORPUS, { vocabSize: 49152, specialTokens: ["<s>"] });
    expect(big.vocab).toHaveLength(49152);
    expect(new Set(big.vocab).size).toBe(49152);
    expect(big.mergedCount).toBeLessThan(2000);
  });
  it("splits words like GPT-2", () => {
    expect(byteLevelWords("Hello world's  end")).toEqual(["Hello", "Ġworld", "'s", "Ġ", "Ġend"]);
  });
});
