// From a host that lists both engine packages: the registry hands out "rngd" and "atom", both
// generate @airm/llama's greedy tokens, and RNGD prefill -> ATOM decode continues exactly (on a
// LoRA adapter too). The ATOM native path is driven through a fake librbln_runtime.so built here
// with gcc; it refuses adapters.
import { execFileSync } from "node:child_process";
import { mkdirSync, mkdtempSync, rmSync, symlinkSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { Registry, blocksToDense, openEngine } from "@airm/rm-core";
import { loadCheckpoint, makeTinyLora, makeTinyModel } from "@airm/llama";
import { denseLayerBytes, engineTokens, referenceTokens } from "@airm/engine-kit";
import type { Engine, EnginePlugin } from "@airm/rm-core";
import { atomEngine, atomSpec, decodeGraphIO } from "../src/index.ts";

const here = dirname(fileURLToPath(import.meta.url));
const packages = join(here, "..", "..");
const root = mkdtempSync(join(tmpdir(), "airm-atom-"));
const modelDir = join(root, "model");
const loraDir = join(root, "lora-sql");
const noCards = join(root, "dev-empty");
const oneAtom = join(root, "dev-atom");
const S = 64;
const STEPS = 10;
let prompts: number[][];
const reference: number[][] = [];

type V2Plugin = EnginePlugin;

function env(extra: Record<string, string> = {}): NodeJS.ProcessEnv {
  return { AIRM_DEV_ROOT: noCards, AIRM_ARTIFACT_CACHE: join(root, "artifacts"), AIRM_ENGINE_LOG: "0", ...extra };
}

const generate = (engine: Engine, tokens: number[], steps: number, lora?: string) => engineTokens(engine, tokens, steps, lora);

beforeAll(async () => {
  makeTinyModel({ arch: "llama", out: modelDir, layers: 2, seed: 11 });
  const ckpt = await loadCheckpoint(modelDir);
  prompts = ["ATOM decodes what RNGD prefilled", "x", "a somewhat longer prompt with more words in it than the others"].map((p) => ckpt.tokenizer.encode(p));
  makeTinyLora({ out: loraDir, model: ckpt.config, baseModel: modelDir, r: 8, targets: "all-linear", seed: 5 });
  ckpt.tensors.close();
  for (const p of prompts) reference.push(await referenceTokens(modelDir, p, STEPS));
  mkdirSync(noCards, { recursive: true });
  mkdirSync(oneAtom, { recursive: true });
  for (const n of ["rbln0", "rsd0"]) writeFileSync(join(oneAtom, n), "");
}, 120_000);
afterAll(() => rmSync(root, { recursive: true, force: true }));

describe("registry host with both engines", () => {
  let registry: Registry;
  beforeAll(() => {
    // A host package as a deployment has it: both engines in its dependencies and node_modules.
    const host = join(root, "host");
    mkdirSync(join(host, "node_modules", "@airm"), { recursive: true });
    writeFileSync(join(host, "package.json"), JSON.stringify({ name: "engine-host", private: true, dependencies: { "@airm/engine-rngd": "*", "@airm/engine-atom": "*" } }));
    symlinkSync(join(packages, "engine-rngd"), join(host, "node_modules", "@airm", "engine-rngd"));
    symlinkSync(join(packages, "engine-atom"), join(host, "node_modules", "@airm", "engine-atom"));
    registry = new Registry();
    registry.addHost(host);
  });

  it("lists and loads airm.workloads rngd and atom", async () => {
    expect(registry.list("airm.workloads")).toEqual(["atom", "rngd"]);
    expect(registry.sourceOf("airm.workloads", "rngd")).toBe("@airm/engine-rngd");
    const atom = await registry.load("airm.workloads", "atom");
    expect(atom.kind).toBe("engine");
    expect(atom.name).toBe("atom");
    // What package.json declares (the worker picks engines by it without importing them) is what the code runs.
    expect(Object.keys(registry.entry("airm.workloads", "atom")!.meta.backends as object)).toEqual(Object.keys(atomSpec.backends));
    expect(registry.entry("airm.workloads", "atom")!.meta.backends).toEqual({ atom: { roles: ["decode", "solo"] } });
  });

  for (const name of ["rngd", "atom"]) {
    it(`${name} generates the greedy tokens of @airm/llama solo`, async () => {
      const plugin = (await registry.load("airm.workloads", name)) as V2Plugin;
      const engine = await openEngine(plugin, { model: modelDir, maxModelLen: S, batch: 4, chip: 0 }, { env: env() });
      try {
        expect(engine.name).toBe(name);
        for (const [i, p] of prompts.entries()) expect(await generate(engine, p, STEPS)).toEqual(reference[i]);
      } finally {
        await engine.close();
      }
    });
  }

  it("RNGD prefill -> KV in layout rngd-pd/v2 -> ATOM decode (the cache as a host input) equals solo, batched", async () => {
    const rngd = await openEngine((await registry.load("airm.workloads", "rngd")) as V2Plugin, { model: modelDir, backend: "rngd-chunk", maxModelLen: S }, { env: env() });
    const atom = await openEngine((await registry.load("airm.workloads", "atom")) as V2Plugin, { model: modelDir, maxModelLen: S, batch: 4 }, { env: env() });
    try {
      expect(rngd.model.modelFingerprint).toBe(atom.model.modelFingerprint);
      expect(rngd.model.numericsFingerprint).toBe(atom.model.numericsFingerprint);
      const handoffs = await Promise.all(prompts.map((p) => rngd.prefill(p, {})));
      const streams = handoffs.map((h) => atom.importKV({ blockSize: h.kv!.blockSize, n: h.kv!.n, k: h.kv!.k.map((x) => x.slice()), v: h.kv!.v.map((x) => x.slice()) }));
      expect(streams.every((s) => s.residence === "host")).toBe(true);
      const outs = handoffs.map((h) => [h.firstToken]);
      while (outs[0].length < STEPS) (await atom.decode(streams.map((stream, i) => ({ stream, token: outs[i][outs[i].length - 1] })))).forEach((r, i) => outs[i].push(r.token));
      outs.forEach((o, i) => expect(o).toEqual(reference[i]));
    } finally {
      await rngd.close();
      await atom.close();
    }
  });

  it("with lora at load, both pass it through: RNGD prefill on an adapter -> ATOM decode on it equals @airm/llama solo with the adapter", async () => {
    const lora = { maxLoras: 2, modules: [{ name: "sql", path: loraDir }] };
    const rngd = await openEngine((await registry.load("airm.workloads", "rngd")) as V2Plugin, { model: modelDir, backend: "rngd-chunk", maxModelLen: S, lora }, { env: env() });
    const atom = await openEngine((await registry.load("airm.workloads", "atom")) as V2Plugin, { model: modelDir, maxModelLen: S, batch: 4, lora }, { env: env() });
    try {
      for (const e of [rngd, atom]) expect(e.loras!.list().map((l) => [l.name, l.rank])).toEqual([["sql", 8]]);
      expect(rngd.loras!.list()[0].fingerprint).toBe(atom.loras!.list()[0].fingerprint);
      const p = prompts[2];
      const want = await referenceTokens(modelDir, p, STEPS, {}, loraDir);
      expect(want).not.toEqual(reference[2]);
      const h = await rngd.prefill(p, { lora: "sql" });
      const stream = atom.importKV(h.kv!, undefined, { lora: "sql", tokens: p });
      const out = [h.firstToken];
      while (out.length < STEPS) out.push((await atom.decode([{ stream, token: out[out.length - 1] }]))[0].token);
      atom.release(stream);
      expect(out).toEqual(want);
      expect(await generate(rngd, p, STEPS, "sql")).toEqual(want);
    } finally {
      await rngd.close();
      await atom.close();
    }
  });
});

describe("ATOM native path (fake librbln_runtime.so)", () => {
  const lib = join(root, "librbln_runtime.so");
  const graphs = join(root, "graphs");
  beforeAll(() => {
    execFileSync("gcc", ["-shared", "-fPIC", "-O1", "-o", lib, join(here, "fixtures", "fake-rbln-runtime.c")]);
    mkdirSync(graphs, { recursive: true });
  });

  it("stays on the CPU reference without a card, and says why", async () => {
    const engine = await openEngine(atomEngine, { model: modelDir, maxModelLen: S }, { env: env({ AIRM_RBLN_LIB: lib }) });
    try {
      expect(engine.device).toMatchObject({ path: "cpu-reference", device: null });
      expect(engine.device.detail).toContain("no ATOM card is visible");
    } finally {
      await engine.close();
    }
  });

  it("refuses a card + runtime without compiled graphs, and a runtime path that does not exist", async () => {
    await expect(openEngine(atomEngine, { model: modelDir, maxModelLen: S }, { env: env({ AIRM_RBLN_LIB: lib, AIRM_DEV_ROOT: oneAtom }) })).rejects.toMatchObject({
      code: "CONFIG",
      key: "AIRM_RBLN_GRAPHS",
    });
    await expect(openEngine(atomEngine, { model: modelDir, maxModelLen: S }, { env: env({ AIRM_RBLN_LIB: join(root, "missing.so") }) })).rejects.toMatchObject({
      code: "CONFIG",
      key: "AIRM_RBLN_LIB",
    });
  });

  it("runs decode steps through the runtime: the whole host cache goes in, the graph's new position comes back", async () => {
    const ckpt = await loadCheckpoint(modelDir);
    const c = ckpt.config;
    ckpt.tensors.close();
    const shape = { layers: c.numLayers, kvHeads: c.numKvHeads, headDim: c.headDim, vocabSize: c.vocabSize };
    const variant = { batch: 4, seqLen: S };
    const io = decodeGraphIO(shape, variant);
    writeFileSync(join(graphs, "decode-B4xS64.rbln"), `FAKE-RBLN 1\nin ${io.inputs.join(" ")}\nout ${io.outputs.join(" ")}\n`);
    const engine = await openEngine(
      atomEngine,
      { model: modelDir, maxModelLen: S, batch: 4, chip: 0 },
      // Only B4 is compiled on the host, so a one-stream step runs the B4 graph with padding.
      { env: env({ AIRM_RBLN_LIB: lib, AIRM_DEV_ROOT: oneAtom, AIRM_RBLN_GRAPHS: graphs, AIRM_VARIANTS: `B4xS${S}` }) },
    );
    try {
      expect(engine.device).toMatchObject({ vendor: "rebellions", path: "native", device: "rbln:0" });
      const r = await engine.prefill(prompts[0], { keepStream: true });
      const before = engine.exportKV(r.stream!);
      await engine.decode([{ stream: r.stream!, token: 7 }]);
      const after = engine.exportKV(r.stream!);
      expect(after.n).toBe(before.n + 1);
      // Recompute what the fake graph returns for these inputs (its byte recipe) and check that
      // the engine wrote exactly that into position n of the stream's block. The graph's input is
      // the stream's positions gathered from its blocks into a dense S-wide cache.
      const lb = denseLayerBytes(shape, S);
      const dense = (l: number): [Uint8Array, Uint8Array] => {
        const K = new Uint8Array(4 * lb);
        const V = new Uint8Array(4 * lb);
        blocksToDense(shape, before.blockSize, before.n, before.k[l], before.v[l], S, K.subarray(0, lb), V.subarray(0, lb));
        return [K, V];
      };
      const inputs: Uint8Array[] = [new Uint8Array(new Int32Array([7, 0, 0, 0]).buffer), new Uint8Array(new Int32Array([before.n, 0, 0, 0]).buffer)];
      for (let l = 0; l < shape.layers; l++) inputs.push(...dense(l));
      const recipe = (o: number, j: number): number => inputs.reduce((acc, x) => acc + x[j % x.length], o) & 0xff;
      const p = before.n;
      const bs = after.blockSize;
      const blk = shape.kvHeads * shape.headDim * bs * 2;
      const at = Math.floor(p / bs) * blk;
      const o = p % bs;
      for (let l = 0; l < shape.layers; l++) {
        for (let r2 = 0; r2 < shape.kvHeads * shape.headDim; r2++) {
          expect([after.k[l][at + (r2 * bs + o) * 2], after.k[l][at + (r2 * bs + o) * 2 + 1]]).toEqual([recipe(1 + 2 * l, 2 * r2), recipe(1 + 2 * l, 2 * r2 + 1)]);
        }
        const run = shape.headDim * 2;
        for (let h = 0; h < shape.kvHeads; h++) {
          for (let j = 0; j < run; j++) expect(after.v[l][at + (h * bs + o) * run + j]).toBe(recipe(2 + 2 * l, h * run + j));
        }
        // Positions before n are untouched.
        expect(Buffer.from(after.k[l].subarray(0, at)).equals(Buffer.from(before.k[l].subarray(0, at)))).toBe(true);
      }
    } finally {
      await engine.close();
    }
  });

  it("refuses LoRA adapters at load: the card's decode graph cannot apply them", async () => {
    const ckpt = await loadCheckpoint(modelDir);
    const c = ckpt.config;
    ckpt.tensors.close();
    const io = decodeGraphIO({ layers: c.numLayers, kvHeads: c.numKvHeads, headDim: c.headDim, vocabSize: c.vocabSize }, { batch: 4, seqLen: S });
    writeFileSync(join(graphs, "decode-B4xS64.rbln"), `FAKE-RBLN 1\nin ${io.inputs.join(" ")}\nout ${io.outputs.join(" ")}\n`);
    const options = { model: modelDir, maxModelLen: S, batch: 4, chip: 0, lora: { modules: [{ name: "sql", path: loraDir }] } };
    await expect(
      openEngine(atomEngine, options, { env: env({ AIRM_RBLN_LIB: lib, AIRM_DEV_ROOT: oneAtom, AIRM_RBLN_GRAPHS: graphs, AIRM_VARIANTS: `B4xS${S}` }) }),
    ).rejects.toMatchObject({ code: "UNSUPPORTED", message: expect.stringMatching(/LoRA adapters: backend atom of engine atom decodes on the native vendor runtime \(rbln:0\)/) });
  });
});
