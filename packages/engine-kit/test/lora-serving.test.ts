// LoRA adapters served through the engine contract (`lora` at load, `engine.loras`, `lora` on
// prefill / importKV / holdPrefix) on the real CPU reference model, a generated tiny model and
// three generated PEFT adapters: each stream gives @airm/llama's own generation with its adapter,
// whatever shares its passes (other adapters, the base model, prompt chunks, a pass limit of
// maxLoras), across a KV handoff and a preemption; the prefix cache keeps each adapter's KV apart;
// unloading waits for the streams on the adapter.
import { cpSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { blockHashes, blockHashRoot, blockLayerBytes, isAirmError, prefixSalt } from "@airm/rm-core";
import type { DecodeResult, Engine, KVReservation, KVStream, LoraServingOptions } from "@airm/rm-core";
import { LlamaModel, generate, loadCheckpoint, makeTinyLora, makeTinyModel } from "@airm/llama";
import { CpuBackedEngine, engineTokens, referenceTokens, type BlockEvent, type CpuEngineSpec } from "../src/index.ts";
import { testEngineSpec } from "./engine-spec.ts";

const root = mkdtempSync(join(tmpdir(), "airm-lora-"));
const modelDir = join(root, "model");
const S = 64;
const STEPS = 10;
const TEXTS = ["hello world, this is a test of adapters", "a", "the quick brown fox jumps over the lazy dog again and again"];
let prompts: number[][];
/** Adapter folders by name: q/v rank 4 (f32), all-linear rank 8 rsLoRA, o/gate/up/down of layer 1 rank 3 in BF16. */
const dirs: Record<string, string> = {};
const NAMES = ["qv", "all", "mlp"] as const;
/** Greedy tokens of LlamaModel's own generate: reference[adapter or "base"][prompt]. */
const reference: Record<string, number[][]> = {};

const modules = (names: readonly string[] = NAMES) => names.map((name) => ({ name, path: dirs[name] }));

/** A test spec with `lora` (default: the three adapters; null: none). */
function spec(over: Partial<CpuEngineSpec> = {}, lora: LoraServingOptions | null = { modules: modules() }): CpuEngineSpec {
  return testEngineSpec({ variants: [{ batch: 4, seqLen: S }], maxModelLen: S, ...(lora ? { lora } : {}), ...over });
}

/** `generate` of @airm/llama with each adapter (and none), greedy. */
async function modelReference(): Promise<void> {
  const ckpt = await loadCheckpoint(modelDir);
  const model = await LlamaModel.load(ckpt, { lora: { maxLoras: 4, maxLoraRank: 64 } });
  try {
    const handles = Object.fromEntries(NAMES.map((n) => [n, model.loadLora(n, dirs[n])]));
    for (const key of ["base", ...NAMES]) {
      reference[key] = prompts.map((p) => generate(model, p, { maxTokens: STEPS, sampling: { temperature: 0 }, lora: handles[key] }).tokens);
    }
  } finally {
    model.close();
    ckpt.tensors.close();
  }
}

beforeAll(async () => {
  makeTinyModel({ arch: "llama", out: modelDir, layers: 2, seed: 7 });
  const ckpt = await loadCheckpoint(modelDir);
  prompts = TEXTS.map((t) => ckpt.tokenizer.encode(t));
  const model = ckpt.config;
  ckpt.tensors.close();
  for (const n of NAMES) dirs[n] = join(root, `lora-${n}`);
  makeTinyLora({ out: dirs.qv, model, baseModel: modelDir, r: 4, seed: 1 });
  makeTinyLora({ out: dirs.all, model, baseModel: modelDir, r: 8, useRslora: true, targets: "all-linear", seed: 2 });
  makeTinyLora({ out: dirs.mlp, model, baseModel: modelDir, r: 3, targets: ["o_proj", "gate_proj", "up_proj", "down_proj"], layers: [1], dtype: "bf16", seed: 3 });
  await modelReference();
}, 120_000);
afterAll(() => rmSync(root, { recursive: true, force: true }));

/** Greedy tokens of streams kept by prefills issued together, then decoded in shared steps (one decode call per step). */
async function together(engine: Engine, runs: { tokens: number[]; lora?: string }[]): Promise<number[][]> {
  const firsts = await Promise.all(runs.map((r) => engine.prefill(r.tokens, { keepStream: true, ...(r.lora ? { lora: r.lora } : {}) })));
  const streams = firsts.map((f) => f.stream!);
  const outs = firsts.map((f) => [f.firstToken]);
  try {
    while (outs[0].length < STEPS) (await engine.decode(streams.map((stream, i) => ({ stream, token: outs[i][outs[i].length - 1] })))).forEach((r, i) => outs[i].push(r.token));
  } finally {
    for (const s of streams) engine.release(s);
  }
  return outs;
}

describe("LoRA adapters through the engine", () => {
  it("the adapters change the model's greedy tokens (so equality below means something)", () => {
    for (const n of NAMES) for (const [i] of prompts.entries()) if (i !== 1) expect(reference[n][i], `${n} prompt ${i}`).not.toEqual(reference.base[i]);
  });

  const modes: [CpuEngineSpec["prefillMode"], CpuEngineSpec["residence"]][] = [
    ["whole", "device"],
    ["chunked", "device"],
    ["whole", "host"],
  ];
  for (const [prefillMode, residence] of modes) {
    it(`prefill + decode on an adapter give LlamaModel's generate with it (${prefillMode} prefill, ${residence} cache), one at a time and all at once`, async () => {
      const engine = await CpuBackedEngine.open(modelDir, spec({ prefillMode, residence }));
      try {
        for (const key of ["base", ...NAMES])
          for (const [i, p] of prompts.entries()) expect(await engineTokens(engine, p, STEPS, key === "base" ? undefined : key), `${key} prompt ${i}`).toEqual(reference[key][i]);
        // concurrently: prompt chunks (chunked) share passes with decode steps on other adapters
        const keys = ["base", ...NAMES];
        const runs = await Promise.all(keys.map((key, k) => engineTokens(engine, prompts[k % 3], STEPS, key === "base" ? undefined : key)));
        runs.forEach((r, k) => expect(r, keys[k]).toEqual(reference[keys[k]][k % 3]));
      } finally {
        await engine.close();
      }
    });
  }

  it("a decode batch mixing streams on adapters and the base gives each its solo tokens; a pass names at most maxLoras adapters", async () => {
    const runs = [{ tokens: prompts[0], lora: "qv" }, { tokens: prompts[2], lora: "all" }, { tokens: prompts[0] }, { tokens: prompts[2], lora: "mlp" }];
    const want = [reference.qv[0], reference.all[2], reference.base[0], reference.mlp[2]];
    for (const maxLoras of [4, 2]) {
      // prompts waiting together are packed into one pass (with another adapter as well)
      const engine = await CpuBackedEngine.open(modelDir, spec({ prefillBatchTokens: 1024 }, { maxLoras, modules: modules() }));
      try {
        expect(await together(engine, runs)).toEqual(want);
        const c = engine.passCounts();
        expect(c.decodeSteps).toBe(4 * (STEPS - 1));
        // three adapters and the base: one pass per step within 4 adapters, two within 2
        expect(c.passes - c.prefillPasses).toBe((maxLoras >= 3 ? 1 : 2) * (STEPS - 1));
        expect(c.prefillPasses).toBe(maxLoras >= 3 ? 1 : 2);
      } finally {
        await engine.close();
      }
    }
  });

  it("list() describes the adapters; resident ones are at most maxLoras, an evicted one is read again when named", async () => {
    const engine = await CpuBackedEngine.open(modelDir, spec({}, { maxLoras: 2, maxLoraRank: 16, modules: modules() }));
    try {
      const loras = engine.loras!;
      expect([loras.maxLoras, loras.maxLoraRank]).toEqual([2, 16]);
      const list = loras.list();
      expect(list.map((l) => [l.name, l.path, l.rank])).toEqual([
        ["qv", dirs.qv, 4],
        ["all", dirs.all, 8],
        ["mlp", dirs.mlp, 3],
      ]);
      for (const l of list) expect(l.fingerprint).toMatch(/^[0-9a-f]{64}$/);
      expect(list.map((l) => l.resident)).toEqual([false, true, true]); // the least recently used waits on disk
      expect(await engineTokens(engine, prompts[0], STEPS, "qv")).toEqual(reference.qv[0]);
      expect(loras.list().find((l) => l.name === "qv")!.resident).toBe(true);
      expect(loras.list().filter((l) => l.resident)).toHaveLength(2);
    } finally {
      await engine.close();
    }
  });

  it("without lora at load, engine.loras is undefined and naming an adapter is UnknownLoraError", async () => {
    const engine = await CpuBackedEngine.open(modelDir, spec({}, null));
    try {
      expect(engine.loras).toBeUndefined();
      expect(await engineTokens(engine, prompts[0], STEPS)).toEqual(reference.base[0]);
      await expect(engine.prefill(prompts[0], { lora: "qv" })).rejects.toMatchObject({ code: "UNKNOWN_LORA", lora: "qv" });
      expect(engine.kvCache().usedBlocks).toBe(0);
    } finally {
      await engine.close();
    }
  });
});

describe("errors", () => {
  it("an unknown adapter is UnknownLoraError (naming the loaded ones) in prefill, importKV and holdPrefix, with nothing taken", async () => {
    const engine = await CpuBackedEngine.open(modelDir, spec({ prefixCaching: true }));
    try {
      const e = await engine.prefill(prompts[0], { lora: "nope", keepStream: true }).catch((x: unknown) => x);
      expect(isAirmError(e, "UNKNOWN_LORA")).toBe(true);
      expect((e as Error).message).toContain('"nope"');
      expect((e as Error).message).toContain("qv, all, mlp");
      const { kv } = await engine.prefill(prompts[0], { lora: "qv" });
      expect(() => engine.importKV(kv!, undefined, { lora: "nope" })).toThrow(expect.objectContaining({ code: "UNKNOWN_LORA" }));
      expect(() => engine.holdPrefix(prompts[0], { lora: "nope" })).toThrow(expect.objectContaining({ code: "UNKNOWN_LORA" }));
      expect(engine.stats().streams).toBe(0);
      expect(engine.kvCache().usedBlocks).toBe(0);
    } finally {
      await engine.close();
    }
  });

  it("load: a taken name is ConfigError lora_name, a bad adapter a ConfigError naming its key and the adapter; a bad module fails the engine's load", async () => {
    const big = join(root, "lora-big");
    const ckpt = await loadCheckpoint(modelDir);
    makeTinyLora({ out: big, model: ckpt.config, baseModel: modelDir, r: 32, seed: 4 });
    ckpt.tensors.close();
    const engine = await CpuBackedEngine.open(modelDir, spec({}, { maxLoraRank: 16, modules: modules(["qv"]) }));
    try {
      await expect(engine.loras!.load("qv", dirs.all)).rejects.toMatchObject({ code: "CONFIG", key: "lora_name" });
      const e = await engine.loras!.load("big", big).catch((x: unknown) => x);
      expect(e).toMatchObject({ code: "CONFIG", key: "r" });
      expect((e as Error).message).toContain('LoRA adapter "big"');
      await expect(engine.loras!.load("missing", join(root, "no-such-adapter"))).rejects.toMatchObject({ code: "CONFIG" });
      const info = await engine.loras!.load("all", dirs.all);
      expect(info).toMatchObject({ name: "all", path: dirs.all, rank: 8, resident: true });
      expect(engine.loras!.list().map((l) => l.name)).toEqual(["qv", "all"]);
      expect(await engineTokens(engine, prompts[2], STEPS, "all")).toEqual(reference.all[2]);
    } finally {
      await engine.close();
    }
    await expect(CpuBackedEngine.open(modelDir, spec({}, { maxLoraRank: 16, modules: [...modules(["qv"]), { name: "big", path: big }] }))).rejects.toThrow(/LoRA adapter "big"/);
    await expect(CpuBackedEngine.open(modelDir, spec({}, { modules: [...modules(["qv"]), { name: "qv", path: dirs.all }] }))).rejects.toMatchObject({ key: "lora_name" });
    await expect(CpuBackedEngine.open(modelDir, spec({}, { maxLoras: 0 }))).rejects.toMatchObject({ code: "CONFIG", key: "maxLoras" });
  });

  it("an engine whose decode runs on a native vendor runtime refuses lora at load, naming its backend", async () => {
    const native = {
      open: () => {
        throw new Error("not opened");
      },
    };
    await expect(CpuBackedEngine.open(modelDir, spec({ name: "atom", backend: "atom", nativeHostDecode: native }))).rejects.toMatchObject({
      code: "UNSUPPORTED",
      message: expect.stringContaining("backend atom"),
    });
    const plain = await CpuBackedEngine.open(modelDir, spec({ nativeHostDecode: native }, null));
    await plain.close();
  });
});

describe("unload", () => {
  it("streams on an unloaded adapter finish on it; new requests cannot name it; the model forgets it when the last one ends", async () => {
    const engine = await CpuBackedEngine.open(modelDir, spec());
    const heldByModel = () => (engine as unknown as { cpu: LlamaModel }).cpu.loras().map((h) => h.name);
    try {
      const r = await engine.prefill(prompts[0], { keepStream: true, lora: "qv" });
      const fork = engine.fork(r.stream!);
      const out = [r.firstToken];
      const step = async (stream: KVStream) => out.push((await engine.decode([{ stream, token: out[out.length - 1] }]))[0].token);
      await step(r.stream!);
      expect(engine.loras!.unload("qv")).toBe(true);
      expect(engine.loras!.unload("qv")).toBe(false);
      expect(engine.loras!.list().map((l) => l.name)).toEqual(["all", "mlp"]);
      await expect(engine.prefill(prompts[0], { lora: "qv" })).rejects.toMatchObject({ code: "UNKNOWN_LORA" });
      // the name is free again: a new adapter under it runs beside the old one's streams
      await engine.loras!.load("qv", dirs.all);
      expect(await engineTokens(engine, prompts[2], STEPS, "qv")).toEqual(reference.all[2]);
      while (out.length < STEPS) await step(r.stream!);
      expect(out).toEqual(reference.qv[0]);
      engine.release(r.stream!);
      expect(heldByModel()).toContain("qv"); // the fork still runs on it
      engine.release(fork);
      expect(heldByModel()).toEqual(["all", "mlp", "qv#1"]);
      expect(engine.loras!.list().map((l) => [l.name, l.path])).toEqual([
        ["all", dirs.all],
        ["mlp", dirs.mlp],
        ["qv", dirs.all],
      ]);
      // unloaded with no stream on it: the model forgets it at once
      expect(engine.loras!.unload("mlp")).toBe(true);
      expect(heldByModel()).toEqual(["all", "qv#1"]);
    } finally {
      await engine.close();
    }
  });
});

describe("prefix cache", () => {
  const BS = 4;

  it("a prompt kept under adapter A is a hit for A, not for B nor the base; cache_salt still splits; block hashes are rm-core's prefixSalt chains", async () => {
    const engine = await CpuBackedEngine.open(modelDir, spec({ prefixCaching: true, blockSize: BS }));
    const events: BlockEvent[] = [];
    engine.onBlockEvent((e) => events.push(e));
    const p = prompts[2];
    const full = Math.floor((p.length - 1) / BS) * BS;
    try {
      const cached = async (o: { lora?: string; cacheSalt?: string }) => {
        const r = await engine.prefill(p, { keepStream: true, ...o });
        const out = [r.firstToken];
        while (out.length < STEPS) out.push((await engine.decode([{ stream: r.stream!, token: out[out.length - 1] }]))[0].token);
        engine.release(r.stream!);
        return { cached: r.cachedTokens, out };
      };
      expect(await cached({ lora: "qv" })).toEqual({ cached: 0, out: reference.qv[2] });
      expect(await cached({ lora: "qv" })).toEqual({ cached: full, out: reference.qv[2] });
      expect(await cached({ lora: "all" })).toEqual({ cached: 0, out: reference.all[2] });
      expect(await cached({})).toEqual({ cached: 0, out: reference.base[2] });
      expect(await cached({ lora: "qv", cacheSalt: "tenant" })).toEqual({ cached: 0, out: reference.qv[2] });
      expect((await cached({ lora: "all" })).cached).toBe(full);
      expect((await cached({})).cached).toBe(full);
      // the stored events name each adapter's chain: rooted in prefixSalt(cache_salt, fingerprint)
      const m = engine.model;
      const fp = Object.fromEntries(engine.loras!.list().map((l) => [l.name, l.fingerprint]));
      const rootOf = (salt: string) => blockHashRoot({ modelFingerprint: m.modelFingerprint, numericsFingerprint: m.numericsFingerprint, blockSize: BS }, salt);
      const stored = new Set(events.flatMap((e) => (e.kind === "stored" ? e.hashes : [])));
      for (const salt of [prefixSalt(undefined, fp.qv), prefixSalt(undefined, fp.all), "", prefixSalt("tenant", fp.qv)])
        for (const h of blockHashes(rootOf(salt), p, BS, full / BS)) expect(stored.has(h)).toBe(true);
      expect(new Set(blockHashes(rootOf(prefixSalt(undefined, fp.qv)), p, BS)).has(blockHashes(rootOf(""), p, BS)[0])).toBe(false);
    } finally {
      await engine.close();
    }
  });

  it("holdPrefix and importKV with an adapter: a held prefix of its KV continues on it, equal to LlamaModel's generate", async () => {
    const pre = await CpuBackedEngine.open(modelDir, spec({ blockSize: BS }));
    const dec = await CpuBackedEngine.open(modelDir, spec({ prefixCaching: true, blockSize: BS }));
    try {
      const p = prompts[2];
      // the decode side keeps p's blocks under "all" (a finished stream of the same prompt)
      expect(await engineTokens(dec, p, 2, "all")).toEqual(reference.all[2].slice(0, 2));
      expect(dec.holdPrefix(p, { lora: "qv" }).n).toBe(0);
      expect(dec.holdPrefix(p).n).toBe(0);
      const hold = dec.holdPrefix(p, { lora: "all", maxPositions: p.length - 1 });
      expect(hold.n).toBe(Math.floor((p.length - 1) / BS) * BS);
      const r = await pre.prefill(p, { lora: "all" });
      const kv = r.kv!;
      const cut = (hold.n / BS) * blockLayerBytes(dec.model, BS);
      const rest = { ...kv, from: hold.n, k: kv.k.map((b) => b.subarray(cut)), v: kv.v.map((b) => b.subarray(cut)) };
      const s = dec.importKV(rest, undefined, { held: hold, tokens: p, lora: "all" });
      hold.release();
      const out = [r.firstToken];
      while (out.length < STEPS) out.push((await dec.decode([{ stream: s, token: out[out.length - 1] }]))[0].token);
      dec.release(s);
      expect(out).toEqual(reference.all[2]);
    } finally {
      await pre.close();
      await dec.close();
    }
  });
});

describe("KV handoff and preemption", () => {
  it("exportKV of a stream on an adapter, importKV into a second engine with { lora }: decoding goes on as solo", async () => {
    const first = await CpuBackedEngine.open(modelDir, spec({ prefillMode: "chunked" }));
    const second = await CpuBackedEngine.open(modelDir, spec({ residence: "host" }, { modules: modules(["mlp", "all"]) }));
    try {
      for (const [name, i] of [
        ["all", 0],
        ["mlp", 2],
      ] as const) {
        const r = await first.prefill(prompts[i], { keepStream: true, lora: name });
        const out = [r.firstToken];
        for (let k = 0; k < 3; k++) out.push((await first.decode([{ stream: r.stream!, token: out[out.length - 1] }]))[0].token);
        const kv = first.exportKV(r.stream!);
        first.release(r.stream!);
        const s = second.importKV(kv, undefined, { lora: name, tokens: [...prompts[i], ...out.slice(0, -1)] });
        while (out.length < STEPS) out.push((await second.decode([{ stream: s, token: out[out.length - 1] }]))[0].token);
        second.release(s);
        expect(out, name).toEqual(reference[name][i]);
      }
      // the handoff of a prefill (kv exported by it)
      const r = await first.prefill(prompts[0], { lora: "mlp" });
      const s = second.importKV(r.kv!, undefined, { lora: "mlp" });
      const out = [r.firstToken];
      while (out.length < STEPS) out.push((await second.decode([{ stream: s, token: out[out.length - 1] }]))[0].token);
      second.release(s);
      expect(out).toEqual(reference.mlp[0]);
    } finally {
      await first.close();
      await second.close();
    }
  });

  /** Waits until `engine.reserve(positions)` succeeds. */
  async function admit(engine: Engine, positions: number): Promise<KVReservation> {
    for (;;) {
      const r = engine.reserve(positions);
      if (r) return r;
      await new Promise<void>((resolve) => {
        const off = engine.onBlocksFreed(() => {
          off();
          resolve();
        });
      });
    }
  }

  /** A worker's loop: admission, prefill on `lora`, decode; a preempted stream is recomputed and goes on. */
  async function serve(engine: Engine, prompt: number[], lora: string | undefined, preempted: (string | undefined)[]): Promise<number[]> {
    const r = await engine.prefill(prompt, { keepStream: true, reservation: await admit(engine, prompt.length + 1), ...(lora ? { lora } : {}) });
    const stream = r.stream!;
    const out = [r.firstToken];
    try {
      while (out.length < STEPS) {
        const [next]: DecodeResult[] = await engine.decode([{ stream, token: out[out.length - 1] }]);
        if (next.error === undefined) {
          out.push(next.token);
          continue;
        }
        preempted.push(lora);
        const tokens = [...prompt, ...out.slice(0, -1)];
        await engine.recompute(stream, tokens, await admit(engine, tokens.length + 1));
      }
      return out;
    } finally {
      engine.release(stream);
    }
  }

  it("a stream on an adapter preempted for blocks is recomputed on its adapter and gives its solo tokens", async () => {
    const bs = 8;
    const probe = await CpuBackedEngine.open(modelDir, spec({ blockSize: bs }));
    const blockBytes = probe.kvBlockBytes();
    await probe.close();
    const engine = await CpuBackedEngine.open(modelDir, spec({ blockSize: bs, kvCacheMemory: { bytes: 10 * blockBytes } }));
    try {
      const preempted: (string | undefined)[] = [];
      // the newest streams are preempted first: those on adapters
      const keys = ["base", "qv", "all", "mlp"];
      const runs = await Promise.all(keys.map((key, k) => serve(engine, prompts[k % 3], key === "base" ? undefined : key, preempted)));
      runs.forEach((r, k) => expect(r, keys[k]).toEqual(reference[keys[k]][k % 3]));
      expect(preempted.filter((l) => l !== undefined).length).toBeGreaterThan(0);
    } finally {
      await engine.close();
    }
  });
});

describe("delta", () => {
  it("a full reload loads the adapters into the new model under their names", async () => {
    const newDir = join(root, "v2", "model");
    cpSync(modelDir, newDir, { recursive: true });
    const cfgFile = join(newDir, "config.json");
    writeFileSync(cfgFile, JSON.stringify({ ...JSON.parse(readFileSync(cfgFile, "utf8")), rms_norm_eps: 0.5 }));
    const engine = await CpuBackedEngine.open(modelDir, spec());
    try {
      const d = await engine.applyDelta(newDir);
      expect(d.mode).toBe("full-reload");
      expect(engine.loras!.list().map((l) => l.name)).toEqual([...NAMES]);
      const want = await referenceTokens(newDir, prompts[0], STEPS, {}, dirs.all);
      expect(want).not.toEqual(reference.all[0]);
      expect(await engineTokens(engine, prompts[0], STEPS, "all")).toEqual(want);
    } finally {
      await engine.close();
    }
  });
});
