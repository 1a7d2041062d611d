// The real Gemma 3 270M (Q4_K_M GGUF, `airm model pull gemma-3-270m`), when it is in the model
// cache: its config as llama.cpp reads it, SentencePiece tokenization equal to llama.cpp's, no chat
// template (chat is refused by the worker, naming the model), and teacher-forced next tokens against
// llama.cpp over a text longer than the 512-position window. Skipped, saying why, without the file.
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { Checkpoint } from "../src/checkpoint-types.ts";
import { loadCheckpoint } from "../src/checkpoint/load-checkpoint.ts";
import { listModels } from "../src/model-cache/model-cache.ts";
import { LlamaModel } from "../src/model/llama-model.ts";
import { argmax } from "../src/sampling/sample.ts";
import { type LlamaCpp, llamaCppTeacherForced, openLlamaCpp } from "./fixtures/parity/llamacpp-reference.ts";
import { parityText, teacherForcedLogits } from "./fixtures/parity/parity-model.ts";

const cached = listModels().find((m) => m.name === "gemma-3-270m");
if (!cached) console.warn("gemma3-real skipped: gemma-3-270m is not in the model cache (airm model pull gemma-3-270m)");

/** A disagreement on the argmax counts as a near tie when llama.cpp ranks our token within this of its top. */
const NEAR_TIE = 0.5;

describe.skipIf(!cached)(`Gemma 3 270M Q4_K_M (${cached?.path ?? "not cached"})`, () => {
  let ck: Checkpoint;
  let cpp: LlamaCpp;

  beforeAll(async () => {
    ck = await loadCheckpoint(cached!.path);
    cpp = await openLlamaCpp(cached!.path);
  }, 120_000);
  afterAll(async () => {
    ck?.tensors.close();
    await cpp?.model.dispose();
    await cpp?.llama.dispose();
  });

  it("reads Gemma 3's shape: 18 layers, every sixth global, window 512, bases 1e6 / 1e4, scale 1/sqrt(256), tied", () => {
    expect(ck.config).toMatchObject({
      architecture: "gemma3",
      numLayers: 18,
      hiddenSize: 640,
      numHeads: 4,
      numKvHeads: 1,
      headDim: 256,
      vocabSize: 262144,
      ropeTheta: 1e6,
      queryPreAttnScalar: 256,
      tieWordEmbeddings: true,
      bosTokenId: 2,
    });
    expect(ck.config.slidingWindow).toEqual({ window: 512, ropeTheta: 10000, layers: Array.from({ length: 18 }, (_, i) => (i + 1) % 6 !== 0) });
    // the base model has no chat template: the worker answers chat with a 400 naming the model
    expect(ck.renderChat).toBeUndefined();
  });

  it("tokenizes as llama.cpp does (SentencePiece with scores, byte fallback, special tokens) and decodes back", () => {
    for (const text of [
      "The capital of France is",
      "Hello, world!  Two  spaces\n\nand\ttabs",
      "서울은 한국의 수도입니다 🇰🇷 and 🥐",
      "<start_of_turn>user\nHi<end_of_turn>\n",
      "def f(x):\n    return x**2 # 12345",
    ]) {
      const ours = ck.tokenizer.encode(text);
      expect(ours[0]).toBe(2);
      expect(ours.slice(1), text).toEqual([...cpp.model.tokenize(text, true)].map(Number));
      expect(ck.tokenizer.decode(ours.slice(1))).toBe(text);
      expect(ck.tokenizer.decode(ours)).toBe(`<bos>${text}`);
    }
  });

  it("teacher-forced over a text past the 512-position window: next tokens agree with llama.cpp's (near ties counted)", async () => {
    const ids = ck.tokenizer.encode(`${parityText()}\n\n${parityText()}`).slice(0, 700);
    expect(ids.length).toBe(700);
    const model = await LlamaModel.load(ck);
    let ours: Float32Array[];
    try {
      ours = teacherForcedLogits(model, ids);
    } finally {
      model.close();
    }
    const theirs = await llamaCppTeacherForced(cpp, ids, 512);
    let strict = 0;
    let near = 0;
    let strictPast = 0;
    for (let p = 0; p < ids.length; p++) {
      const mine = argmax(ours[p]!);
      const top = theirs[p]![0]![0];
      if (mine === top) strict++;
      const rank = theirs[p]!.find(([t]) => t === mine);
      if (mine === top || (rank !== undefined && -rank[1] <= NEAR_TIE)) near++;
      if (p >= 512 && mine === top) strictPast++;
    }
    console.log(
      `gemma-3-270m vs llama.cpp, ${ids.length} positions: argmax ${((100 * strict) / ids.length).toFixed(2)}% exact, ${((100 * near) / ids.length).toFixed(2)}% with near ties; past the window (positions 512+): ${((100 * strictPast) / (ids.length - 512)).toFixed(2)}% exact`,
    );
    expect(near / ids.length).toBeGreaterThanOrEqual(0.98);
    expect(strict / ids.length).toBeGreaterThanOrEqual(0.9);
    expect(strictPast / (ids.length - 512)).toBeGreaterThanOrEqual(0.9);
  }, 600_000);
});
