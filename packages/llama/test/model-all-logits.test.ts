// prefillAllLogits: the logits after every prompt position, each equal to what prefill of that
// prefix returns, and the same KV as prefill.
import { expect, test } from "vitest";
import { LlamaModel } from "../src/index.ts";
import { randomCheckpoint, tinyConfig } from "./model-helpers/random-checkpoint.ts";

test("row i equals prefill of the first i+1 tokens; the cache equals prefill's", async () => {
  const model = await LlamaModel.load(randomCheckpoint(tinyConfig(), 7));
  const tokens = [5, 17, 3, 99, 42, 8, 61];
  const all = model.newCache(16);
  const rows = model.prefillAllLogits(tokens, all);
  expect(rows.length).toBe(tokens.length);
  expect(all.n).toBe(tokens.length);
  for (let i = 0; i < tokens.length; i++) {
    const c = model.newCache(16);
    const last = model.prefill(tokens.slice(0, i + 1), c);
    expect(Buffer.from(rows[i].buffer, rows[i].byteOffset, rows[i].byteLength).equals(Buffer.from(last.buffer, last.byteOffset, last.byteLength)), `row ${i}`).toBe(true);
    if (i === tokens.length - 1) {
      for (let l = 0; l < model.config.numLayers; l++) {
        expect(Buffer.from(c.layerK(l)).equals(Buffer.from(all.layerK(l)))).toBe(true);
        expect(Buffer.from(c.layerV(l)).equals(Buffer.from(all.layerV(l)))).toBe(true);
      }
    }
    model.freeCache(c);
  }
  model.freeCache(all);
  model.close();
});
