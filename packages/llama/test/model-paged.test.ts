// The paged KV cache: attention through block tables gives the bits of any other placement of
// the same positions (scattered blocks, any block size), blocks are shared and copied on write,
// a budget is enforced all or nothing, and memory follows the positions written, not the
// capacity asked for.
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { blocksToDense, isAirmError } from "@airm/rm-core";
import { LlamaModel } from "../src/model/llama-model.ts";
import type { KVCache } from "../src/model/kv-cache.ts";
import { randomCheckpoint, tinyConfig } from "./model-helpers/random-checkpoint.ts";

const config = tinyConfig({ intermediateSize: 160 });
const prompt = Array.from({ length: 45 }, (_, i) => (i * 37 + 11) % 250);

function bits(x: Float32Array): Buffer {
  return Buffer.from(x.buffer, x.byteOffset, x.byteLength);
}

/** The cache's positions [0, n) as dense K [kvh][D][n] and V [kvh][n][D] per layer: comparable across block sizes. */
function dense(m: LlamaModel, cache: KVCache): Buffer {
  const c = m.config;
  const kv = m.exportKV(cache);
  const parts: Buffer[] = [];
  for (let l = 0; l < c.numLayers; l++) {
    const K = new Uint8Array(c.numKvHeads * c.headDim * kv.n * 2);
    const V = new Uint8Array(K.length);
    blocksToDense({ kvHeads: c.numKvHeads, headDim: c.headDim }, kv.blockSize, kv.n, kv.k[l], kv.v[l], kv.n, K, V);
    parts.push(Buffer.from(K), Buffer.from(V));
  }
  return Buffer.concat(parts);
}

/** Prefill then `steps` greedy decode steps; every logits row's bits and the final dense KV. */
function run(m: LlamaModel, cache: KVCache, steps = 6): { logits: Buffer[]; kv: Buffer } {
  const logits = [bits(m.prefill(prompt, cache))];
  let token = 5;
  for (let i = 0; i < steps; i++) {
    const l = m.decode([{ cache, token }])[0];
    logits.push(bits(l));
    token = (token * 31 + 7) % 250;
  }
  return { logits, kv: dense(m, cache) };
}

let model: LlamaModel;
let reference: { logits: Buffer[]; kv: Buffer };
beforeAll(async () => {
  model = await LlamaModel.load(randomCheckpoint(config, 5), { weights: "q8_0" });
  const c = model.newCache(128);
  reference = run(model, c);
  model.freeCache(c);
});
afterAll(() => model.close());

describe("paged attention", () => {
  it("blocks scattered over the pool give the bits of blocks in order", () => {
    // Take blocks, then free every other one: the next cache gets blocks out of address order.
    const holders = Array.from({ length: 8 }, () => {
      const h = model.newCache(16);
      model.prefill([1], h);
      return h;
    });
    holders.filter((_, i) => i % 2 === 0).forEach((h) => model.freeCache(h));
    const cache = model.newCache(128);
    const got = run(model, cache);
    const ids = cache.blockIds;
    expect(ids.some((id, j) => j > 0 && id !== ids[j - 1] + 1)).toBe(true);
    expect(got.logits).toEqual(reference.logits);
    expect(got.kv.equals(reference.kv)).toBe(true);
    model.freeCache(cache);
    holders.filter((_, i) => i % 2 === 1).forEach((h) => model.freeCache(h));
  });

  it.each([4, 8, 32, 64])("blocks of %i positions give the bits of blocks of 16", async (blockSize) => {
    const m = await LlamaModel.load(randomCheckpoint(config, 5), { weights: "q8_0", kv: { blockSize } });
    try {
      const cache = m.newCache(128);
      const got = run(m, cache);
      expect(cache.blockIds).toHaveLength(Math.ceil((prompt.length + 6) / blockSize));
      expect(got.logits).toEqual(reference.logits);
      expect(got.kv.equals(reference.kv)).toBe(true);
    } finally {
      m.close();
    }
  });

  it("refuses a block size the kernels cannot read, naming it", async () => {
    await expect(LlamaModel.load(randomCheckpoint(config, 5), { kv: { blockSize: 12 } })).rejects.toThrow(/blockSize.*12 is not one of 4, 8, 16/);
  });
});

describe("sharing blocks", () => {
  it("a fork shares every block and copies a shared one before writing: each branch gives its solo bits", () => {
    const pool = model.kvPool;
    const a = model.newCache(128) as ReturnType<LlamaModel["newCache"]> & { fork(): KVCache };
    model.prefill(prompt, a);
    const used = pool.usedBlocks;
    const b = a.fork();
    expect(b.blockIds).toEqual(a.blockIds);
    expect(pool.usedBlocks).toBe(used); // nothing copied yet
    const before = dense(model, a);
    const la = model.decode([{ cache: a, token: 5 }])[0];
    // a's write went to a copy of the shared last block; b still holds the prompt's bytes
    expect(a.blockIds.at(-1)).not.toBe(b.blockIds.at(-1));
    expect(dense(model, b).equals(before)).toBe(true);
    const lb = model.decode([{ cache: b, token: 9 }])[0];
    expect(pool.usedBlocks).toBe(used + 1); // one copy: b wrote into the block it then held alone
    expect(bits(la).equals(reference.logits[1])).toBe(true);
    // b's branch equals a solo run that decodes 9 first
    const solo = model.newCache(128);
    model.prefill(prompt, solo);
    expect(bits(model.decode([{ cache: solo, token: 9 }])[0]).equals(bits(lb))).toBe(true);
    expect(dense(model, solo).equals(dense(model, b))).toBe(true);
    for (const c of [a, b, solo]) model.freeCache(c);
  });

  it("adopting another cache's full blocks and computing the rest gives the bits of the whole prompt", () => {
    const first = model.newCache(128) as KVCache & { blocks: number[] };
    model.prefill(prompt, first);
    const second = model.newCache(128) as KVCache & { adopt(ids: number[]): void };
    second.adopt(first.blockIds.slice(0, 2)); // positions [0, 32)
    expect(second.n).toBe(32);
    const logits = model.prefill(prompt.slice(32), second);
    expect(bits(logits).equals(reference.logits[0])).toBe(true);
    expect(second.blockIds.slice(0, 2)).toEqual(first.blockIds.slice(0, 2));
    expect(dense(model, second).equals(dense(model, first))).toBe(true);
    model.freeCache(first);
    model.freeCache(second);
  });
});

describe("the pool's budget and memory", () => {
  it("a pass that needs more blocks than are free throws KVCacheFullError and changes nothing", async () => {
    const m = await LlamaModel.load(randomCheckpoint(config, 5), { kv: { maxBlocks: 3 } });
    try {
      const cache = m.newCache(128);
      let err: unknown;
      try {
        m.prefill(prompt, cache); // 45 positions: 3 blocks, fits
        const other = m.newCache(128);
        m.prefill([1, 2], other); // a fourth block: none
      } catch (e) {
        err = e;
      }
      expect(isAirmError(err, "KV_CACHE_FULL")).toBe(true);
      expect(m.kvPool.usedBlocks).toBe(3);
      // reserved blocks are not available to others, and are spent by the cache they go to
      m.freeCache(cache);
      expect(m.kvPool.reserve(2)).toBe(true);
      expect(m.kvPool.availableBlocks).toBe(1);
      const mine = m.newCache(128) as KVCache & { addReservation(n: number): void };
      mine.addReservation(2);
      const theirs = m.newCache(128);
      expect(() =>
        m.prefill(
          Array.from({ length: 20 }, (_, i) => i + 1),
          theirs,
        ),
      ).toThrow(expect.objectContaining({ code: "KV_CACHE_FULL" }));
      expect(theirs.n).toBe(0);
      m.prefill(
        Array.from({ length: 20 }, (_, i) => i + 1),
        mine,
      ); // 2 blocks, from its reservation
      expect(m.kvPool.reservedBlocks).toBe(0);
      expect(m.kvPool.usedBlocks).toBe(2);
    } finally {
      m.close();
    }
  });

  it("memory follows the positions written, not the capacity asked for", async () => {
    const m = await LlamaModel.load(randomCheckpoint(config, 5));
    try {
      const before = m.rt.byteLength;
      const caches = Array.from({ length: 4 }, () => m.newCache(1 << 17));
      caches.forEach((c) => m.prefill([1, 2, 3], c));
      expect(m.kvPool.usedBlocks).toBe(4);
      // four caches of 131072 positions each took one block each
      expect(m.rt.byteLength - before).toBeLessThan(16 * 2 ** 20);
      caches.forEach((c) => m.freeCache(c));
      // a freed block is the next one taken: the pool does not grow while blocks are free
      const materialized = m.kvPool.materializedBlocks;
      for (let i = 0; i < 20; i++) {
        const c = m.newCache(64);
        m.prefill([1, 2, 3], c);
        m.freeCache(c);
      }
      expect(m.kvPool.materializedBlocks).toBe(materialized);
    } finally {
      m.close();
    }
  });
});
