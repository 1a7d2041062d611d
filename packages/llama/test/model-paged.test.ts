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

describe("sliding-window layers (Gemma 3): blocks that leave the window go back", () => {
  // layers 0 and 2 slide over 20 positions, layer 1 reads the whole context; blocks of 8
  const gemma = tinyConfig({
    architecture: "gemma3",
    numLayers: 3,
    headDim: 32,
    tieWordEmbeddings: true,
    rmsNormEps: 1e-6,
    queryPreAttnScalar: 24,
    intermediateSize: 160,
    slidingWindow: { window: 20, layers: [true, false, true], ropeTheta: 10000 },
  });
  let m: LlamaModel;
  beforeAll(async () => {
    m = await LlamaModel.load(randomCheckpoint(gemma, 9), { kv: { blockSize: 8 } });
  });
  afterAll(() => m?.close());

  /** Greedy-ish tokens from a prefill of `p` then `steps` decode steps; every logits row's bits. */
  function tokensOf(cache: KVCache, p: number[], steps: number): Buffer[] {
    const out = [bits(m.prefill(p, cache))];
    let token = 5;
    for (let i = 0; i < steps; i++) {
      out.push(bits(m.decode([{ cache, token }])[0]));
      token = (token * 31 + 7) % 250;
    }
    return out;
  }

  it("keeps the sliding-window layers' blocks in a pool of their own, only the window's", () => {
    const local = m.homes.local!;
    expect(local.window).toBe(20);
    expect(m.homes.slot).toEqual([0, 0, 1]);
    expect(m.kvPool.layers).toBe(1);
    expect(local.pool.layers).toBe(2);
    expect(m.kvBlockBytes).toBe(3 * m.kvPool.layerStride);
    const cache = m.newCache(128);
    tokensOf(cache, prompt, 40); // 85 positions: 11 blocks
    expect(m.kvPool.usedBlocks).toBe(11);
    // a query at 85 reads [66, 85]: blocks 8..10
    expect(local.pool.usedBlocks).toBe(3);
    const w = cache as unknown as { local: number[] };
    expect(w.local.slice(0, 8).every((id) => id === -1)).toBe(true);
    // an export holds zeros where the window has left, the whole-context layer holds every block
    const kv = m.exportKV(cache);
    const kBytes = m.kvPool.kBytes;
    expect(kv.k[0].subarray(0, 8 * kBytes).every((b) => b === 0)).toBe(true);
    expect(kv.k[0].subarray(8 * kBytes).some((b) => b !== 0)).toBe(true);
    expect(kv.k[1].subarray(0, kBytes).some((b) => b !== 0)).toBe(true);
    m.freeCache(cache);
    expect(local.pool.usedBlocks).toBe(0);
    expect(m.kvPool.usedBlocks).toBe(0);
  });

  it("a prompt in chunks (blocks leave between them) gives the bits of the whole prompt, decode steps too", () => {
    const whole = m.newCache(128);
    const ref = tokensOf(whole, prompt, 30);
    m.freeCache(whole);
    // the same positions in chunks of 7 (blocks leave between chunks), then the same decode steps
    const c = m.newCache(128);
    const rows = [bits(m.prefillChunk(prompt, c, 7))];
    let token = 5;
    for (let i = 0; i < 30; i++) {
      rows.push(bits(m.decode([{ cache: c, token }])[0]));
      token = (token * 31 + 7) % 250;
    }
    expect(rows).toEqual(ref);
    m.freeCache(c);
  });

  it("an import takes only the window's blocks and decodes the bits of the cache it came from", () => {
    const src = m.newCache(128);
    tokensOf(src, prompt, 0);
    const kv = m.exportKV(src);
    const dst = m.newCache(128);
    const before = m.homes.local!.pool.usedBlocks;
    m.importKV(dst, kv);
    // 45 positions: a query at 45 reads [26, 45], blocks 3..5
    expect(m.homes.local!.pool.usedBlocks - before).toBe(3);
    let token = 5;
    for (let i = 0; i < 12; i++) {
      const a = bits(m.decode([{ cache: src, token }])[0]);
      const b = bits(m.decode([{ cache: dst, token }])[0]);
      expect(b.equals(a)).toBe(true);
      token = (token * 31 + 7) % 250;
    }
    m.freeCache(src);
    m.freeCache(dst);
  });

  it("a fork and an adopted prefix share the window's blocks; going back behind the window is refused", () => {
    const a = m.newCache(128);
    tokensOf(a, prompt, 0);
    const b = (a as unknown as { fork(): KVCache }).fork();
    const la = bits(m.decode([{ cache: a, token: 9 }])[0]);
    const lb = bits(m.decode([{ cache: b, token: 9 }])[0]);
    expect(lb.equals(la)).toBe(true);
    const w = a as unknown as { blocks: number[]; local: number[]; truncate(keep: number): void };
    // a cache of 40 positions still holds blocks 2..4 of the sliding-window layers, what a query at 40 reads
    const e = m.newCache(128);
    m.prefill(prompt.slice(0, 40), e);
    const we = e as unknown as { blocks: number[]; local: number[] };
    expect(we.local.slice(0, 2)).toEqual([-1, -1]);
    const c = m.newCache(128) as unknown as { adopt(ids: number[], local: number[]): void; n: number };
    c.adopt(we.blocks.slice(0, 5), we.local.slice(0, 5));
    expect(c.n).toBe(40);
    const whole = m.newCache(128);
    const lw = bits(m.prefill([...prompt.slice(0, 40), 77], whole));
    const lc = bits(m.prefill([77], c as unknown as KVCache));
    expect(lc.equals(lw)).toBe(true);
    // a's first 40 positions cannot be adopted: at 46 positions its block 2 has left the window
    const d = m.newCache(128) as unknown as { adopt(ids: number[], local: number[]): void };
    expect(w.local[2]).toBe(-1);
    expect(() => d.adopt(w.blocks.slice(0, 5), w.local.slice(0, 5))).toThrow(/sliding-window layers' blocks 2..4/);
    // positions 0..7 have left a's window: going back to 10 would need them
    expect(() => w.truncate(10)).toThrow(/dropped blocks/);
    for (const x of [a, b, c, d, e, whole]) m.freeCache(x as unknown as KVCache);
    expect(m.homes.local!.pool.usedBlocks).toBe(0);
  });
});
