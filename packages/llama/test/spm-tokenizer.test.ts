// The SentencePiece ("llama") GGUF tokenizer on a small hand-made vocabulary: merges by score (not
// left to right), leftmost on equal scores, byte fallback, special tokens matched in the text, BOS
// and the space prefix as the file asks. The real Gemma 3 vocabulary is checked against llama.cpp
// in gemma3-real.test.ts.
import { describe, expect, it } from "vitest";
import { SpmTokenizer } from "../src/tokenizer/spm-tokenizer.ts";

const S = "\u2581";
const bytes = Array.from({ length: 256 }, (_, b) => `<0x${b.toString(16).toUpperCase().padStart(2, "0")}>`);
// id: 0 <pad>, 1 <eos>, 2 <bos>, 3 <start>, then pieces, then the 256 byte tokens
const pieces: [string, number][] = [
  ["a", -1],
  ["b", -1],
  ["c", -1],
  [S, -1],
  ["ab", -5],
  ["bc", -2], // higher than "ab": "abc" -> a + bc, not ab + c
  [`${S}a`, -3],
  ["aa", -4],
];
const tokens = ["<pad>", "<eos>", "<bos>", "<start>", ...pieces.map(([t]) => t), ...bytes];
const scores = [0, 0, 0, 0, ...pieces.map(([, s]) => s), ...bytes.map(() => 0)];
const types = [3, 3, 3, 3, ...pieces.map(() => 1), ...bytes.map(() => 6)];
const id = (t: string) => tokens.indexOf(t);
const make = (addBos: boolean, addSpacePrefix: boolean) => new SpmTokenizer({ tokens, scores, types, bosTokenId: 2, eosTokenIds: [1], addBos, addSpacePrefix });

describe("SentencePiece tokenizer (GGUF tokenizer.ggml.model = llama)", () => {
  it("merges the highest-scored pair first, leftmost on ties, and falls back to bytes", () => {
    const tok = make(false, false);
    expect(tok.encode("abc")).toEqual([id("a"), id("bc")]);
    expect(tok.encode("ab")).toEqual([id("ab")]);
    // "aaa": both pairs score the same; the left one merges first
    expect(tok.encode("aaa")).toEqual([id("aa"), id("a")]);
    // a space is U+2581; "é" is no token: its two UTF-8 bytes
    expect(tok.encode("a é")).toEqual([id("a"), id(S), id("<0xC3>"), id("<0xA9>")]);
    expect(tok.encode(" a")).toEqual([id(`${S}a`)]);
  });

  it("matches special tokens in the text, adds BOS and a space prefix when the file asks", () => {
    expect(make(false, false).encode("a<start>b")).toEqual([id("a"), id("<start>"), id("b")]);
    expect(make(true, false).encode("ab")).toEqual([2, id("ab")]);
    expect(make(true, false).encode("ab", { addSpecialTokens: false })).toEqual([id("ab")]);
    expect(make(false, true).encode("a")).toEqual([id(`${S}a`)]);
  });

  it("decodes spaces, byte tokens across pieces and special tokens (skipped on request)", () => {
    const tok = make(true, false);
    const text = "ab é<start>c";
    const ids = tok.encode(text);
    expect(tok.decode(ids)).toBe(`<bos>${text}`);
    expect(tok.decode(ids, { skipSpecialTokens: true })).toBe("ab éc");
    expect([...tok.tokenBytes(id("<0xC3>"))]).toEqual([0xc3]);
    expect(new TextDecoder().decode(tok.tokenBytes(id(`${S}a`)))).toBe(" a");
    expect(tok.vocabulary().type).toBe("byte_fallback");
  });
});
