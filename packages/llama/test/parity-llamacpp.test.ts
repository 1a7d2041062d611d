// Our engine against llama.cpp (node-llama-cpp 3.21.1, prebuilt, CPU, one thread) on the very same
// SmolLM2-135M-Instruct Q4_1 GGUF: tokens of a fixed English text, teacher-forced next-token
// argmax and logits at every position, chat-template prompt tokens, and a greedy chat answer.
// Skipped, with the reason, when the model is not in the cache.
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { Checkpoint, ChatMessage } from "../src/checkpoint-types.ts";
import { loadCheckpoint } from "../src/checkpoint/load-checkpoint.ts";
import { LlamaModel } from "../src/model/llama-model.ts";
import { generate } from "../src/model/generate.ts";
import { llamaCppGreedy, llamaCppTeacherForced, openLlamaCpp, renderWithLlamaCppJinja, type CentredTop, type LlamaCpp } from "./fixtures/parity/llamacpp-reference.ts";
import { type Agreement, agreement, MAX_LOGIT_DIFF, MIN_NEAR_TIE_AGREEMENT, MIN_STRICT_AGREEMENT, NEAR_TIE } from "./fixtures/parity/llamacpp-agreement.ts";
import { SKIP_REASON, cachedParityModel, parityText, teacherForcedLogits } from "./fixtures/parity/parity-model.ts";

const ggufPath = cachedParityModel();
if (!ggufPath) console.warn(`parity-llamacpp skipped: ${SKIP_REASON}`);

/** Argmax agreement of two llama.cpp runs (its own batch-size sensitivity, for context). */
function selfAgreement(a: CentredTop[], b: CentredTop[]): { strict: number; maxAbsDiff: number } {
  let same = 0,
    maxAbsDiff = 0;
  for (let p = 0; p < a.length; p++) {
    if (a[p][0][0] === b[p][0][0]) same++;
    const ref = a[p][0][0];
    const bm = new Map(b[p]);
    const bRef = bm.get(ref);
    if (bRef === undefined) continue;
    for (const [t, c] of a[p]) {
      const bt = bm.get(t);
      if (bt !== undefined) maxAbsDiff = Math.max(maxAbsDiff, Math.abs(bt - bRef - c));
    }
  }
  return { strict: same / a.length, maxAbsDiff };
}

const pct = (x: number): string => `${(100 * x).toFixed(2)}%`;

describe.skipIf(!ggufPath)(`parity with llama.cpp on ${ggufPath ?? SKIP_REASON}`, () => {
  let ckpt: Checkpoint;
  let model: LlamaModel;
  let cpp: LlamaCpp;

  beforeAll(async () => {
    ckpt = await loadCheckpoint(ggufPath!);
    model = await LlamaModel.load(ckpt, { threads: 1 });
    cpp = await openLlamaCpp(ggufPath!);
  }, 180_000);

  afterAll(async () => {
    model?.close();
    ckpt?.tensors.close();
    await cpp?.model.dispose();
    await cpp?.llama.dispose();
  });

  it("tokenises the fixed English text into the same ids as llama.cpp", () => {
    const text = parityText();
    const ours = ckpt.tokenizer.encode(text, { addSpecialTokens: false });
    expect(ours.length).toBeGreaterThanOrEqual(450);
    expect(ours.length).toBeLessThanOrEqual(600);
    expect(ours).toEqual(cpp.model.tokenize(text, false));
  });

  it("teacher-forced next-token argmax agrees with llama.cpp at >= 98% of positions (near ties counted), logits close", async () => {
    const ids = ckpt.tokenizer.encode(parityText(), { addSpecialTokens: false });
    const ours = teacherForcedLogits(model, ids);
    expect(ours).toHaveLength(ids.length);
    const oneBatch = await llamaCppTeacherForced(cpp, ids, 1024);
    const smallBatches = await llamaCppTeacherForced(cpp, ids, 8);
    const self = selfAgreement(oneBatch, smallBatches);
    const lines = [`teacher forcing over ${ids.length} tokens of test/fixtures/parity/english-text.txt (llama.cpp top-64 per position, logits centred on llama.cpp's argmax):`];
    lines.push(`  llama.cpp 1024-token batch vs its own 8-token batches: argmax ${pct(self.strict)}, max |dlogit| ${self.maxAbsDiff.toFixed(3)}`);
    const results: [string, Agreement][] = [
      ["1024-token batch", agreement(ours, oneBatch)],
      ["8-token batches", agreement(ours, smallBatches)],
    ];
    for (const [name, r] of results) {
      const gaps = r.disagreements.map((d) => (d.gap === null ? "out of top-64" : d.gap.toFixed(3)));
      lines.push(
        `  ours vs llama.cpp ${name}: argmax ${pct(r.strict)} exact, ${pct(r.nearTie)} with near ties (<= ${NEAR_TIE}); ` +
          `max |dlogit| ${r.maxAbsDiff.toFixed(3)}, mean ${r.meanAbsDiff.toFixed(4)}; llama.cpp gaps at disagreements: [${gaps.join(", ")}]`,
      );
    }
    console.log(lines.join("\n"));
    for (const [, r] of results) {
      expect(r.nearTie).toBeGreaterThanOrEqual(MIN_NEAR_TIE_AGREEMENT);
      expect(r.strict).toBeGreaterThanOrEqual(MIN_STRICT_AGREEMENT);
      expect(Number.isFinite(r.maxAbsDiff)).toBe(true);
      expect(r.maxAbsDiff).toBeLessThan(MAX_LOGIT_DIFF);
    }
  });

  const conversations: [string, ChatMessage[], boolean][] = [
    ["one user turn", [{ role: "user", content: "What is the capital of France?" }], true],
    [
      "system prompt",
      [
        { role: "system", content: "You answer in one short sentence." },
        { role: "user", content: "Why is the sky blue?" },
      ],
      true,
    ],
    [
      "several turns",
      [
        { role: "user", content: "Give me a word that rhymes with light." },
        { role: "assistant", content: "Night." },
        { role: "user", content: "And one with day?" },
      ],
      true,
    ],
    ["non-ASCII and newlines", [{ role: "user", content: "Traduis « bonjour » en coréen : 안녕하세요?\nRéponds avec un emoji 🙂." }], true],
    [
      "no generation prompt",
      [
        { role: "user", content: "Hello" },
        { role: "assistant", content: "Hi! How can I help?" },
      ],
      false,
    ],
  ];

  it.each(conversations)("chat template (%s): same prompt text and tokens as llama.cpp's Jinja renderer and tokenizer", (_name, messages, addGenerationPrompt) => {
    const template = cpp.model.fileInfo.metadata.tokenizer.chat_template;
    expect(typeof template).toBe("string");
    const theirsText = renderWithLlamaCppJinja(cpp, template as string, {
      messages,
      add_generation_prompt: addGenerationPrompt,
      bos_token: cpp.model.tokens.bosString ?? "",
      eos_token: cpp.model.tokens.eosString ?? "",
    });
    const oursText = ckpt.renderChat!(messages, { addGenerationPrompt });
    expect(oursText).toBe(theirsText);
    expect(ckpt.tokenizer.encode(oursText)).toEqual(cpp.model.tokenize(theirsText, true));
  });

  it('a greedy chat completion of "What is the capital of France?": 16-bit activations name Paris, 8-bit ones follow llama.cpp (8-bit too)', async () => {
    const prompt = ckpt.tokenizer.encode(ckpt.renderChat!([{ role: "user", content: "What is the capital of France?" }], { addGenerationPrompt: true }));
    const stop = ckpt.generation.eosTokenIds;
    const theirs = await llamaCppGreedy(cpp, prompt, 40, stop);
    const theirsText = ckpt.tokenizer.decode(theirs, { skipSpecialTokens: true });
    const i16 = await LlamaModel.load(ckpt, { threads: 1, activations: "i16" });
    const lines = [`llama.cpp: ${JSON.stringify(theirsText)}`];
    const answers: Record<string, { text: string; common: number }> = {};
    try {
      for (const [name, m] of [
        [`default (${model.activations})`, model],
        ["i16", i16],
      ] as const) {
        const ours = generate(m, prompt, { maxTokens: 40, stopTokenIds: stop });
        const text = ckpt.tokenizer.decode(ours.tokens, { skipSpecialTokens: true });
        let common = 0;
        while (common < Math.min(ours.tokens.length, theirs.length) && ours.tokens[common] === theirs[common]) common++;
        answers[m.activations] = { text, common };
        lines.push(`ours ${name} (${ours.finishReason}): ${JSON.stringify(text)}; identical leading tokens with llama.cpp: ${common} of ${ours.tokens.length}/${theirs.length}`);
      }
    } finally {
      i16.close();
    }
    console.log(lines.join("\n"));
    // 16-bit activations answer as the float64 reference and the bf16 path do
    expect(answers.i16!.text).toMatch(/Paris/);
    // 8-bit activations are llama.cpp's own scheme: its answer, token for token, for a while
    expect(answers.i8!.common).toBeGreaterThanOrEqual(10);
  });
});
