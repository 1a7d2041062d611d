// The model's LoRA registry: at most maxLoras adapters resident; loading another sends the least
// recently used one back to disk, and a pass that names it reads it again with the same bits; an
// adapter a running pass holds is never evicted, and one unloaded meanwhile is freed when the pass
// ends; a pass naming more adapters than can be resident, a handle of another model, and an
// adapter whose files changed while it was on disk are refused before anything changes.
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { ConfigError } from "@airm/rm-core";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { LoraError } from "../src/lora/lora-error.ts";
import type { LoraHandle } from "../src/lora/lora-registry.ts";
import { LlamaModel, type LlamaModelOptions } from "../src/model/llama-model.ts";
import { makeTinyLora } from "../src/tiny/make-tiny-lora.ts";
import { randomCheckpoint, tinyConfig } from "./model-helpers/random-checkpoint.ts";

const config = tinyConfig();
const root = mkdtempSync(join(tmpdir(), "airm-lora-registry-"));
const dirs = { qv: join(root, "qv"), all: join(root, "all"), late: join(root, "late") };
const prompt = [1, 40, 41, 42, 99, 7, 250, 13];
const bits = (x: Float32Array) => Buffer.from(x.buffer, x.byteOffset, x.byteLength);

/** (Re)writes adapter `name` with weights from `seed`. */
function write(name: keyof typeof dirs, seed: number): void {
  const targets = { qv: ["q_proj", "v_proj"], all: "all-linear", late: ["down_proj"] }[name];
  makeTinyLora({ out: dirs[name], model: config, baseModel: "random-llama-3", r: 4, targets, seed });
}

const load = (opts: LlamaModelOptions = {}) => LlamaModel.load(randomCheckpoint(config, 3), opts);

/** The last logits of `prompt` on `lora`, as bytes. */
function logits(m: LlamaModel, lora: LoraHandle | undefined, tokens = prompt): Buffer {
  const cache = m.newCache(tokens.length);
  try {
    return bits(m.prefill(tokens, cache, { lora }));
  } finally {
    m.freeCache(cache);
  }
}

/** Which of the model's adapters are resident, by name. */
const residents = (m: LlamaModel) =>
  m
    .loras()
    .filter((h) => m.loraResident(h))
    .map((h) => h.name);

let reference: LlamaModel;
const want: Record<string, Buffer> = {};
beforeAll(async () => {
  write("qv", 1);
  write("all", 2);
  write("late", 3);
  // every adapter resident (the default maxLoras is 4): the bits each must give
  reference = await load();
  for (const name of Object.keys(dirs) as (keyof typeof dirs)[]) want[name] = logits(reference, reference.loadLora(name, dirs[name]));
});
afterAll(() => {
  reference.close();
  rmSync(root, { recursive: true, force: true });
});

describe("LoRA registry", () => {
  it("keeps at most maxLoras resident, evicts the least recently used, and reads it again with the same bits", async () => {
    const m = await load({ lora: { maxLoras: 2 } });
    try {
      const qv = m.loadLora("qv", dirs.qv);
      const all = m.loadLora("all", dirs.all);
      expect(logits(m, qv).equals(want.qv)).toBe(true);
      const late = m.loadLora("late", dirs.late);
      // qv ran after all was loaded: all is the least recently used
      expect(residents(m)).toEqual(["qv", "late"]);
      expect(logits(m, all).equals(want.all)).toBe(true);
      expect(residents(m)).toEqual(["all", "late"]);
      expect(logits(m, qv).equals(want.qv)).toBe(true);
      expect(logits(m, late).equals(want.late)).toBe(true);
      expect(residents(m)).toEqual(["qv", "late"]);
      expect(m.loras().map((h) => h.name)).toEqual(["qv", "all", "late"]);
      expect(m.loraLimits).toEqual({ maxLoras: 2, maxLoraRank: 64 });
    } finally {
      m.close();
    }
  });

  it("refuses a pass naming more adapters than maxLoras before anything changes", async () => {
    const m = await load({ lora: { maxLoras: 2 } });
    try {
      const h = Object.values(dirs).map((dir, i) => m.loadLora(`a${i}`, dir));
      const caches = h.map(() => m.newCache(prompt.length));
      const used = m.kvPool.usedBlocks;
      expect(() => m.pass(h.map((lora, i) => ({ tokens: prompt, cache: caches[i], lora })))).toThrow(expect.objectContaining({ key: "maxLoras" }));
      expect(caches.map((c) => c.n)).toEqual([0, 0, 0]);
      expect(m.kvPool.usedBlocks).toBe(used);
    } finally {
      m.close();
    }
  });

  it("never evicts an adapter a running pass holds; one unloaded during the pass is freed when it ends", async () => {
    const m = await load({ lora: { maxLoras: 1 } });
    try {
      const qv = m.loadLora("qv", dirs.qv);
      const cache = m.newCache(prompt.length);
      let all: LoraHandle | undefined;
      const pause = async () => {
        if (all) return;
        all = m.loadLora("all", dirs.all);
        expect(residents(m)).toEqual(["qv"]);
        m.unloadLora(qv);
      };
      const [out] = await m.passAsync([{ tokens: prompt, cache, lora: qv }], { pause });
      expect(bits(out[0]).equals(want.qv)).toBe(true);
      expect(m.loras().map((h) => h.name)).toEqual(["all"]);
      expect(() => logits(m, qv)).toThrow(ConfigError);
      expect(logits(m, all).equals(want.all)).toBe(true);
      expect(residents(m)).toEqual(["all"]);
    } finally {
      m.close();
    }
  });

  it("refuses an adapter whose files changed while it was on disk, and a handle of another model", async () => {
    const m = await load({ lora: { maxLoras: 1 } });
    try {
      const late = m.loadLora("late", dirs.late);
      m.loadLora("qv", dirs.qv);
      expect(residents(m)).toEqual(["qv"]);
      write("late", 99);
      const cache = m.newCache(prompt.length);
      expect(() => m.prefill(prompt, cache, { lora: late })).toThrow(LoraError);
      expect(() => m.prefill(prompt, cache, { lora: late })).toThrow(/changed on disk since it was loaded/);
      expect(cache.n).toBe(0);
      expect(() => m.prefill(prompt, cache, { lora: reference.getLora("qv") })).toThrow(expect.objectContaining({ key: "lora" }));
    } finally {
      write("late", 3);
      m.close();
    }
  });

  it("refuses limits that are not positive integers, naming them", async () => {
    await expect(load({ lora: { maxLoras: 0 } })).rejects.toThrow(expect.objectContaining({ key: "maxLoras" }));
    await expect(load({ lora: { maxLoraRank: 2.5 } })).rejects.toThrow(expect.objectContaining({ key: "maxLoraRank" }));
  });
});
