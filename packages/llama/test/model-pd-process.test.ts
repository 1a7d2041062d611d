// (a) Prefill in one real child process, KV bytes through a file, decode in another real child:
// the tokens equal those of one process doing both.
import { execFileSync } from "node:child_process";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { loadCheckpoint } from "../src/checkpoint/load-checkpoint.ts";
import { LlamaModel, type WeightsMode } from "../src/model/llama-model.ts";
import { generate } from "../src/model/generate.ts";
import type { SamplingParams } from "../src/sampling/sample.ts";
import { randomCheckpoint, tinyConfig } from "./model-helpers/random-checkpoint.ts";
import { generateModels, type GeneratedModels } from "./model-helpers/generated-models.ts";

const child = fileURLToPath(new URL("./model-helpers/pd-child.ts", import.meta.url));
const dir = mkdtempSync(join(tmpdir(), "llama-pd-"));
let gen: GeneratedModels;
beforeAll(() => {
  gen = generateModels();
});
afterAll(() => {
  rmSync(dir, { recursive: true, force: true });
  gen?.cleanup();
});

function run(job: object): { pid: number; first?: number; tokens?: number[] } {
  const out = execFileSync(process.execPath, ["--import", "tsx", child, JSON.stringify(job)], { encoding: "utf8", timeout: 60_000 });
  return JSON.parse(out.trim().split("\n").at(-1)!);
}

const cases: [string, ReturnType<typeof tinyConfig>, SamplingParams, WeightsMode][] = [
  ["llama greedy", tinyConfig(), {}, "auto"],
  ["qwen2 greedy", tinyConfig({ architecture: "qwen2", attentionBias: true, tieWordEmbeddings: true }), {}, "auto"],
  ["llama sampled (temperature, top-p, top-k, seed)", tinyConfig(), { temperature: 0.9, topP: 0.95, topK: 40, seed: 1234 }, "auto"],
  ["llama greedy, q4_1 weights (integer kernels)", tinyConfig({ intermediateSize: 160 }), {}, "q4_1"],
  ["qwen2 sampled, q8_0 weights (integer kernels)", tinyConfig({ architecture: "qwen2", attentionBias: true, tieWordEmbeddings: true }), { temperature: 0.8, seed: 99 }, "q8_0"],
];

describe("(a) prefill in process A, decode in process B", () => {
  it.each(cases)("%s: gives exactly the solo tokens", async (_name, config, sampling, weights) => {
    const prompt = [1, 17, 33, 250, 8, 8, 91, 140, 3, 66, 12];
    const S = 40,
      maxTokens = 16,
      seed = 21;
    const model = await LlamaModel.load(randomCheckpoint(config, seed), { weights });
    if (weights !== "auto") expect(model.weightKinds.q4 + model.weightKinds.q4a8 + model.weightKinds.q8).toBeGreaterThan(0);
    const solo = generate(model, prompt, { maxTokens, S, sampling }).tokens;
    model.close();
    const file = join(dir, `kv-${Math.random().toString(16).slice(2)}.bin`);
    const common = { config, seed, prompt, S, maxTokens, sampling, file, weights };
    const a = run({ ...common, mode: "prefill" });
    const b = run({ ...common, mode: "decode" });
    expect(a.pid).not.toBe(b.pid);
    expect(a.pid).not.toBe(process.pid);
    expect(b.tokens).toEqual(solo);
    expect(b.tokens![0]).toBe(a.first);
    expect(solo).toHaveLength(maxTokens);
  });
});

describe("(a) a sliding-window model across processes", () => {
  it("gemma3, a window of 6 positions on layers 0 and 2 (blocks out of the window leave, export zeros them): decode in process B gives the solo tokens", async () => {
    const config = tinyConfig({
      architecture: "gemma3",
      numLayers: 3,
      headDim: 32,
      tieWordEmbeddings: true,
      rmsNormEps: 1e-6,
      queryPreAttnScalar: 24,
      slidingWindow: { window: 6, layers: [true, false, true], ropeTheta: 10000 },
    });
    // 40 prompt positions in blocks of 16: block 0 has left the window at export, more leave while decoding
    const prompt = Array.from({ length: 40 }, (_, i) => (i * 29 + 3) % 250);
    const S = 80,
      maxTokens = 24,
      seed = 8;
    for (const sampling of [{}, { temperature: 0.8, seed: 5 }] as SamplingParams[]) {
      const model = await LlamaModel.load(randomCheckpoint(config, seed));
      const solo = generate(model, prompt, { maxTokens, S, sampling }).tokens;
      model.close();
      const file = join(dir, `kv-gemma-${Math.random().toString(16).slice(2)}.bin`);
      const common = { config, seed, prompt, S, maxTokens, sampling, file, weights: "auto" };
      run({ ...common, mode: "prefill" });
      const b = run({ ...common, mode: "decode" });
      expect(b.tokens).toEqual(solo);
    }
  });
});

describe("(a) on models made by airm-model make-tiny", () => {
  it.each([
    ["llama", {}],
    ["qwen2", {}],
    ["qwen2", { temperature: 0.7, topP: 0.9, seed: 77 }],
  ] as [string, SamplingParams][])("%s %j: decode in process B gives exactly the solo tokens", async (arch, sampling) => {
    const ckpt = await loadCheckpoint(gen.dirs[arch]);
    const prompt = ckpt.tokenizer.encode("The morning train left the station", { addSpecialTokens: true });
    const S = 64,
      maxTokens = 20;
    const model = await LlamaModel.load(ckpt);
    const solo = generate(model, prompt, { maxTokens, S, sampling }).tokens;
    model.close();
    const file = join(dir, `kv-${arch}-${Math.random().toString(16).slice(2)}.bin`);
    const common = { modelDir: gen.dirs[arch], prompt, S, maxTokens, sampling, file };
    const a = run({ ...common, mode: "prefill" });
    const b = run({ ...common, mode: "decode" });
    expect(a.pid).not.toBe(b.pid);
    expect(b.tokens).toEqual(solo);
    expect(solo).toHaveLength(maxTokens);
  });
});
