// The shared engine mechanics on the real CPU reference model (@airm/llama) with a generated
// tiny model: tokens equal the model run solo, across prefill modes, cache residences, batches,
// processes-worth of KV export/import, variant swaps and delta loads.
import { cpSync, mkdtempSync, readFileSync, readdirSync, rmSync, statSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { isAirmError } from "@airm/rm-core";
import { LlamaModel, loadCheckpoint, makeTinyModel, sample, tokenLogprobs } from "@airm/llama";
import { ArtifactCache, CpuBackedEngine, engineTokens, type CpuEngineSpec } from "../src/index.ts";
import type { Engine, KVStream, PrefillResult } from "@airm/rm-core";
import { bf16, editCheckpoint } from "./checkpoint-edit.ts";
import { testEngineSpec } from "./engine-spec.ts";

const root = mkdtempSync(join(tmpdir(), "airm-engine-"));
const modelDir = join(root, "model");
const S = 64;
const PROMPTS = ["hello world, this is a test", "a", "the quick brown fox jumps over the lazy dog again and again", "1 2 3 4 5 6 7"];
const STEPS = 12;
let prompts: number[][];
const reference = new Map<string, number[]>();

/** Greedy tokens of the model run solo (prefill, then decode one token at a time). */
async function solo(dir: string, tokens: number[], steps: number, weights?: "q8_0" | "q4_1"): Promise<number[]> {
  const ckpt = await loadCheckpoint(dir);
  const model = await LlamaModel.load(ckpt, { weights });
  try {
    const cache = model.newCache(S);
    const out = [sample(model.prefill(tokens, cache), {}, tokens.length)];
    while (out.length < steps) out.push(sample(model.decode([{ cache, token: out[out.length - 1] }])[0], {}, cache.n));
    return out;
  } finally {
    model.close();
    ckpt.tensors.close();
  }
}

function spec(over: Partial<CpuEngineSpec> = {}): CpuEngineSpec {
  return testEngineSpec({
    variants: [
      { batch: 1, seqLen: S },
      { batch: 4, seqLen: S },
      { batch: 4, seqLen: 2 * S },
    ],
    activeVariant: { batch: 4, seqLen: S },
    artifactCache: new ArtifactCache(join(root, "artifacts")),
    ...over,
  });
}

const generate = (engine: Engine, tokens: number[], steps: number) => engineTokens(engine, tokens, steps);

beforeAll(async () => {
  makeTinyModel({ arch: "llama", out: modelDir, layers: 2, seed: 7 });
  const ckpt = await loadCheckpoint(modelDir);
  prompts = PROMPTS.map((p) => ckpt.tokenizer.encode(p));
  ckpt.tensors.close();
  for (const [i, p] of prompts.entries()) reference.set(String(i), await solo(modelDir, p, STEPS));
}, 120_000);
afterAll(() => rmSync(root, { recursive: true, force: true }));

describe("prefill and decode equal the model run solo", () => {
  const modes: [CpuEngineSpec["prefillMode"], CpuEngineSpec["residence"]][] = [
    ["whole", "device"],
    ["chunked", "device"],
    ["whole", "host"],
  ];
  for (const [prefillMode, residence] of modes) {
    it(`${prefillMode} prefill, ${residence} cache`, async () => {
      const engine = await CpuBackedEngine.open(modelDir, spec({ prefillMode, residence }));
      try {
        for (const [i, p] of prompts.entries()) expect(await generate(engine, p, STEPS)).toEqual(reference.get(String(i)));
      } finally {
        await engine.close();
      }
    });
  }

  it("chunked and whole prefill give the same KV bytes, and onLayer sees each layer once, in order", async () => {
    const whole = await CpuBackedEngine.open(modelDir, spec());
    const chunked = await CpuBackedEngine.open(modelDir, spec({ prefillMode: "chunked" }));
    try {
      const seen: number[] = [];
      const a = await whole.prefill(prompts[2], {
        onLayer: async (l, k, v) => {
          seen.push(l);
          expect(k.some((x) => x !== 0) && v.some((x) => x !== 0)).toBe(true); // already computed
          expect(k.length).toBe(Math.ceil(prompts[2].length / 16) * whole.model.kvHeads * whole.model.headDim * 16 * 2); // the prompt's blocks
          expect(v.length).toBe(k.length);
          await new Promise((r) => setImmediate(r));
        },
      });
      const b = await chunked.prefill(prompts[2], {});
      expect(seen).toEqual([0, 1]);
      expect(a.firstToken).toBe(b.firstToken);
      expect(a.kv!.n).toBe(prompts[2].length);
      for (let l = 0; l < 2; l++) {
        expect(Buffer.from(a.kv!.k[l]).equals(Buffer.from(b.kv!.k[l]))).toBe(true);
        expect(Buffer.from(a.kv!.v[l]).equals(Buffer.from(b.kv!.v[l]))).toBe(true);
      }
      expect(a.kv!.k[0].some((x) => x !== 0)).toBe(true);
    } finally {
      await whole.close();
      await chunked.close();
    }
  });

  it("lets the event loop run during a prefill, and prefills and decode steps issued together take turns without changing a token", async () => {
    for (const prefillMode of ["whole", "chunked"] as const) {
      const engine = await CpuBackedEngine.open(modelDir, spec({ prefillMode }));
      try {
        // The event loop turns while the prefill runs (a worker's /health answers): count the
        // turns with a self-renewing setImmediate. A timer would be the wrong probe: a prefill of
        // this tiny model can end within a timer's 1 ms (it did on a fast CI machine).
        let turns = 0;
        let done = false;
        const turn = (): void => {
          if (done) return;
          turns++;
          setImmediate(turn);
        };
        setImmediate(turn);
        const long = await engine.prefill(prompts[2], {});
        done = true;
        expect(turns).toBeGreaterThanOrEqual(2); // at least one pause per layer (2 layers)
        expect(long.firstToken).toBe(reference.get("2")![0]);
        // Everything at once on one engine: each prompt's generation still equals its solo run.
        const runs = await Promise.all(prompts.map((p) => generate(engine, p, STEPS)));
        runs.forEach((r, i) => expect(r).toEqual(reference.get(String(i))));
      } finally {
        await engine.close();
      }
    }
  });

  it("with prefillBatchTokens, whole prompts that arrive while the model computes run together in one pass, each with the KV bytes and first token it gets alone", async () => {
    const alone = await CpuBackedEngine.open(modelDir, spec({ blockSize: 4 }));
    const batched = await CpuBackedEngine.open(modelDir, spec({ prefixCaching: true, prefillBatchTokens: 1024, blockSize: 4 }));
    try {
      const burst = [...prompts, [...prompts[2].slice(0, 9), 5, 6, 7], prompts[1]];
      const solo: PrefillResult[] = [];
      for (const p of burst) solo.push(await alone.prefill([...p], {}));
      // without prefillBatchTokens (the default) a burst still runs one prompt per pass
      await Promise.all(burst.slice(0, 3).map((p) => alone.prefill([...p], {})));
      expect(alone.stats().prefillPasses).toEqual({ passes: burst.length + 3, prompts: burst.length + 3 });
      await batched.prefill([...prompts[2]], {}); // kept: the burst's 5th prompt reuses its prefix
      const layers = burst.map(() => [] as number[]);
      const got = await Promise.all(burst.map((p, i) => batched.prefill([...p], { onLayer: (l) => void layers[i].push(l) })));
      // prompts issued in one turn of the event loop go in one pass
      expect(batched.stats().prefillPasses).toEqual({ passes: 2, prompts: burst.length + 1 });
      expect(got[4].cachedTokens).toBe(8);
      got.forEach((g, i) => {
        expect(g.firstToken, `prompt ${i}`).toBe(solo[i].firstToken);
        expect(g.kv!.n).toBe(burst[i].length);
        expect(layers[i]).toEqual([0, 1]);
        for (let l = 0; l < 2; l++) {
          expect(Buffer.from(g.kv!.k[l]).equals(Buffer.from(solo[i].kv!.k[l])), `prompt ${i} K ${l}`).toBe(true);
          expect(Buffer.from(g.kv!.v[l]).equals(Buffer.from(solo[i].kv!.v[l])), `prompt ${i} V ${l}`).toBe(true);
        }
      });
      // prompts that arrive while a pass computes wait for it, then go together in the next one
      const first = batched.prefill([...prompts[2]], {});
      await new Promise((r) => setImmediate(r)); // the first pass is under way (it pauses after each block)
      const later = await Promise.all([0, 1, 3].map((i) => batched.prefill([...prompts[i]], {})));
      expect((await first).firstToken).toBe(solo[2].firstToken);
      later.forEach((g, j) => expect(g.firstToken).toBe(solo[[0, 1, 3][j]].firstToken));
      expect(batched.stats().prefillPasses).toEqual({ passes: 4, prompts: burst.length + 5 });
      // and generations started from batched prefills equal the model run solo
      const runs = await Promise.all(prompts.map((p) => generate(batched, p, STEPS)));
      runs.forEach((r, i) => expect(r).toEqual(reference.get(String(i))));
      // a bad prompt in a burst fails alone; the others are served
      const mixed = await Promise.allSettled([batched.prefill([...prompts[0]], {}), batched.prefill([...prompts[2]], {}), batched.prefill([1, 1e9], {})]);
      expect(mixed.map((m) => m.status)).toEqual(["fulfilled", "fulfilled", "rejected"]);
    } finally {
      await alone.close();
      await batched.close();
    }
  });

  it("prefix cache: a prompt that starts like a kept one shares its blocks and gives the same bits as computing it", async () => {
    for (const prefillMode of ["whole", "chunked"] as const) {
      const plain = await CpuBackedEngine.open(modelDir, spec({ prefillMode, blockSize: 4 }));
      // blocks of 4 positions: these short prompts share whole blocks
      const cached = await CpuBackedEngine.open(modelDir, spec({ prefillMode, prefixCaching: true, blockSize: 4 }));
      try {
        const base = prompts[2]; // 13+ tokens
        const sharing = [...base.slice(0, 9), 5, 6, 7]; // 9 shared tokens: 8 reusable in blocks of 4
        const other = [...base.slice(0, 3), 9, 9, 9, 9, 9]; // shares fewer than a block
        expect((await cached.prefill(base, {})).cachedTokens).toBe(0);
        for (const [tokens, reused] of [
          [sharing, 8],
          [other, 0],
          [base, Math.floor((base.length - 1) / 4) * 4], // itself again: every whole block short of the last token
        ] as const) {
          const a = await cached.prefill([...tokens], {});
          const b = await plain.prefill([...tokens], {});
          expect(a.cachedTokens).toBe(reused);
          expect(b.cachedTokens).toBe(0);
          expect(a.firstToken).toBe(b.firstToken);
          for (let l = 0; l < 2; l++) {
            expect(Buffer.from(a.kv!.k[l]).equals(Buffer.from(b.kv!.k[l]))).toBe(true);
            expect(Buffer.from(a.kv!.v[l]).equals(Buffer.from(b.kv!.v[l]))).toBe(true);
          }
        }
        // Generations from a reused prefix equal the model run solo.
        expect(await generate(cached, base, STEPS)).toEqual(reference.get("2"));
        expect(cached.stats().prefixCache).toMatchObject({ enabled: true, hits: 3 });
        expect(plain.stats().prefixCache).toMatchObject({ enabled: false, queries: 0, blocks: 0 });
        // Echo (prompt log-probabilities) computes every position: no reuse.
        expect((await cached.prefill(sharing, { promptLogprobs: true, logprobs: 0 })).cachedTokens).toBe(0);
      } finally {
        await plain.close();
        await cached.close();
      }
    }
  });

  it("a prompt that reuses the idle cache of a longer one gets the KV bytes of a fresh engine (positions past it are zero)", async () => {
    for (const residence of ["device", "host"] as const) {
      const used = await CpuBackedEngine.open(modelDir, spec({ residence }));
      const fresh = await CpuBackedEngine.open(modelDir, spec({ residence }));
      try {
        await used.prefill(prompts[2], {}); // the longest prompt first, in the cache the next one reuses
        const short = prompts[1];
        const a = await used.prefill(short, {});
        const b = await fresh.prefill(short, {});
        expect(prompts[2].length).toBeGreaterThan(short.length + 4);
        for (let l = 0; l < 2; l++) {
          expect(Buffer.from(a.kv!.k[l]).equals(Buffer.from(b.kv!.k[l]))).toBe(true);
          expect(Buffer.from(a.kv!.v[l]).equals(Buffer.from(b.kv!.v[l]))).toBe(true);
        }
        // A long prompt, a failed one (positions written, then thrown away), then the short one again.
        await used.prefill(prompts[2], {});
        await expect(used.prefill(prompts[2], { onLayer: () => Promise.reject(new Error("push failed")) })).rejects.toThrow("push failed");
        const c = await used.prefill(short, {});
        for (let l = 0; l < 2; l++) expect(Buffer.from(c.kv!.k[l]).equals(Buffer.from(b.kv!.k[l])) && Buffer.from(c.kv!.v[l]).equals(Buffer.from(b.kv!.v[l]))).toBe(true);
      } finally {
        await used.close();
        await fresh.close();
      }
    }
  });

  it("a rejected onLayer promise fails the prefill and frees its stream", async () => {
    const engine = await CpuBackedEngine.open(modelDir, spec());
    try {
      await expect(engine.prefill(prompts[0], { keepStream: true, onLayer: (l) => (l === 1 ? Promise.reject(new Error("push failed")) : undefined) })).rejects.toThrow(
        "push failed",
      );
      expect(engine.stats().streams).toBe(0);
    } finally {
      await engine.close();
    }
  });
});

describe("log-probabilities", () => {
  it("prefill and decode return the log-softmax of the logits the model gives solo, prompt ones too, in every prefill mode and residence", async () => {
    const p = prompts[2]!;
    const steps = 5;
    // the reference: the model alone, teacher-forced over the prompt, then greedy decode
    const ckpt = await loadCheckpoint(modelDir);
    const model = await LlamaModel.load(ckpt);
    const want: { prompt: ReturnType<typeof tokenLogprobs>[]; generated: ReturnType<typeof tokenLogprobs>[] } = { prompt: [], generated: [] };
    try {
      const cache = model.newCache(S);
      const rows = model.prefillAllLogits(p, cache);
      want.prompt = p.slice(1).map((t, i) => tokenLogprobs(rows[i]!, t, 3));
      let logits = rows[rows.length - 1]!;
      for (let i = 0; i < steps; i++) {
        const t = sample(logits, {}, cache.n);
        want.generated.push(tokenLogprobs(logits, t, 3));
        logits = model.decode([{ cache, token: t }])[0]!;
      }
    } finally {
      model.close();
      ckpt.tensors.close();
    }
    for (const [prefillMode, residence] of [
      ["whole", "device"],
      ["chunked", "device"],
      ["whole", "host"],
    ] as const) {
      const engine = await CpuBackedEngine.open(modelDir, spec({ prefillMode, residence }));
      try {
        const r = await engine.prefill(p, { keepStream: true, logprobs: 3, promptLogprobs: true });
        expect(r.promptLogprobs, `${prefillMode}/${residence}`).toEqual(want.prompt);
        const got = [r.firstLogprobs];
        let token = r.firstToken;
        while (got.length < steps) {
          const [next] = await engine.decode([{ stream: r.stream!, token, logprobs: 3 }]);
          got.push(next!.logprobs);
          token = next!.token;
        }
        expect(got, `${prefillMode}/${residence}`).toEqual(want.generated);
        engine.release(r.stream!);
        // none asked for: none computed
        const plain = await engine.prefill(p, {});
        expect(plain.firstLogprobs).toBeUndefined();
        expect(plain.promptLogprobs).toBeUndefined();
        await expect(engine.prefill(p, { logprobs: -1 })).rejects.toMatchObject({ code: "CONFIG" });
      } finally {
        await engine.close();
      }
    }
  });
});

describe("KV handoff and batching", () => {
  it("prefill in one engine, export, import into another (either residence) continues exactly", async () => {
    const prefill = await CpuBackedEngine.open(modelDir, spec({ prefillMode: "chunked" }));
    const decoders = [await CpuBackedEngine.open(modelDir, spec()), await CpuBackedEngine.open(modelDir, spec({ residence: "host" }))];
    try {
      for (const [i, p] of prompts.entries()) {
        const r = await prefill.prefill(p, {});
        // What crosses a transport: fresh copies of the layer blobs.
        const wire = { blockSize: r.kv!.blockSize, n: r.kv!.n, k: r.kv!.k.map((x) => new Uint8Array(x)), v: r.kv!.v.map((x) => new Uint8Array(x)) };
        for (const d of decoders) {
          const stream = d.importKV(wire);
          const out = [r.firstToken];
          while (out.length < STEPS) out.push((await d.decode([{ stream, token: out[out.length - 1] }]))[0].token);
          expect(out).toEqual(reference.get(String(i)));
          const back = d.exportKV(stream);
          expect(back.n).toBe(p.length + STEPS - 1);
          d.release(stream);
        }
      }
    } finally {
      await prefill.close();
      for (const d of decoders) await d.close();
    }
  });

  it("streams decoded together in one batch give the tokens they give alone", async () => {
    for (const residence of ["device", "host"] as const) {
      const engine = await CpuBackedEngine.open(modelDir, spec({ residence }));
      try {
        const started = await Promise.all(prompts.map((p) => engine.prefill(p, { keepStream: true })));
        const outs = started.map((r) => [r.firstToken]);
        while (outs[0].length < STEPS) {
          const next = await engine.decode(started.map((r, i) => ({ stream: r.stream!, token: outs[i][outs[i].length - 1] })));
          next.forEach((r, i) => outs[i].push(r.token));
        }
        outs.forEach((o, i) => expect(o).toEqual(reference.get(String(i))));
        expect(engine.stats().streams).toBe(prompts.length);
        // the blocks of the positions in use, not a context's worth per stream
        const blocks = prompts.reduce((a, p) => a + Math.ceil((p.length + STEPS - 1) / 16), 0);
        expect(engine.stats().kvBytes).toBe(blocks * engine.kvBlockBytes());
      } finally {
        await engine.close();
      }
    }
  });

  it("host-input decode under churn (streams joining, leaving, skipping steps, prefills in between, fewer idle caches than streams) gives each stream its solo tokens", async () => {
    // A working cache that still holds a stream's positions from its previous step is reused
    // without the copy; anything else (another stream, a prefill) must make it copy again.
    for (const batch of [4, 2]) {
      const engine = await CpuBackedEngine.open(modelDir, spec({ residence: "host", variants: [{ batch, seqLen: S }], activeVariant: { batch, seqLen: S } }));
      try {
        const outs: number[][] = prompts.map(() => []);
        const streams: (KVStream | undefined)[] = prompts.map(() => undefined);
        // step s: which streams take a step (a stream starts with its prefill the first time it is named)
        const schedule = [[0], [0, 1], [1, 2, 0], [2], [3, 2], [0, 3], [3, 1, 0, 2], [1], [2, 1, 3, 0], [0, 2], [3], [1, 3, 2, 0]];
        for (let round = 0; outs.some((o) => o.length < STEPS); round++) {
          const names = schedule[round % schedule.length].filter((i) => outs[i].length < STEPS);
          const stepping: number[] = [];
          for (const i of names) {
            if (streams[i]) stepping.push(i);
            else {
              const r = await engine.prefill(prompts[i], { keepStream: true });
              streams[i] = r.stream!;
              outs[i].push(r.firstToken);
            }
          }
          if (stepping.length === 0) continue;
          const next = await engine.decode(stepping.map((i) => ({ stream: streams[i]!, token: outs[i][outs[i].length - 1] })));
          next.forEach((r, j) => outs[stepping[j]].push(r.token));
          for (const i of stepping) if (outs[i].length === STEPS) engine.release(streams[i]!);
        }
        outs.forEach((o, i) => expect(o, `batch ${batch}, prompt ${i}`).toEqual(reference.get(String(i))));
      } finally {
        await engine.close();
      }
    }
  });
  it("refuses bad KV, foreign or released streams and full caches with typed errors", async () => {
    const engine = await CpuBackedEngine.open(modelDir, spec());
    const other = await CpuBackedEngine.open(modelDir, spec());
    try {
      const r = await engine.prefill(prompts[0], {});
      const code = (fn: () => unknown): string => {
        try {
          fn();
        } catch (e) {
          return isAirmError(e) ? e.code : String(e);
        }
        return "none";
      };
      expect(code(() => engine.importKV({ ...r.kv!, k: r.kv!.k.slice(0, 1) }))).toBe("KV_INTEGRITY");
      expect(code(() => engine.importKV({ ...r.kv!, n: 17 }))).toBe("KV_INTEGRITY");
      expect(code(() => engine.importKV({ ...r.kv!, k: r.kv!.k.map((x) => x.subarray(1)) }))).toBe("KV_INTEGRITY");
      expect(code(() => engine.importKV({ blockSize: 8, n: 1, k: r.kv!.k, v: r.kv!.v }))).toBe("KV_INTEGRITY");
      expect(() => engine.importKV({ blockSize: 8, n: 1, k: r.kv!.k, v: r.kv!.v })).toThrow(/blocks of 8 positions; this engine uses 16/);
      const s = other.importKV(r.kv!);
      await expect(engine.decode([{ stream: s, token: 1 }])).rejects.toMatchObject({ code: "KV_INTEGRITY" });
      other.release(s);
      await expect(other.decode([{ stream: s, token: 1 }])).rejects.toMatchObject({ code: "KV_INTEGRITY" });
      // a stream at max_model_len (the largest compiled context here, 2S) takes no step more
      const blob = () => new Uint8Array(((2 * S) / 16) * engine.model.kvHeads * engine.model.headDim * 16 * 2);
      const full = engine.importKV({ blockSize: 16, n: 2 * S, k: [blob(), blob()], v: [blob(), blob()] });
      await expect(engine.decode([{ stream: full, token: 1 }])).rejects.toMatchObject({ code: "CONTEXT_OVERFLOW" });
      await expect(engine.prefill(new Array(2 * S + 1).fill(5), {})).rejects.toMatchObject({ code: "CONTEXT_OVERFLOW" });
      await expect(engine.prefill([5, 1e9], {})).rejects.toMatchObject({ code: "CONFIG" });
      await expect(engine.prefill([], {})).rejects.toMatchObject({ code: "CONFIG" });
      const live = engine.stats().streams;
      await expect(engine.prefill([5], { keepStream: true, sampling: { temperature: 1, topP: 7 } })).rejects.toMatchObject({ code: "CONFIG" });
      expect(engine.stats().streams).toBe(live);
      const twice = engine.importKV(r.kv!);
      await expect(
        engine.decode([
          { stream: twice, token: 1 },
          { stream: twice, token: 2 },
        ]),
      ).rejects.toMatchObject({ code: "CONFIG" });
      try {
        engine.pickVariant(100, 29);
        expect.unreachable();
      } catch (e) {
        expect(isAirmError(e, "CONTEXT_OVERFLOW")).toBe(true);
        expect((e as Error).message).toMatch(/129 tokens exceeds max_model_len of 128 tokens/);
      }
      expect(engine.pickVariant(100, 28)).toEqual({ batch: 4, seqLen: 128 });
    } finally {
      await engine.close();
      await other.close();
    }
  });
});

describe("generation defaults", () => {
  it("reports the checkpoint's sampling defaults and says at start where they come from; none with generationConfig vllm", async () => {
    const dir = join(root, "model-generation-defaults");
    cpSync(modelDir, dir, { recursive: true });
    const gen = JSON.parse(readFileSync(join(dir, "generation_config.json"), "utf8"));
    writeFileSync(join(dir, "generation_config.json"), JSON.stringify({ ...gen, temperature: 0.7, top_p: 0.8, top_k: 20, min_p: 0.05, repetition_penalty: 20 }));
    const plain = await CpuBackedEngine.open(modelDir, spec({ artifactCache: null }));
    const auto = await CpuBackedEngine.open(dir, spec({ artifactCache: null }));
    const off = await CpuBackedEngine.open(dir, spec({ artifactCache: null, generationConfig: "vllm" }));
    try {
      expect(plain.model.generationDefaults).toEqual({});
      expect(plain.generationDefaultsNote).toBe("generation defaults: none (generation_config.json sets none)");
      expect(auto.model.generationDefaults).toEqual({ temperature: 0.7, topP: 0.8, topK: 20, minP: 0.05 });
      expect(auto.generationDefaultsNote).toBe(
        "generation defaults (from generation_config.json): temperature=0.7 top_p=0.8 top_k=20 min_p=0.05; left out: repetition_penalty=20 (repetition_penalty must be a number in (0, 10])",
      );
      expect(off.model.generationDefaults).toEqual({});
      expect(off.generationDefaultsNote).toBe("generation defaults: none (AIRM_GENERATION_CONFIG=vllm; the model's temperature=0.7 top_p=0.8 top_k=20 min_p=0.05 not used)");
    } finally {
      await Promise.all([plain.close(), auto.close(), off.close()]);
    }
  });
});

describe("swap and delta", () => {
  it("swap keeps the weights, changes only the variant, and tokens stay identical", async () => {
    const engine = await CpuBackedEngine.open(modelDir, spec());
    try {
      const before = await generate(engine, prompts[0], STEPS);
      const a = await engine.swap({ batch: 4, seqLen: 2 * S });
      expect([a.compiled, a.from, a.to]).toEqual([false, { batch: 4, seqLen: S }, { batch: 4, seqLen: 2 * S }]);
      expect(engine.activeVariant).toEqual({ batch: 4, seqLen: 2 * S });
      expect(await generate(engine, prompts[0], STEPS)).toEqual(before);
      const b = await engine.swap({ batch: 2, seqLen: 96 });
      expect(b.compiled).toBe(true);
      expect(engine.variants()).toContainEqual({ batch: 2, seqLen: 96 });
      expect(await generate(engine, prompts[0], STEPS)).toEqual(before);
      // A stream made under one variant keeps decoding after a swap.
      const r = await engine.prefill(prompts[1], { keepStream: true });
      await engine.swap({ batch: 4, seqLen: S });
      const out = [r.firstToken];
      while (out.length < STEPS) out.push((await engine.decode([{ stream: r.stream!, token: out[out.length - 1] }]))[0].token);
      expect(out).toEqual(reference.get("1"));
    } finally {
      await engine.close();
    }
  });

  it("applyDelta uploads only changed tensors and gives the tokens of a full load of the new checkpoint", async () => {
    const newDir = join(root, "model-v2");
    const changed = editCheckpoint(modelDir, newDir, {
      "model.norm.weight": (i) => bf16(i % 3 === 0 ? -2 : 1.5),
      "model.layers.1.mlp.down_proj.weight": (_i, old) => old ^ 0x0040,
      "lm_head.weight": (i, old) => (i % 7 === 0 ? bf16(0.5) : old),
    });
    const engine = await CpuBackedEngine.open(modelDir, spec());
    try {
      const before = await generate(engine, prompts[0], STEPS);
      const oldFingerprint = engine.model.modelFingerprint;
      const d = await engine.applyDelta(newDir);
      const expected = await solo(newDir, prompts[0], STEPS);
      expect(expected).not.toEqual(before); // the edit matters, so equality below means something
      expect(await generate(engine, prompts[0], STEPS)).toEqual(expected);
      expect(d.changedTensors).toEqual(changed);
      expect(d.modelFingerprint).not.toBe(oldFingerprint);
      expect(engine.model.modelFingerprint).toBe(d.modelFingerprint);
      const fresh = await loadCheckpoint(newDir);
      expect(d.modelFingerprint).toBe(fresh.fingerprint);
      fresh.tensors.close();
      expect(d.mode).toBe("tensors");
      expect(d.uploadBytes).toBeLessThan(d.totalBytes / 2);
      expect((await engine.applyDelta(newDir)).mode).toBe("none");
      // Live streams block a delta: their KV belongs to the old weights.
      const r = await engine.prefill(prompts[0], { keepStream: true });
      await expect(engine.applyDelta(modelDir)).rejects.toMatchObject({ code: "UNSUPPORTED" });
      engine.release(r.stream as KVStream);
      await engine.applyDelta(modelDir);
      expect(await generate(engine, prompts[0], STEPS)).toEqual(before);
    } finally {
      await engine.close();
    }
  });
});

describe("quantized weights (AIRM_WEIGHTS)", () => {
  it("an engine with weights q8_0 gives the q8_0 model's solo tokens, warm-starts from its own packed image, and names other numerics than a bf16 engine", async () => {
    const cacheDir = join(root, "artifacts-q8");
    const plain = await CpuBackedEngine.open(modelDir, spec({ artifactCache: new ArtifactCache(cacheDir) }));
    const first = await CpuBackedEngine.open(modelDir, spec({ artifactCache: new ArtifactCache(cacheDir), weights: "q8_0" }));
    const second = await CpuBackedEngine.open(modelDir, spec({ artifactCache: new ArtifactCache(cacheDir), weights: "q8_0" }));
    try {
      expect(plain.weightsHeld).toMatch(/^\d+ bf16 \(/);
      expect(first.weightsHeld).toMatch(/q8/);
      expect(first.stats().weightsFrom).toBe("converted"); // the bf16 image in the same folder is not taken
      expect(second.stats().weightsFrom).toBe("artifact-cache");
      const want = await solo(modelDir, prompts[2], STEPS, "q8_0");
      expect(await generate(first, prompts[2], STEPS)).toEqual(want);
      expect(await generate(second, prompts[2], STEPS)).toEqual(want);
      // the KV manifest carries this fingerprint and the worker's handoff requires it equal
      expect(first.model.numericsFingerprint).not.toBe(plain.model.numericsFingerprint);
    } finally {
      await plain.close();
      await first.close();
      await second.close();
    }
  });

  it("applyDelta on quantized weights re-quantizes the changed tensors: the tokens of a full q4_1 load of the new checkpoint", async () => {
    const newDir = join(root, "model-v3");
    editCheckpoint(modelDir, newDir, { "model.layers.0.mlp.gate_proj.weight": (i, old) => (i % 5 === 0 ? bf16(0.25) : old) });
    const engine = await CpuBackedEngine.open(modelDir, spec({ weights: "q4_1" }));
    try {
      const before = await generate(engine, prompts[0], STEPS);
      const d = await engine.applyDelta(newDir);
      expect(d.mode).toBe("tensors");
      const want = await solo(newDir, prompts[0], STEPS, "q4_1");
      expect(want).not.toEqual(before);
      expect(await generate(engine, prompts[0], STEPS)).toEqual(want);
    } finally {
      await engine.close();
    }
  });
});

describe("artifact cache and hash records", () => {
  it("a second load finds the checkpoint's hashes recorded, and the packed weights", async () => {
    const cacheDir = join(root, "artifacts-warm");
    const first = await CpuBackedEngine.open(modelDir, spec({ artifactCache: new ArtifactCache(cacheDir) }));
    const second = await CpuBackedEngine.open(modelDir, spec({ artifactCache: new ArtifactCache(cacheDir) }));
    try {
      expect(first.hashesFrom).toBe("hashed");
      expect(second.hashesFrom).toBe("record");
      expect(second.model.modelFingerprint).toBe(first.model.modelFingerprint);
      expect(first.stats().weightsFrom).toBe("converted");
      expect(second.stats().weightsFrom).toBe("artifact-cache");
      expect(await generate(second, prompts[3], STEPS)).toEqual(reference.get("3"));
    } finally {
      await first.close();
      await second.close();
    }
  });

  it("a stored image with a flipped byte fails its CRC-32 after being read in: the engine loads cold, removes it and stores it again", async () => {
    const cacheDir = join(root, "artifacts-flip");
    const first = await CpuBackedEngine.open(modelDir, spec({ artifactCache: new ArtifactCache(cacheDir) }));
    await first.close();
    const file = readdirSync(cacheDir, { recursive: true, withFileTypes: true }).find(
      (d) => d.isFile() && !d.name.endsWith(".json") && statSync(join(d.parentPath, d.name)).size > 100_000,
    );
    expect(file).toBeDefined();
    const path = join(file!.parentPath, file!.name);
    const bytes = readFileSync(path);
    bytes[bytes.length - 1000] ^= 0x40;
    writeFileSync(path, bytes);
    const second = await CpuBackedEngine.open(modelDir, spec({ artifactCache: new ArtifactCache(cacheDir) }));
    try {
      expect(second.stats().weightsFrom).toBe("converted");
      expect(second.cacheNote).toMatch(/failed its CRC-32 and was removed/);
      expect(await generate(second, prompts[3], STEPS)).toEqual(reference.get("3"));
    } finally {
      await second.close();
    }
    const third = await CpuBackedEngine.open(modelDir, spec({ artifactCache: new ArtifactCache(cacheDir) }));
    expect(third.stats().weightsFrom).toBe("artifact-cache");
    await third.close();
  });

  it("an unwritable cache folder costs the warm start, not the load", async () => {
    const blocker = join(root, "a-file");
    writeFileSync(blocker, "not a folder");
    const engine = await CpuBackedEngine.open(modelDir, spec({ artifactCache: new ArtifactCache(join(blocker, "cache")) }));
    try {
      expect(engine.hashesFrom).toBe("hashed");
      expect(await generate(engine, prompts[1], STEPS)).toEqual(reference.get("1"));
    } finally {
      await engine.close();
    }
  });

  it("a changed file invalidates the hash record", async () => {
    const cacheDir = join(root, "artifacts-touch");
    const dir = join(root, "model-touch");
    editCheckpoint(modelDir, dir, {});
    (await CpuBackedEngine.open(dir, spec({ artifactCache: new ArtifactCache(cacheDir) }))).close();
    editCheckpoint(modelDir, dir, { "model.norm.weight": () => bf16(1) });
    const again = await CpuBackedEngine.open(dir, spec({ artifactCache: new ArtifactCache(cacheDir) }));
    try {
      expect(again.hashesFrom).toBe("hashed");
      const fresh = await loadCheckpoint(dir);
      expect(again.model.modelFingerprint).toBe(fresh.fingerprint);
      fresh.tensors.close();
    } finally {
      await again.close();
    }
  });
});
