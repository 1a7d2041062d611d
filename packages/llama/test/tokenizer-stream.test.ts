import { describe, expect, it } from "vitest";
import { HfTokenizer } from "../src/tokenizer/hf-tokenizer.ts";
import { IncrementalDetokenizer } from "@airm/rm-core";
import { StopStringMatcher } from "@airm/rm-core";
import { byteTokenizerJson } from "./fixtures/io/hf-folder.ts";

const tok = new HfTokenizer(byteTokenizerJson(), { clean_up_tokenization_spaces: false }, { file: "tokenizer.json", bosTokenId: null, eosTokenIds: [2] });

function stream(ids: number[], skipSpecialTokens = false): string[] {
  const d = new IncrementalDetokenizer(tok, { skipSpecialTokens });
  const pieces = ids.map((id) => d.push(id));
  pieces.push(d.flush());
  return pieces;
}

describe("IncrementalDetokenizer", () => {
  const texts = ["안녕하세요, 세계! Hello 👋🏽 world", "emoji at the end 🎉", "日本語のテキスト and ASCII", "a", "<|im_start|>user\n무엇?<|im_end|>", "naïve café – ok"];
  for (const text of texts) {
    it(`streams ${JSON.stringify(text)} without broken characters`, () => {
      const ids = tok.encode(text);
      expect(ids.length).toBeGreaterThan(0);
      const pieces = stream(ids);
      for (const p of pieces) expect(p).not.toContain("\uFFFD");
      expect(pieces.join("")).toBe(tok.decode(ids));
      expect(pieces.join("")).toBe(text);
    });
  }

  it("holds back the first bytes of a multi-byte character", () => {
    const ids = tok.encode("한a");
    expect(ids.length).toBe(4); // 3 bytes + 'a'
    const d = new IncrementalDetokenizer(tok);
    expect(d.push(ids[0]!)).toBe("");
    expect(d.push(ids[1]!)).toBe("");
    expect(d.push(ids[2]!)).toBe("한");
    expect(d.push(ids[3]!)).toBe("a");
    expect(d.text).toBe("한a");
  });

  it("emits an invalid byte sequence as decode() does once it cannot complete", () => {
    const a = tok.encode("a")[0]!;
    const lone = tok.encode("é")[1]!; // a continuation byte on its own
    const ids = [a, lone, a];
    const pieces = stream(ids);
    expect(pieces.join("")).toBe(tok.decode(ids));
    expect(pieces[1]).toBe("");
  });

  it("flushes an incomplete character at the end like decode()", () => {
    const ids = tok.encode("ok 🎉").slice(0, -1);
    const pieces = stream(ids);
    expect(pieces.join("")).toBe(tok.decode(ids));
  });

  it("skips special tokens when asked", () => {
    const ids = tok.encode("<|im_start|>hi<|im_end|>");
    expect(stream(ids, true).join("")).toBe(tok.decode(ids, { skipSpecialTokens: true }));
    expect(stream(ids, true).join("")).toBe("hi");
  });

  it("agrees with decode() on a long mixed stream", () => {
    const text = "한국어 문장과 English words 🚀🚀 mixed 12345 — done. ".repeat(20);
    const ids = tok.encode(text);
    const pieces = stream(ids);
    expect(pieces.join("")).toBe(text);
    for (const p of pieces) expect(p).not.toContain("\uFFFD");
  });
});

describe("StopStringMatcher", () => {
  it("finds a stop string split across pieces and holds back a partial match", () => {
    const m = new StopStringMatcher(["\nUser:", "END"]);
    expect(m.push("Hello there\nUs")).toEqual({ text: "Hello there", stoppedBy: null });
    expect(m.push("er")).toEqual({ text: "", stoppedBy: null });
    expect(m.push(": more")).toEqual({ text: "", stoppedBy: "\nUser:" });
    expect(m.push("x")).toEqual({ text: "", stoppedBy: "\nUser:" });
    expect(m.flush()).toBe("");
  });

  it("releases a held partial match that turns out not to be one", () => {
    const m = new StopStringMatcher(["END"]);
    expect(m.push("the EN")).toEqual({ text: "the ", stoppedBy: null });
    expect(m.push("D")).toEqual({ text: "", stoppedBy: "END" });
    const m2 = new StopStringMatcher(["END"]);
    expect(m2.push("the EN")).toEqual({ text: "the ", stoppedBy: null });
    expect(m2.push("d of it")).toEqual({ text: "ENd of it", stoppedBy: null });
    expect(m2.push(" E")).toEqual({ text: " ", stoppedBy: null });
    expect(m2.flush()).toBe("E");
  });

  it("picks the earliest stop string when several match", () => {
    const m = new StopStringMatcher(["cd", "b"]);
    expect(m.push("abcd")).toEqual({ text: "a", stoppedBy: "b" });
    const m2 = new StopStringMatcher(["ab", "abc"]);
    expect(m2.push("xabcx")).toEqual({ text: "x", stoppedBy: "abc" });
  });

  it("matches multi-byte stop strings on streamed pieces", () => {
    const m = new StopStringMatcher(["끝"]);
    const ids = tok.encode("계속 끝 이후");
    const d = new IncrementalDetokenizer(tok);
    let out = "";
    for (const id of ids) {
      const r = m.push(d.push(id));
      out += r.text;
      if (r.stoppedBy) break;
    }
    expect(out).toBe("계속 ");
    expect(m.stoppedBy).toBe("끝");
  });
});

describe("HfTokenizer.tokenBytes", () => {
  it("gives each byte-level token's own bytes, so a character split over tokens is whole only together", () => {
    const text = "안녕 👋🏽 naïve";
    const ids = tok.encode(text, { addSpecialTokens: false });
    const parts = ids.map((id) => tok.tokenBytes(id));
    expect(parts.every((p) => p.length === 1)).toBe(true); // this tokenizer has no merges: one byte per token
    expect(Buffer.concat(parts)).toEqual(Buffer.from(text, "utf8"));
    // a lone continuation byte decodes to U+FFFD but its bytes say what it is
    expect(tok.decode([ids[1]!])).toBe("\uFFFD");
    expect([...tok.tokenBytes(ids[1]!)]).toEqual([Buffer.from(text, "utf8")[1]]);
  });

  it("spells an added (special) token in UTF-8, and an unknown id as nothing", () => {
    expect(Buffer.from(tok.tokenBytes(2)).toString("utf8")).toBe("<|im_end|>");
    expect(tok.tokenBytes(99_999)).toHaveLength(0);
  });
});
