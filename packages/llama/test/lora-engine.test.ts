// LoRA adapters in the forward pass, without Python: each adapter against an independent float64
// reference on the merged weights W + scale * B A (Llama, Qwen2 with biases, Gemma 3 with its
// sandwich norms and sliding window, and a q4_1 model whose base matmuls run on the integer kernels
// over 8-bit inputs), and the bit-exactness rules of serving: a pass or a decode step mixing three
// adapters and the base model gives every item the logits and KV bytes it gets alone, whichever
// adapters share it; chunked = whole prefill; one thread = two; prefill on one model instance and
// decode on another (the KV handed over, the adapter loaded on both) = solo.
import { createHash } from "node:crypto";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { Checkpoint, ModelConfig } from "../src/checkpoint-types.ts";
import type { LoraHandle } from "../src/lora/lora-registry.ts";
import type { KVCache } from "../src/model/kv-cache.ts";
import { type ActivationsMode, LlamaModel, type LlamaModelOptions, type WeightsMode } from "../src/model/llama-model.ts";
import { makeTinyLora, type TinyLoraOptions } from "../src/tiny/make-tiny-lora.ts";
import { mergedWeights } from "./model-helpers/lora-adapters.ts";
import { dequantizedCheckpoint, randomCheckpoint, tinyConfig, tinyGemma3Config, tinyQwen2Config } from "./model-helpers/random-checkpoint.ts";
import { bf16ToF32, referenceForward } from "./model-helpers/reference-math.ts";

interface Case {
  config: ModelConfig;
  weights: WeightsMode;
  activations?: ActivationsMode;
  tolerance: number;
}

// Tolerances as test/model-forward.test.ts: bf16 weights with f32 activations 2e-2 of the largest
// logit; 8-bit inputs to the base's Q4 kernels 6e-2 (the adapter's update runs on the f32 inputs).
const CASES: Record<string, Case> = {
  llama: { config: tinyConfig(), weights: "auto", tolerance: 2e-2 },
  qwen2: { config: tinyQwen2Config(), weights: "auto", tolerance: 2e-2 },
  gemma3: {
    config: tinyGemma3Config(),
    weights: "auto",
    tolerance: 2e-2,
  },
  "llama q4_1, 8-bit inputs": { config: tinyConfig({ intermediateSize: 160 }), weights: "q4_1", activations: "i8", tolerance: 6e-2 },
};

/** Three adapters: ranks 4, 8 (rsLoRA, BF16) and 3 (padded to 4 in the kernel), different targets and layers. */
const ADAPTERS: Record<string, Omit<TinyLoraOptions, "out" | "model" | "baseModel">> = {
  qv: { r: 4, alpha: 8, targets: ["q_proj", "v_proj"], seed: 1 },
  all: { r: 8, alpha: 16, useRslora: true, targets: "all-linear", dtype: "bf16", seed: 2 },
  late: { r: 3, alpha: 4, targets: ["o_proj", "gate_proj", "up_proj", "down_proj"], layers: [1], seed: 3 },
};

const scaleOf = (a: (typeof ADAPTERS)[string]) => (a.useRslora ? a.alpha! / Math.sqrt(a.r) : a.alpha! / a.r);

const prompt = [1, 40, 41, 42, 99, 7, 250, 13, 13, 64, 200, 5, 77, 31, 18, 260, 3];
const long = Array.from({ length: 150 }, (_, i) => (i * 53 + 7) % 300);

const bits = (x: Float32Array) => Buffer.from(x.buffer, x.byteOffset, x.byteLength);

/** The handle of adapter `a` (undefined: the base model). */
const on = (h: Record<string, LoraHandle>, a: string | undefined): LoraHandle | undefined => (a === undefined ? undefined : h[a]);

function kvDigest(m: LlamaModel, cache: KVCache): string {
  const h = createHash("sha256");
  for (let l = 0; l < m.config.numLayers; l++) h.update(cache.layerK(l)).update(cache.layerV(l));
  return h.digest("hex");
}

const root = mkdtempSync(join(tmpdir(), "airm-lora-engine-"));
afterAll(() => rmSync(root, { recursive: true, force: true }));

/** The three adapters written for `name`'s config. */
function writeAdapters(name: string, config: ModelConfig): Record<string, string> {
  const dirs: Record<string, string> = {};
  for (const [a, opts] of Object.entries(ADAPTERS)) {
    dirs[a] = join(root, name.replace(/\W+/g, "-"), a);
    makeTinyLora({ ...opts, out: dirs[a], model: config, baseModel: `random-${config.architecture}-3` });
  }
  return dirs;
}

/** A model of `c` with the three adapters loaded; handles by adapter name. */
async function adaptedModel(c: Case, dirs: Record<string, string>, opts: LlamaModelOptions = {}): Promise<{ m: LlamaModel; h: Record<string, LoraHandle> }> {
  const m = await LlamaModel.load(randomCheckpoint(c.config, 3), { weights: c.weights, activations: c.activations, ...opts });
  const h = Object.fromEntries(Object.entries(dirs).map(([a, dir]) => [a, m.loadLora(a, dir)]));
  return { m, h };
}

/** Logits and KV digest of `tokens` prefilled alone on `lora`, then `steps` decode steps feeding back tokens 5, 6, ... */
function solo(m: LlamaModel, tokens: number[], lora: LoraHandle | undefined, steps = 0): { logits: Buffer[]; kv: string } {
  const cache = m.newCache(tokens.length + steps);
  const logits = [bits(m.prefill(tokens, cache, { lora }))];
  for (let s = 0; s < steps; s++) logits.push(bits(m.decode([{ cache, token: 5 + s, lora }])[0]));
  const kv = kvDigest(m, cache);
  m.freeCache(cache);
  return { logits, kv };
}

/** The float64 reference's last-position logits with the adapter in `dir` merged into the weights of `ckpt`. */
function referenceLogits(ckpt: Checkpoint, dir: string, scale: number): Float64Array {
  const base = (name: string): Float64Array => {
    const n = ckpt.tensors.info(name).shape.reduce((a, b) => a * b, 1);
    const raw = new Uint16Array(n);
    ckpt.tensors.readBf16(name, raw);
    return Float64Array.from(raw, bf16ToF32);
  };
  return referenceForward(ckpt, prompt, { weight: mergedWeights(base, dir, scale) }).at(-1)!;
}

describe.each(Object.keys(CASES))("%s", (name) => {
  const c = CASES[name];
  let dirs: Record<string, string>;
  let m: LlamaModel;
  let h: Record<string, LoraHandle>;
  beforeAll(async () => {
    dirs = writeAdapters(name, c.config);
    ({ m, h } = await adaptedModel(c, dirs));
  });
  afterAll(() => m.close());

  it.each(Object.keys(ADAPTERS))("adapter %s agrees with the float64 reference on W + scale * B A, and moves the logits ten times more than that", (a) => {
    const refCkpt = c.weights === "q4_1" ? dequantizedCheckpoint(m.checkpoint, "Q4_1") : m.checkpoint;
    const ref = referenceLogits(refCkpt, dirs[a], scaleOf(ADAPTERS[a]));
    const cache = m.newCache(32);
    const ours = m.prefill(prompt, cache, { lora: h[a] });
    m.freeCache(cache);
    const maxRef = Math.max(...ref.map(Math.abs));
    const diff = Math.max(...ours.map((v, i) => Math.abs(v - ref[i])));
    const base = solo(m, prompt, undefined).logits[0];
    const baseLogits = new Float32Array(base.buffer, base.byteOffset, base.byteLength / 4);
    const moved = Math.max(...ours.map((v, i) => Math.abs(v - baseLogits[i])));
    console.log(`${name} + ${a}: max |ours - f64 reference| ${diff.toExponential(2)} (max |logit| ${maxRef.toFixed(2)}), moved from the base by ${moved.toFixed(3)}`);
    expect(diff / maxRef).toBeLessThan(c.tolerance);
    // the comparison means something: the adapter moves the logits ten times more than ours and the reference disagree
    expect(moved).toBeGreaterThan(10 * diff);
    expect(moved / maxRef).toBeGreaterThan(0.1);
  });

  it("a pass mixing the three adapters and the base (one 150-token prompt) gives every item its solo logits and KV bytes, in any mix", () => {
    const jobs = [prompt, [1, 5, 6], long, [9]];
    const mixes: (string | undefined)[][] = [
      ["qv", "all", undefined, "late"],
      ["late", undefined, "qv", "qv"],
      [undefined, "late", "all", "all"],
    ];
    const alone = new Map<string, { logits: Buffer[]; kv: string }>();
    const soloOf = (i: number, a: string | undefined) => alone.get(`${i}/${a}`) ?? alone.set(`${i}/${a}`, solo(m, jobs[i], on(h, a))).get(`${i}/${a}`)!;
    for (const mix of mixes) {
      const caches = jobs.map((j) => m.newCache(j.length));
      const out = m.pass(jobs.map((tokens, i) => ({ tokens, cache: caches[i], lora: on(h, mix[i]) })));
      jobs.forEach((_, i) => {
        expect(bits(out[i][0]).equals(soloOf(i, mix[i]).logits[0]), `item ${i} on ${mix[i]} in [${mix}]`).toBe(true);
        expect(kvDigest(m, caches[i])).toBe(soloOf(i, mix[i]).kv);
      });
      for (const cache of caches) m.freeCache(cache);
    }
  });

  it("decode steps of four streams on three adapters and the base give each stream its solo logits", () => {
    const jobs = [prompt, [1, 5, 6], prompt.slice(4), [9, 10]];
    const mix = ["all", undefined, "late", "qv"];
    const steps = 5;
    const caches = jobs.map((j) => m.newCache(j.length + steps));
    jobs.forEach((tokens, i) => m.prefill(tokens, caches[i], { lora: on(h, mix[i]) }));
    const batched: Buffer[][] = jobs.map(() => []);
    for (let s = 0; s < steps; s++) {
      const out = m.decode(caches.map((cache, i) => ({ cache, token: 5 + s, lora: on(h, mix[i]) })));
      out.forEach((l, i) => batched[i].push(bits(l)));
    }
    jobs.forEach((tokens, i) => {
      const want = solo(m, tokens, on(h, mix[i]), steps);
      batched[i].forEach((l, s) => expect(l.equals(want.logits[s + 1]), `stream ${i} step ${s}`).toBe(true));
      expect(kvDigest(m, caches[i])).toBe(want.kv);
    });
    for (const cache of caches) m.freeCache(cache);
  });

  it("chunked prefill and passAsync on an adapter give whole prefill's bits", async () => {
    const want = solo(m, long, h.all);
    for (const chunk of [1, 7, 129]) {
      const cache = m.newCache(long.length);
      expect(bits(m.prefillChunk(long, cache, chunk, { lora: h.all })).equals(want.logits[0])).toBe(true);
      expect(kvDigest(m, cache)).toBe(want.kv);
      m.freeCache(cache);
    }
    const cache = m.newCache(long.length);
    const [out] = await m.passAsync([{ tokens: long, cache, lora: h.all }]);
    expect(bits(out[0]).equals(want.logits[0])).toBe(true);
    m.freeCache(cache);
  });
});

describe("threads", () => {
  it.each(["llama", "llama q4_1, 8-bit inputs"])("%s: a mixed pass on two kernel threads gives the one-thread bits", async (name) => {
    const dirs = writeAdapters(`${name}-threads`, CASES[name].config);
    const one = await adaptedModel(CASES[name], dirs);
    const two = await adaptedModel(CASES[name], dirs, { threads: 2 });
    try {
      const jobs = [long, prompt, [1, 5, 6], [9]];
      const mix = ["late", "qv", undefined, "all"];
      const run = (x: { m: LlamaModel; h: Record<string, LoraHandle> }) => {
        const caches = jobs.map((j) => x.m.newCache(j.length));
        const out = x.m.pass(jobs.map((tokens, i) => ({ tokens, cache: caches[i], lora: on(x.h, mix[i]) })));
        const kv = caches.map((cache) => kvDigest(x.m, cache));
        for (const cache of caches) x.m.freeCache(cache);
        return { logits: out.map((o) => bits(o[0])), kv };
      };
      const a = run(one);
      const b = run(two);
      a.logits.forEach((l, i) => expect(l.equals(b.logits[i]), `item ${i}`).toBe(true));
      expect(b.kv).toEqual(a.kv);
    } finally {
      one.m.close();
      two.m.close();
    }
  });
});

describe("PD", () => {
  it("prefill on one model instance, KV handed to another that loaded the same adapter, decode there: the solo logits bit for bit", async () => {
    const dirs = writeAdapters("llama-pd", CASES.llama.config);
    const prefiller = await adaptedModel(CASES.llama, dirs);
    const decoder = await adaptedModel(CASES.llama, dirs);
    try {
      for (const a of Object.keys(ADAPTERS)) {
        expect(decoder.h[a].fingerprint).toBe(prefiller.h[a].fingerprint);
        const want = solo(prefiller.m, prompt, prefiller.h[a], 4);
        const sent = prefiller.m.newCache(prompt.length);
        const first = bits(prefiller.m.prefill(prompt, sent, { lora: prefiller.h[a] }));
        const kv = prefiller.m.exportKV(sent);
        prefiller.m.freeCache(sent);
        const cache = decoder.m.newCache(prompt.length + 4);
        decoder.m.importKV(cache, kv);
        const got = [first];
        for (let s = 0; s < 4; s++) got.push(bits(decoder.m.decode([{ cache, token: 5 + s, lora: decoder.h[a] }])[0]));
        got.forEach((l, s) => expect(l.equals(want.logits[s]), `${a}, step ${s}`).toBe(true));
        expect(kvDigest(decoder.m, cache)).toBe(want.kv);
        decoder.m.freeCache(cache);
      }
    } finally {
      prefiller.m.close();
      decoder.m.close();
    }
  });
});
