// The engine on its paged KV cache, with a generated tiny model: admission by reserved blocks,
// preemption by recompute when blocks run out (each stream still gives its solo tokens), prompt
// chunks sharing passes with running streams, forks sharing blocks, a budget too small refused
// at start, and the ATOM host-input path gathering blocks into a graph's dense input.
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { isAirmError, type DecodeResult, type Engine, type EngineVariant, type KVReservation, type KVStream } from "@airm/rm-core";
import { LlamaModel, loadCheckpoint, makeTinyModel, sample } from "@airm/llama";
import { CpuBackedEngine, type DenseKV } from "../src/index.ts";
import { testEngineSpec } from "./engine-spec.ts";

const root = mkdtempSync(join(tmpdir(), "airm-paged-"));
const modelDir = join(root, "model");
const STEPS = 12;
const TEXTS = ["hello world, this is a test", "a", "the quick brown fox jumps over the lazy dog again and again", "1 2 3 4 5 6 7"];
let prompts: number[][];
const reference: number[][] = [];

/** Greedy tokens of the model run solo. */
async function solo(tokens: number[], steps: number): Promise<number[]> {
  const ckpt = await loadCheckpoint(modelDir);
  const model = await LlamaModel.load(ckpt);
  try {
    const cache = model.newCache(tokens.length + steps);
    const out = [sample(model.prefill(tokens, cache), {}, tokens.length)];
    while (out.length < steps) out.push(sample(model.decode([{ cache, token: out[out.length - 1] }])[0], {}, cache.n));
    return out;
  } finally {
    model.close();
    ckpt.tensors.close();
  }
}

const spec = testEngineSpec;

/** Blocks of `blockSize` positions each holding (K and V, every layer) of the tiny model. */
async function blockBytes(blockSize: number): Promise<number> {
  const e = await CpuBackedEngine.open(modelDir, spec({ blockSize, maxModelLen: 64 }));
  const b = e.kvBlockBytes();
  await e.close();
  return b;
}

/** Waits until `engine.reserve(positions, extra)` succeeds (as a worker's admission does). */
async function admit(engine: Engine, positions: number, extra = 0): Promise<KVReservation> {
  for (;;) {
    const r = engine.reserve(positions, extra);
    if (r) return r;
    await new Promise<void>((resolve) => {
      const off = engine.onBlocksFreed(() => {
        off();
        resolve();
      });
    });
  }
}

/**
 * Generates `steps` tokens from `prompt` the way a worker does: admission by blocks, prefill,
 * decode steps; a preempted stream waits for blocks, is recomputed from its tokens, and goes on.
 */
async function serve(engine: Engine, prompt: number[], steps: number, counters: { preempted: number }): Promise<number[]> {
  const r = await engine.prefill(prompt, { keepStream: true, reservation: await admit(engine, prompt.length + 1) });
  const stream = r.stream!;
  const out = [r.firstToken];
  try {
    while (out.length < steps) {
      const [next]: DecodeResult[] = await engine.decode([{ stream, token: out[out.length - 1] }]);
      if (next.error !== undefined) {
        expect(isAirmError(next.error, "PREEMPTED")).toBe(true);
        expect(stream.preempted).toBe(true);
        counters.preempted++;
        // the stream's positions: the prompt and every token but the last (the next step's input)
        const tokens = [...prompt, ...out.slice(0, -1)];
        await engine.recompute(stream, tokens, await admit(engine, tokens.length + 1));
        expect(stream.length).toBe(tokens.length);
        continue;
      }
      out.push(next.token);
    }
    return out;
  } finally {
    engine.release(stream);
  }
}

beforeAll(async () => {
  makeTinyModel({ arch: "llama", out: modelDir, layers: 2, seed: 11 });
  const ckpt = await loadCheckpoint(modelDir);
  prompts = TEXTS.map((p) => ckpt.tokenizer.encode(p));
  ckpt.tensors.close();
  for (const p of prompts) reference.push(await solo(p, STEPS));
}, 120_000);
afterAll(() => rmSync(root, { recursive: true, force: true }));

describe("admission and preemption", () => {
  it("with a pool too small for every stream at once, the newest are preempted and recomputed, and each stream gives its solo tokens", async () => {
    const bs = 8;
    const blocks = 12; // one request of max_model_len 64 takes 8
    const engine = await CpuBackedEngine.open(modelDir, spec({ blockSize: bs, maxModelLen: 64, kvCacheMemory: { bytes: blocks * (await blockBytes(bs)) } }));
    try {
      expect(engine.kvCache()).toMatchObject({ blockSize: bs, totalBlocks: blocks, usedBlocks: 0, maxModelLen: 64 });
      const need = prompts.reduce((a, p) => a + Math.ceil((p.length + STEPS) / bs), 0);
      expect(need).toBeGreaterThan(blocks); // they cannot all hold their blocks at once
      const counters = { preempted: 0 };
      const runs = await Promise.all(prompts.map((p) => serve(engine, p, STEPS, counters)));
      runs.forEach((r, i) => expect(r, `prompt ${i}`).toEqual(reference[i]));
      expect(counters.preempted).toBeGreaterThan(0);
      expect(engine.kvCache().preemptions).toBe(counters.preempted);
      expect(engine.kvCache()).toMatchObject({ usedBlocks: 0, freeBlocks: blocks });
      // with room for all, nothing is preempted and the tokens are the same
      const roomy = await CpuBackedEngine.open(modelDir, spec({ blockSize: bs, maxModelLen: 64 }));
      try {
        const none = { preempted: 0 };
        expect(await Promise.all(prompts.map((p) => serve(roomy, p, STEPS, none)))).toEqual(runs);
        expect(none.preempted).toBe(0);
      } finally {
        await roomy.close();
      }
    } finally {
      await engine.close();
    }
  });

  it("reserves blocks all or nothing, refuses more than the pool by naming it, and says when blocks come back", async () => {
    const bs = 16;
    const engine = await CpuBackedEngine.open(modelDir, spec({ blockSize: bs, maxModelLen: 64, kvCacheMemory: { bytes: 6 * (await blockBytes(bs)) } }));
    try {
      const a = engine.reserve(64)!; // 4 blocks
      expect(a.blocks).toBe(4);
      expect(engine.kvCache()).toMatchObject({ usedBlocks: 4, freeBlocks: 2 });
      expect(engine.reserve(33)).toBeNull(); // 3 blocks: not now
      let freed = 0;
      const off = engine.onBlocksFreed(() => freed++);
      a.release();
      expect(freed).toBe(1);
      off();
      expect(engine.kvCache()).toMatchObject({ usedBlocks: 0, freeBlocks: 6 });
      try {
        engine.reserve(97);
        expect.unreachable();
      } catch (e) {
        expect(isAirmError(e, "CONTEXT_OVERFLOW")).toBe(true);
        expect((e as Error).message).toMatch(/97 tokens exceeds the KV cache of 96 tokens \(6 blocks of 16 positions\)/);
      }
      // a prefill given a reservation spends it; one without takes free blocks or fails alone
      const r = await engine.prefill(prompts[2], { keepStream: true, reservation: engine.reserve(prompts[2].length + 1)! });
      expect(engine.kvCache().usedBlocks).toBe(Math.ceil((prompts[2].length + 1) / bs));
      engine.release(r.stream!);
      expect(engine.kvCache().usedBlocks).toBe(0);
    } finally {
      await engine.close();
    }
  });

  it("a reservation leaves a free block for each stream holding KV here (its next step may take one), so what it admits is not preempted at once", async () => {
    const bs = 16;
    const engine = await CpuBackedEngine.open(modelDir, spec({ blockSize: bs, maxModelLen: 64, kvCacheMemory: { bytes: 6 * (await blockBytes(bs)) } }));
    try {
      const prompt = Array.from({ length: 20 }, (_, i) => 5 + i);
      const r = await engine.prefill(prompt, { keepStream: true, reservation: engine.reserve(prompt.length + 1)! });
      expect(engine.kvCache()).toMatchObject({ usedBlocks: 2, freeBlocks: 4 });
      expect(engine.reserve(64)).toBeNull(); // 4 blocks would leave the stream none to grow into
      const three = engine.reserve(48)!;
      expect(three.blocks).toBe(3);
      three.release();
      engine.release(r.stream!);
      const four = engine.reserve(64)!; // no stream here: all of them
      expect(four.blocks).toBe(4);
      four.release();
    } finally {
      await engine.close();
    }
  });

  it("refuses at start a budget that cannot hold one request of max_model_len, and a max_model_len past the model's context", async () => {
    const bb = await blockBytes(16);
    await expect(CpuBackedEngine.open(modelDir, spec({ maxModelLen: 64, kvCacheMemory: { bytes: 3 * bb } }))).rejects.toThrow(
      /kv-cache-memory: the KV cache .* holds 3 blocks of 16 positions \(48 tokens\), fewer than one request of max_model_len 64 needs \(4 blocks/,
    );
    await expect(CpuBackedEngine.open(modelDir, spec({ maxModelLen: 100_000 }))).rejects.toThrow(/max-model-len: 100000 is past the model's context of 2048 tokens/);
    const e = await CpuBackedEngine.open(modelDir, spec());
    try {
      // the model's own context, and the context buckets an NPU compiles up to it
      expect(e.kvCache().maxModelLen).toBe(2048);
      expect([...new Set(e.variants().map((v) => v.seqLen))]).toEqual([512, 1024, 2048]);
    } finally {
      await e.close();
    }
  });
});

describe("chunked prefill beside running streams", () => {
  it("a long prompt prefills in chunks that share passes with decoding streams; every token equals its solo run", async () => {
    const long = Array.from({ length: 6 }, () => prompts[2])
      .flat()
      .slice(0, 100);
    const longRef = await solo(long, 4);
    const engine = await CpuBackedEngine.open(modelDir, spec({ maxModelLen: 256 }));
    try {
      const counters = { preempted: 0 };
      const decoding = prompts.map((p) => serve(engine, p, 40, counters));
      // the streams are running when the long prompt comes
      await new Promise((r) => setTimeout(r, 5));
      const r = await engine.prefill(long, { keepStream: true });
      const out = [r.firstToken];
      while (out.length < 4) out.push((await engine.decode([{ stream: r.stream!, token: out[out.length - 1] }]))[0].token);
      engine.release(r.stream!);
      expect(out).toEqual(longRef);
      const runs = await Promise.all(decoding);
      for (const [i, run] of runs.entries()) expect(run.slice(0, STEPS)).toEqual(reference[i]);
      const passes = engine.passCounts();
      expect(passes.mixed).toBeGreaterThan(0); // chunks rode along with decode steps
      expect(passes.chunks).toBeGreaterThan(passes.prompts); // the long prompt took more than one chunk
    } finally {
      await engine.close();
    }
  });

  it("a stream that takes a few turns to queue its next step (a worker writes its token out first) is in every pass a chunk takes", async () => {
    const long = Array.from({ length: 6 }, () => prompts[2])
      .flat()
      .slice(0, 100);
    const engine = await CpuBackedEngine.open(modelDir, spec({ maxModelLen: 1024 }));
    const turns = async (n: number): Promise<void> => {
      for (let i = 0; i < n; i++) await new Promise<void>((r) => setImmediate(r));
    };
    try {
      let prompting = true;
      const streams = prompts.map(async (p) => {
        const r = await engine.prefill(p, { keepStream: true, reservation: await admit(engine, p.length + 1) });
        const out = [r.firstToken];
        try {
          while ((prompting && out.length < 900) || out.length < STEPS) {
            const [next] = await engine.decode([{ stream: r.stream!, token: out[out.length - 1] }]);
            out.push(next.token);
            await turns(3);
          }
          return out;
        } finally {
          engine.release(r.stream!);
        }
      });
      await new Promise((r) => setTimeout(r, 20));
      const before = engine.passCounts();
      const r = await engine.prefill(long, {});
      const after = engine.passCounts();
      prompting = false;
      const runs = await Promise.all(streams);
      for (const [i, run] of runs.entries()) expect(run.slice(0, STEPS)).toEqual(reference[i]);
      expect(r.firstToken).toBe((await solo(long, 1))[0]);
      expect(after.chunks - before.chunks).toBeGreaterThan(1);
      // every pass that carried a chunk of the long prompt carried the streams' steps too
      expect(after.prefillPasses - before.prefillPasses).toBe(after.mixed - before.mixed);
    } finally {
      await engine.close();
    }
  });

  it("a prompt longer than the pass budget runs in chunks of it, with the bits of one pass", async () => {
    const long = Array.from({ length: 6 }, () => prompts[2])
      .flat()
      .slice(0, 100);
    const whole = await CpuBackedEngine.open(modelDir, spec({ maxModelLen: 256 }));
    const small = await CpuBackedEngine.open(modelDir, spec({ maxModelLen: 256, maxNumBatchedTokens: 16 }));
    try {
      const a = await whole.prefill(long, {});
      const b = await small.prefill(long, {});
      expect(b.firstToken).toBe(a.firstToken);
      for (let l = 0; l < 2; l++) expect(Buffer.from(b.kv!.k[l]).equals(Buffer.from(a.kv!.k[l])) && Buffer.from(b.kv!.v[l]).equals(Buffer.from(a.kv!.v[l]))).toBe(true);
      expect(small.passCounts()).toMatchObject({ prefillPasses: Math.ceil(long.length / 16), prompts: 1 });
      expect(whole.passCounts()).toMatchObject({ prefillPasses: 1, prompts: 1 });
    } finally {
      await whole.close();
      await small.close();
    }
  });
});

describe("forks (the choices of one request)", () => {
  it("share every full block, copy the shared last one when written, and each gives the solo tokens", async () => {
    const engine = await CpuBackedEngine.open(modelDir, spec({ blockSize: 4, maxModelLen: 64 }));
    try {
      const p = prompts[2];
      const r = await engine.prefill(p, { keepStream: true });
      const held = engine.kvCache().usedBlocks;
      const forks: KVStream[] = [r.stream!, engine.fork(r.stream!), engine.fork(r.stream!)];
      expect(engine.kvCache().usedBlocks).toBe(held); // nothing copied yet
      const outs = forks.map(() => [r.firstToken]);
      while (outs[0].length < STEPS) {
        const next = await engine.decode(forks.map((stream, i) => ({ stream, token: outs[i][outs[i].length - 1] })));
        next.forEach((n, i) => outs[i].push(n.token));
      }
      for (const o of outs) expect(o).toEqual(reference[2]);
      for (const f of forks) engine.release(f);
      expect(engine.kvCache().usedBlocks).toBe(0);
    } finally {
      await engine.close();
    }
  });
});

describe("the ATOM host-input path (a graph fake at the binding boundary)", () => {
  it("gathers each stream's blocks into the dense input of the smallest compiled context that holds it, and writes the new position back into its block", async () => {
    const ckpt = await loadCheckpoint(modelDir);
    const model = await LlamaModel.load(ckpt, { kv: { blockSize: 16 } });
    const opened: string[] = [];
    // The fake graph: rebuilds each stream's cache from the dense input and runs one CPU step,
    // returning the logits and the new position's K/V as [kv_heads, head_dim] columns.
    const native = {
      open(v: EngineVariant) {
        opened.push(`B${v.batch}xS${v.seqLen}`);
        return {
          step(host: DenseKV[], tokens: number[]) {
            return host.map((h, i) => {
              expect(h.seqLen).toBe(v.seqLen);
              const c = model.newCache(h.n + 1);
              model.importKV(c, denseToBlocks(h, ckpt.config.numKvHeads, ckpt.config.headDim, ckpt.config.numLayers));
              const logits = model.decode([{ cache: c, token: tokens[i] }])[0];
              const col = columnAt(model.exportKV(c), h.n, ckpt.config.numKvHeads, ckpt.config.headDim);
              model.freeCache(c);
              return { logits, ...col };
            });
          },
          close() {},
        };
      },
    };
    const engine = await CpuBackedEngine.open(
      modelDir,
      spec({
        residence: "host",
        maxModelLen: 64,
        variants: [
          { batch: 2, seqLen: 16 },
          { batch: 2, seqLen: 32 },
          { batch: 2, seqLen: 64 },
        ],
        nativeHostDecode: native,
      }),
    );
    try {
      const started = await Promise.all(prompts.slice(0, 3).map((p) => engine.prefill(p, { keepStream: true })));
      const outs = started.map((r) => [r.firstToken]);
      while (outs[0].length < STEPS) {
        const next = await engine.decode(started.map((r, i) => ({ stream: r.stream!, token: outs[i][outs[i].length - 1] })));
        next.forEach((n, i) => outs[i].push(n.token));
      }
      outs.forEach((o, i) => expect(o).toEqual(reference[i]));
      // three streams in groups of two; contexts grew past 16 into the S=32 graphs
      expect(opened).toContain("B2xS32");
      expect(opened.some((n) => n.endsWith("S16"))).toBe(true);
    } finally {
      await engine.close();
      model.close();
      ckpt.tensors.close();
    }
  });
});

/** A dense input (K [kvh][D][S], V [kvh][S][D]) back into blobs of 16-position blocks. */
function denseToBlocks(h: DenseKV, kvh: number, D: number, layers: number) {
  const bs = 16;
  const nb = Math.ceil(h.n / bs);
  const kb = kvh * D * bs * 2;
  const k: Uint8Array[] = [];
  const v: Uint8Array[] = [];
  for (let l = 0; l < layers; l++) {
    const K = new Uint8Array(nb * kb);
    const V = new Uint8Array(nb * kb);
    for (let p = 0; p < h.n; p++) {
      const j = Math.floor(p / bs);
      const o = p % bs;
      for (let r = 0; r < kvh * D; r++) K.set(h.k[l].subarray((r * h.seqLen + p) * 2, (r * h.seqLen + p) * 2 + 2), j * kb + (r * bs + o) * 2);
      for (let g = 0; g < kvh; g++) V.set(h.v[l].subarray((g * h.seqLen + p) * D * 2, (g * h.seqLen + p + 1) * D * 2), j * kb + (g * bs + o) * D * 2);
    }
    k.push(K);
    v.push(V);
  }
  return { blockSize: bs, n: h.n, k, v };
}

/** Position `p`'s K and V per layer as [kv_heads, head_dim] columns, from blobs of 16-position blocks. */
function columnAt(kv: { k: Uint8Array[]; v: Uint8Array[] }, p: number, kvh: number, D: number): { k: Uint8Array[]; v: Uint8Array[] } {
  const bs = 16;
  const kb = kvh * D * bs * 2;
  const j = Math.floor(p / bs);
  const o = p % bs;
  return {
    k: kv.k.map((K) => {
      const col = new Uint8Array(kvh * D * 2);
      for (let r = 0; r < kvh * D; r++) col.set(K.subarray(j * kb + (r * bs + o) * 2, j * kb + (r * bs + o) * 2 + 2), r * 2);
      return col;
    }),
    v: kv.v.map((V) => {
      const col = new Uint8Array(kvh * D * 2);
      for (let g = 0; g < kvh; g++) col.set(V.subarray(j * kb + (g * bs + o) * D * 2, j * kb + (g * bs + o + 1) * D * 2), g * D * 2);
      return col;
    }),
  };
}
