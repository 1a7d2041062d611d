import { describe, expect, it } from "vitest";
import { TextStream } from "./text-stream.ts";

// A byte-level vocabulary: token id = one byte, decode = UTF-8 with replacement (as real
// byte-level BPE tokenizers decode).
const decodeBytes = (ids: number[]) => new TextDecoder().decode(new Uint8Array(ids));

describe("TextStream", () => {
  it("holds a multi-byte character until it is complete and concatenates to the full decode", () => {
    const text = "añ€😀z";
    const bytes = [...new TextEncoder().encode(text)];
    const ts = new TextStream(decodeBytes);
    const pieces = bytes.map((b) => ts.push(b));
    expect(pieces.join("") + ts.flush()).toBe(text);
    expect(pieces.every((p) => !p.includes("\uFFFD"))).toBe(true);
    // the 4 bytes of the emoji release exactly one piece, on the last byte
    const emojiStart = new TextEncoder().encode("añ€").length;
    expect(pieces.slice(emojiStart, emojiStart + 4)).toEqual(["", "", "", "😀"]);
  });
  it("flushes an incomplete character as U+FFFD", () => {
    const ts = new TextStream(decodeBytes);
    expect(ts.push(0x61)).toBe("a");
    expect(ts.push(0xe2)).toBe("");
    expect(ts.flush()).toBe("\uFFFD");
  });
});
