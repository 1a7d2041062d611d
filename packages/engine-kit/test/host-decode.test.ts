// writeBlockColumn: the new position a native host-input decode step returns lands in its block
// in layout rngd-pd/v2 (the engine side of NativeHostDecode; engine-atom's RBLN decode graph
// produces the columns).
import { describe, expect, it } from "vitest";
import { writeBlockColumn } from "../src/index.ts";

describe("host-input decode contract", () => {
  it("writes the new position into its block in layout rngd-pd/v2", () => {
    const g = { kvHeads: 2, headDim: 2 };
    const bs = 4;
    const kBlock = new Uint8Array(2 * 2 * bs * 2);
    const vBlock = new Uint8Array(2 * bs * 2 * 2);
    const k = new Uint8Array([1, 2, 3, 4, 5, 6, 7, 8]);
    const v = new Uint8Array([11, 12, 13, 14, 15, 16, 17, 18]);
    writeBlockColumn(g, bs, 1, kBlock, vBlock, k, v);
    // K [kvh, hd, block]: row r = (h, d), position 1 -> bytes (r*bs + 1)*2.
    for (let r = 0; r < 4; r++) expect([kBlock[(r * bs + 1) * 2], kBlock[(r * bs + 1) * 2 + 1]]).toEqual([k[2 * r], k[2 * r + 1]]);
    // V [kvh, block, hd]: head h, position 1 -> 4 contiguous bytes at (h*bs + 1)*4.
    expect([...vBlock.subarray(4, 8)]).toEqual([11, 12, 13, 14]);
    expect([...vBlock.subarray((bs + 1) * 4, (bs + 1) * 4 + 4)]).toEqual([15, 16, 17, 18]);
    expect(kBlock.reduce((a, b) => a + b, 0)).toBe(36);
  });
});
