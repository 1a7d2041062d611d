// loadCheckpoint's reuseTokenizerFrom: a weight update of the same model shares the parsed
// tokenizer; a different tokenizer is loaded afresh.
import { mkdtempSync, rmSync, writeFileSync, readFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, expect, test } from "vitest";
import { loadCheckpoint, makeTinyModel } from "../src/index.ts";

let dir: string;
beforeAll(() => {
  dir = mkdtempSync(join(tmpdir(), "airm-reuse-"));
  makeTinyModel({ arch: "llama", out: join(dir, "a"), seed: 1 });
  makeTinyModel({ arch: "llama", out: join(dir, "b"), seed: 2 });
  makeTinyModel({ arch: "llama", out: join(dir, "c"), seed: 1, vocab: 400 });
});
afterAll(() => rmSync(dir, { recursive: true, force: true }));

test("same tokenizer files: the tokenizer and chat template are shared, the weights are the new ones", async () => {
  const a = await loadCheckpoint(join(dir, "a"));
  const b = await loadCheckpoint(join(dir, "b"), { reuseTokenizerFrom: a });
  expect(b.tokenizer).toBe(a.tokenizer);
  expect(b.renderChat).toBe(a.renderChat);
  expect(b.tensors.sha256("model.embed_tokens.weight")).not.toBe(a.tensors.sha256("model.embed_tokens.weight"));
  expect(b.tokenizer.encode("hello world")).toEqual(a.tokenizer.encode("hello world"));
  a.tensors.close();
  b.tensors.close();
});

test("a different tokenizer (other vocab, or an edited tokenizer_config.json) is loaded afresh", async () => {
  const a = await loadCheckpoint(join(dir, "a"));
  const c = await loadCheckpoint(join(dir, "c"), { reuseTokenizerFrom: a });
  expect(c.tokenizer).not.toBe(a.tokenizer);
  expect(c.tokenizer.vocabSize).toBe(400);
  const cfg = join(dir, "b", "tokenizer_config.json");
  writeFileSync(cfg, readFileSync(cfg, "utf8").replace("{", '{"model_max_length": 77, '));
  const b = await loadCheckpoint(join(dir, "b"), { reuseTokenizerFrom: a });
  expect(b.tokenizer).not.toBe(a.tokenizer);
  for (const x of [a, b, c]) x.tensors.close();
});
