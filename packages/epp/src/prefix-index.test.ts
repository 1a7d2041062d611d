import { expect, test } from "vitest";
import { PrefixIndex, promptBlockHashes } from "./prefix-index.ts";

const text = (seed: string, n: number) => seed.repeat(Math.ceil(n / seed.length)).slice(0, n);

test("whole blocks only, at most maxBlocks; a shared prefix shares its leading hashes", () => {
  const a = promptBlockHashes("m", `${text("a", 512)}${text("x", 300)}`, 256, 8);
  const b = promptBlockHashes("m", `${text("a", 512)}${text("y", 300)}`, 256, 8);
  expect(a).toHaveLength(3);
  expect(b.slice(0, 2)).toEqual(a.slice(0, 2));
  expect(b[2]).not.toBe(a[2]);
  expect(promptBlockHashes("m", text("a", 255))).toEqual([]);
  expect(promptBlockHashes("m", text("a", 256 * 20))).toHaveLength(8);
  expect(promptBlockHashes("other", text("a", 512))).not.toEqual(promptBlockHashes("m", text("a", 512)));
  for (const h of a) expect(Number.isSafeInteger(h)).toBe(true);
});

test("matchedBlocks counts the leading blocks an endpoint took last; the LRU drops the oldest", () => {
  const idx = new PrefixIndex({ capacity: 4 });
  const h = [1, 2, 3];
  idx.record(h, "A");
  expect(idx.matchedBlocks(h, "A")).toBe(3);
  expect(idx.matchedBlocks([1, 2, 9], "A")).toBe(2);
  expect(idx.matchedBlocks(h, "B")).toBe(0);
  idx.record([1], "B");
  expect(idx.matchedBlocks(h, "A")).toBe(0);
  idx.record([7, 8], "C");
  expect(idx.size).toBe(4);
  expect(idx.matchedBlocks([2], "A")).toBe(0);
  expect(idx.matchedBlocks([3], "A")).toBe(1);
});
