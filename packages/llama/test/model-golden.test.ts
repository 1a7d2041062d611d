// Golden greedy token ids for a few prompts on models made by `airm-model make-tiny` (every
// architecture). A change of kernels, numerics, generator or tokenizer shows up here.
// Regenerate deliberately with AIRM_UPDATE_GOLDENS=1 and review the diff.
import { existsSync, readFileSync, writeFileSync } from "node:fs";
import { fileURLToPath } from "node:url";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { loadCheckpoint } from "../src/checkpoint/load-checkpoint.ts";
import { LlamaModel } from "../src/model/llama-model.ts";
import { generate } from "../src/model/generate.ts";
import { GOLDEN_MODELS, generateModels, type GeneratedModels } from "./model-helpers/generated-models.ts";

const goldenFile = fileURLToPath(new URL("./fixtures/model/greedy-goldens.json", import.meta.url));
const update = process.env.AIRM_UPDATE_GOLDENS === "1";

const PROMPTS = ["The morning train", "Hello, world! 123", "a b c d e f g h i j k l m n o p"];
const CHAT = [{ role: "user", content: "What is the capital of France?" }];
const MAX_TOKENS = 24;

interface GoldenCase {
  prompt: string;
  promptIds: number[];
  greedy: number[];
}
interface Goldens {
  maxTokens: number;
  models: Record<string, { flags: string[]; cases: GoldenCase[] }>;
}

let gen: GeneratedModels;
const actual: Goldens = { maxTokens: MAX_TOKENS, models: {} };
beforeAll(() => {
  gen = generateModels();
});
afterAll(() => {
  gen?.cleanup();
  if (update) {
    // one line per id list keeps diffs readable
    const text = JSON.stringify(actual, null, 1).replace(/\[\s+([-\d,\s]+?)\s+\]/g, (_m, inner: string) => `[${inner.split(/,\s*/).join(", ")}]`);
    writeFileSync(goldenFile, `${text}\n`);
  }
});

describe.each(Object.keys(GOLDEN_MODELS))("%s tiny model", (arch) => {
  it("generates the committed greedy tokens for each prompt, with 1 and 2 threads", async () => {
    const ckpt = await loadCheckpoint(gen.dirs[arch]);
    const m1 = await LlamaModel.load(ckpt);
    const m2 = await LlamaModel.load(ckpt, { threads: 2 });
    const cases: GoldenCase[] = [];
    try {
      const texts = [...PROMPTS, ...(ckpt.renderChat ? [ckpt.renderChat(CHAT, { addGenerationPrompt: true })] : [])];
      for (const text of texts) {
        const promptIds = ckpt.tokenizer.encode(text, { addSpecialTokens: true });
        const greedy = generate(m1, promptIds, { maxTokens: MAX_TOKENS }).tokens;
        expect(generate(m2, promptIds, { maxTokens: MAX_TOKENS }).tokens).toEqual(greedy);
        expect(generate(m1, promptIds, { maxTokens: MAX_TOKENS, chunkSize: 3 }).tokens).toEqual(greedy);
        cases.push({ prompt: text, promptIds, greedy });
      }
    } finally {
      m1.close();
      m2.close();
    }
    actual.models[arch] = { flags: GOLDEN_MODELS[arch], cases };
    if (update) return;
    expect(existsSync(goldenFile), `${goldenFile} is missing; create it with AIRM_UPDATE_GOLDENS=1`).toBe(true);
    const golden = JSON.parse(readFileSync(goldenFile, "utf8")) as Goldens;
    expect(golden.maxTokens).toBe(MAX_TOKENS);
    expect(golden.models[arch].flags).toEqual(GOLDEN_MODELS[arch]);
    expect(cases).toEqual(golden.models[arch].cases);
    // the goldens are not degenerate: across prompts the model produces many different ids (the
    // tiny Gemma 3 repeats itself more: 9 different ids over its four continuations)
    expect(new Set(cases.flatMap((c) => c.greedy)).size).toBeGreaterThan(arch === "gemma3" ? 7 : 10);
  });
});
