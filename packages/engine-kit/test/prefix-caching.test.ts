// Prefix caching by block on the real CPU reference model (generated tiny model): what a finished
// stream leaves (prompt and output) serves the next turn, KV imported with its token ids counts
// too, cache_salt keeps tenants apart, kept blocks go back least recently used when the pool runs
// short, and every reuse gives the bits of computing the prompt.
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { blockHashes, blockHashRoot, blockLayerBytes } from "@airm/rm-core";
import { loadCheckpoint, makeTinyModel } from "@airm/llama";
import { CpuBackedEngine, referenceTokens, type BlockEvent, type CpuEngineSpec } from "../src/index.ts";
import type { Engine } from "@airm/rm-core";
import { testEngineSpec } from "./engine-spec.ts";

const root = mkdtempSync(join(tmpdir(), "airm-prefix-"));
const modelDir = join(root, "model");
const S = 128;
const BS = 4;
let sys: number[];
let user2: number[];

const spec = (over: Partial<CpuEngineSpec> = {}): CpuEngineSpec => testEngineSpec({ variants: [{ batch: 4, seqLen: S }], blockSize: BS, prefixCaching: true, ...over });

/** Greedy turn: prefill (keepStream), `steps` tokens, release. Returns the tokens and what prefill reused. */
async function turn(engine: Engine, tokens: number[], steps: number, cacheSalt?: string): Promise<{ out: number[]; cached: number; fed: number[] }> {
  const r = await engine.prefill(tokens, { keepStream: true, ...(cacheSalt ? { cacheSalt } : {}) });
  const out = [r.firstToken];
  try {
    while (out.length < steps) out.push((await engine.decode([{ stream: r.stream!, token: out[out.length - 1] }]))[0].token);
  } finally {
    engine.release(r.stream!);
  }
  // The stream's cache holds the prompt and every token fed to a decode step (all but the last).
  return { out, cached: r.cachedTokens ?? 0, fed: [...tokens, ...out.slice(0, -1)] };
}

beforeAll(async () => {
  makeTinyModel({ arch: "llama", out: modelDir, layers: 2, seed: 11 });
  const ckpt = await loadCheckpoint(modelDir);
  sys = ckpt.tokenizer.encode("you are a helpful assistant who answers in short sentences about the weather");
  user2 = ckpt.tokenizer.encode(" and tomorrow?");
  ckpt.tensors.close();
}, 120_000);
afterAll(() => rmSync(root, { recursive: true, force: true }));

describe("prefix caching by block", () => {
  it("a released stream's blocks (prompt and output) serve the next turn, with the tokens of computing it", async () => {
    const engine = await CpuBackedEngine.open(modelDir, spec());
    try {
      const first = await turn(engine, sys, 10);
      expect(first.cached).toBe(0);
      const next = [...first.fed, first.out[first.out.length - 1], ...user2];
      const second = await turn(engine, next, 10);
      // every full block of turn 1's prompt and output (the last token was never fed)
      expect(second.cached).toBe(Math.floor(first.fed.length / BS) * BS);
      expect(second.cached).toBeGreaterThan(sys.length);
      expect(second.out).toEqual(await referenceTokens(modelDir, next, 10));
      const st = engine.stats().prefixCache!;
      expect(st).toMatchObject({ enabled: true, queries: 2, hits: 1, reusedTokens: second.cached, evictions: 0 });
      expect(st.blocks).toBe(Math.floor(second.fed.length / BS));
    } finally {
      await engine.close();
    }
  });

  it("KV imported with its token ids is kept by hash when its stream ends; without them it is not", async () => {
    const pre = await CpuBackedEngine.open(modelDir, spec({ prefixCaching: false }));
    const dec = await CpuBackedEngine.open(modelDir, spec());
    try {
      const r = await pre.prefill(sys, {});
      const plain = dec.importKV(r.kv!);
      dec.release(plain);
      expect(dec.stats().prefixCache!.blocks).toBe(0);
      const named = dec.importKV(r.kv!, undefined, { tokens: sys });
      const token = (await dec.decode([{ stream: named, token: r.firstToken }]))[0].token;
      dec.release(named);
      expect(dec.stats().prefixCache!.blocks).toBe(Math.floor((sys.length + 1) / BS));
      const next = [...sys, r.firstToken, token, ...user2];
      const again = await turn(dec, next, 6);
      expect(again.cached).toBe(Math.floor((sys.length + 1) / BS) * BS);
      expect(again.out).toEqual(await referenceTokens(modelDir, next, 6));
      // token ids that do not match the KV's positions are refused
      expect(() => dec.importKV(r.kv!, undefined, { tokens: sys.slice(1) })).toThrow(/token ids/);
    } finally {
      await pre.close();
      await dec.close();
    }
  });

  it("holdPrefix keeps a prefix for an import that leaves it out; the stream equals one of the whole KV", async () => {
    const pre = await CpuBackedEngine.open(modelDir, spec({ prefixCaching: false }));
    const dec = await CpuBackedEngine.open(modelDir, spec());
    try {
      const first = await turn(dec, sys, 6);
      const next = [...first.fed, first.out[first.out.length - 1], ...user2];
      const hold = dec.holdPrefix(next, { maxPositions: next.length - 1 });
      expect(hold.n).toBe(Math.floor(first.fed.length / BS) * BS);
      expect(hold.hash).toBe(
        blockHashes(
          blockHashRoot({ modelFingerprint: dec.model.modelFingerprint, numericsFingerprint: dec.model.numericsFingerprint, blockSize: BS }),
          next,
          BS,
          hold.n / BS,
        ).pop(),
      );
      const r = await pre.prefill(next, {});
      const kv = r.kv!;
      const cut = (hold.n / BS) * blockLayerBytes(dec.model, BS);
      const rest = { ...kv, from: hold.n, k: kv.k.map((b) => b.subarray(cut)), v: kv.v.map((b) => b.subarray(cut)) };
      // without the hold the cut KV is refused, and a hold of another length is too
      expect(() => dec.importKV(rest)).toThrow(/no held prefix/);
      const s = dec.importKV(rest, undefined, { held: hold, tokens: next });
      hold.release();
      const out = [r.firstToken];
      while (out.length < 6) out.push((await dec.decode([{ stream: s, token: out[out.length - 1] }]))[0].token);
      dec.release(s);
      expect(out).toEqual(await referenceTokens(modelDir, next, 6));
      expect(() => dec.importKV(rest, undefined, { held: hold })).toThrow(/held prefix/);
    } finally {
      await pre.close();
      await dec.close();
    }
  });

  it("cache_salt: blocks kept for one salt are found only with that salt", async () => {
    const engine = await CpuBackedEngine.open(modelDir, spec());
    try {
      const long = [...sys, ...user2];
      expect((await turn(engine, sys, 2, "tenant-a")).cached).toBe(0);
      expect((await turn(engine, long, 2)).cached).toBe(0);
      expect((await turn(engine, long, 2, "tenant-b")).cached).toBe(0);
      const a = await turn(engine, long, 2, "tenant-a");
      expect(a.cached).toBe(Math.floor((sys.length + 1) / BS) * BS);
      expect((await turn(engine, long, 2)).cached).toBeGreaterThanOrEqual(Math.floor(long.length / BS) * BS - BS);
    } finally {
      await engine.close();
    }
  });

  it("kept blocks go back least recently used (deepest first) when the pool runs short; the prompts still compute right", async () => {
    // a budget of the least the context takes (maxModelLen 64: 16 blocks), fewer than three tenants' chains
    const small = { variants: [{ batch: 4, seqLen: 64 }], maxModelLen: 64 };
    const probe = await CpuBackedEngine.open(modelDir, spec(small));
    const bytes = probe.kvBlockBytes();
    await probe.close();
    const engine = await CpuBackedEngine.open(modelDir, spec({ ...small, kvCacheMemory: { bytes: 16 * bytes } }));
    const events: BlockEvent[] = [];
    try {
      expect(engine.kvCache().totalBlocks).toBe(16);
      expect(3 * Math.floor((sys.length + 7) / BS)).toBeGreaterThan(16);
      engine.onBlockEvent((e) => events.push(e));
      const tenants = ["a", "b", "c"];
      for (const t of tenants) await turn(engine, sys, 8, t);
      const st = engine.stats().prefixCache!;
      expect(st.evictions).toBeGreaterThan(0);
      // tenant a's chain was the least recently used: its deepest blocks went first
      const removed = events.filter((e): e is Extract<BlockEvent, { kind: "removed" }> => e.kind === "removed").flatMap((e) => e.hashes);
      const stored = events.filter((e): e is Extract<BlockEvent, { kind: "stored" }> => e.kind === "stored");
      // tenant a's chain: its prompt's blocks, then its output's (until tenant b's chain starts from the root)
      const bStarts = stored.findIndex((e, i) => i > 0 && e.parent === null);
      const chainA = stored.slice(0, bStarts).flatMap((e) => e.hashes);
      expect(removed[0]).toBe(chainA[chainA.length - 1]);
      // the most recent tenant's prefix is still whole and reused, with the right tokens
      const again = await turn(engine, [...sys, ...user2], 6, "c");
      expect(again.cached).toBeGreaterThanOrEqual(Math.floor(sys.length / BS) * BS);
      expect(again.out).toEqual(await referenceTokens(modelDir, [...sys, ...user2], 6));
      // and tenant a's prompt computes right from what is left of its chain
      const a = await turn(engine, [...sys, ...user2], 6, "a");
      expect(a.out).toEqual(again.out);
    } finally {
      await engine.close();
    }
  });

  it("the stored events name each new block by the hash rm-core computes from the token ids", async () => {
    const engine = await CpuBackedEngine.open(modelDir, spec());
    const events: BlockEvent[] = [];
    engine.onBlockEvent((e) => events.push(e));
    try {
      await turn(engine, sys, 1);
      const stored = events.filter((e): e is Extract<BlockEvent, { kind: "stored" }> => e.kind === "stored");
      expect(stored).toHaveLength(1);
      const rootHash = blockHashRoot({ modelFingerprint: engine.model.modelFingerprint, numericsFingerprint: engine.model.numericsFingerprint, blockSize: BS });
      expect(stored[0].hashes).toEqual(blockHashes(rootHash, sys, BS));
      expect(stored[0].parent).toBeNull();
      expect(stored[0].tokens).toEqual(sys.slice(0, stored[0].hashes.length * BS));
      // the same prompt again stores nothing new
      await turn(engine, sys, 1);
      expect(events.filter((e) => e.kind === "stored")).toHaveLength(1);
    } finally {
      await engine.close();
    }
    expect(events[events.length - 1]).toEqual({ kind: "cleared" });
  });
});
