import { execFileSync } from "node:child_process";
import { createHash } from "node:crypto";
import { fileURLToPath } from "node:url";
import { describe, expect, it } from "vitest";
import { blockHashes, blockHashId, blockHashRoot } from "./block-hash.ts";

const ROOT = { modelFingerprint: "m".repeat(64), numericsFingerprint: "n".repeat(64), blockSize: 4 };
const TOKENS = [1, 2, 3, 4, 5, 6, 7, 8, 9, 151643, 0];

describe("block hashes", () => {
  it("follow the documented chain: SHA-256 over the parent hash and the block's ids as u32 little-endian", () => {
    const root = createHash("sha256")
      .update(`rngd-pd/block-hash/v1\0${"m".repeat(64)}\0${"n".repeat(64)}\0${4}\0`)
      .digest();
    expect(blockHashRoot(ROOT)).toBe(root.toString("hex"));
    const ids = (xs: number[]) => Buffer.from(new Uint32Array(xs).buffer);
    const h0 = createHash("sha256")
      .update(root)
      .update(ids([1, 2, 3, 4]))
      .digest();
    const h1 = createHash("sha256")
      .update(h0)
      .update(ids([5, 6, 7, 8]))
      .digest();
    expect(blockHashes(root.toString("hex"), TOKENS, 4)).toEqual([h0.toString("hex"), h1.toString("hex")]);
    // continuing a chain gives the same names
    expect(blockHashes(root.toString("hex"), TOKENS, 4, 2, 1, h0.toString("hex"))).toEqual([h1.toString("hex")]);
    // vLLM's int form: int.from_bytes(hash, "big") & (2**64 - 1)
    expect(blockHashId(h0.toString("hex"))).toBe(BigInt(`0x${h0.toString("hex")}`) & ((1n << 64n) - 1n));
  });

  it("name a prefix: a change in any earlier block, the salt, the model, the numerics or the block size changes every later hash", () => {
    const base = blockHashes(blockHashRoot(ROOT), TOKENS, 4);
    const changed = [...TOKENS];
    changed[0] = 99;
    expect(blockHashes(blockHashRoot(ROOT), changed, 4)[1]).not.toBe(base[1]);
    for (const root of [
      blockHashRoot(ROOT, "tenant"),
      blockHashRoot({ ...ROOT, modelFingerprint: "x" }),
      blockHashRoot({ ...ROOT, numericsFingerprint: "x" }),
      blockHashRoot({ ...ROOT, blockSize: 8 }),
    ]) {
      expect(blockHashes(root, TOKENS, 4)[0]).not.toBe(base[0]);
    }
  });

  it("are the same in another process (no process-random seed)", () => {
    const here = blockHashes(blockHashRoot(ROOT, "s"), TOKENS, 4);
    const file = fileURLToPath(new URL("./block-hash.ts", import.meta.url));
    const code = `import(${JSON.stringify(file)}).then((m) => console.log(JSON.stringify(m.blockHashes(m.blockHashRoot(${JSON.stringify(ROOT)}, "s"), ${JSON.stringify(TOKENS)}, 4))))`;
    const there = JSON.parse(execFileSync(process.execPath, ["-e", code], { encoding: "utf8" }));
    expect(there).toEqual(here);
  });
});
