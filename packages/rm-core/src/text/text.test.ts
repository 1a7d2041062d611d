import { describe, expect, it } from "vitest";
import { IncrementalDetokenizer } from "./incremental-detokenizer.ts";
import { StopStringMatcher } from "./stop-strings.ts";

// A byte-level vocabulary: token id = one byte, decode = UTF-8 with replacement (as real
// byte-level BPE tokenizers decode).
const bytes = { decode: (ids: number[]) => new TextDecoder().decode(new Uint8Array(ids)) };

describe("IncrementalDetokenizer over byte tokens", () => {
  it("holds a multi-byte character until it is complete and concatenates to the full decode", () => {
    const text = "añ€😀z";
    const ids = [...new TextEncoder().encode(text)];
    const d = new IncrementalDetokenizer(bytes);
    const pieces = ids.map((b) => d.push(b));
    expect(pieces.join("") + d.flush()).toBe(text);
    expect(pieces.every((p) => !p.includes("\uFFFD"))).toBe(true);
    // the 4 bytes of the emoji release exactly one piece, on the last byte
    const emojiStart = new TextEncoder().encode("añ€").length;
    expect(pieces.slice(emojiStart, emojiStart + 4)).toEqual(["", "", "", "😀"]);
  });
  it("flushes an incomplete character as U+FFFD", () => {
    const d = new IncrementalDetokenizer(bytes);
    expect(d.push(0x61)).toBe("a");
    expect(d.push(0xe2)).toBe("");
    expect(d.flush()).toBe("\uFFFD");
  });
});

function run(stops: string[], deltas: string[]): { out: string; stoppedBy: string | null } {
  const m = new StopStringMatcher(stops);
  let out = "";
  for (const d of deltas) {
    out += m.push(d).text;
    if (m.stoppedBy !== null) break;
  }
  out += m.flush();
  return { out, stoppedBy: m.stoppedBy };
}

describe("StopStringMatcher on streamed deltas", () => {
  it("passes text through without stop strings", () => {
    expect(run([], ["ab", "c"])).toEqual({ out: "abc", stoppedBy: null });
  });
  it("cuts at a stop string split across deltas", () => {
    expect(run(["END"], ["hello E", "N", "D world"])).toEqual({ out: "hello ", stoppedBy: "END" });
  });
  it("releases a held-back prefix that did not become a stop string", () => {
    expect(run(["END"], ["hello E", "x", "!"])).toEqual({ out: "hello Ex!", stoppedBy: null });
  });
  it("cuts at the earliest of several stops", () => {
    expect(run(["b", "xyz"], ["axyzb"])).toEqual({ out: "a", stoppedBy: "xyz" });
  });
  it("never emits a part of a stop string before it completes", () => {
    const m = new StopStringMatcher(["\n\n"]);
    expect(m.push("line\n").text).toBe("line");
    expect(m.push("\nrest")).toEqual({ text: "", stoppedBy: "\n\n" });
  });
});
