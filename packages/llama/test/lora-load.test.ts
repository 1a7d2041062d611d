// Loading PEFT LoRA adapter folders: what is accepted (list, regex and all-linear targets,
// layers_to_transform, F32/BF16 weights, the base model by path, id or a given name) and every
// refusal, as a LoraError naming the adapter_config.json key (`field`) or the tensor (`tensor`)
// the API layer will turn into a 400: a rank over maxLoraRank, another base model, unsupported
// PEFT features, a tensor missing, unexpected, of the wrong shape or dtype, non-finite, truncated.
import { mkdirSync, mkdtempSync, readFileSync, rmSync, truncateSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { ConfigError } from "@airm/rm-core";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { LoraError } from "../src/lora/lora-error.ts";
import { LlamaModel } from "../src/model/llama-model.ts";
import { makeTinyLora, type TinyLoraOptions } from "../src/tiny/make-tiny-lora.ts";
import { type TensorToWrite, writeSafetensors } from "../src/tiny/safetensors-writer.ts";
import { storedTensors } from "./model-helpers/lora-adapters.ts";
import { randomCheckpoint, tinyConfig } from "./model-helpers/random-checkpoint.ts";

const config = tinyConfig();
const root = mkdtempSync(join(tmpdir(), "airm-lora-load-"));
let model: LlamaModel;
let count = 0;

beforeAll(async () => {
  model = await LlamaModel.load(randomCheckpoint(config, 3), { lora: { maxLoraRank: 8 } });
});
afterAll(() => {
  model.close();
  rmSync(root, { recursive: true, force: true });
});

/** A fresh adapter folder for the test model (q_proj and v_proj, r 4, F32, unless `over` says). */
function adapter(over: Partial<TinyLoraOptions> = {}): string {
  const out = join(root, `a${count++}`);
  makeTinyLora({ out, model: config, baseModel: "random-llama-3", r: 4, seed: count, ...over });
  return out;
}

function editConfig(dir: string, patch: Record<string, unknown>): string {
  const file = join(dir, "adapter_config.json");
  writeFileSync(file, JSON.stringify({ ...JSON.parse(readFileSync(file, "utf8")), ...patch }));
  return dir;
}

function rewriteTensors(dir: string, edit: (ts: TensorToWrite[]) => TensorToWrite[]): string {
  writeSafetensors(join(dir, "adapter_model.safetensors"), edit(storedTensors(dir)));
  return dir;
}

/** The LoraError loading `dir` throws; fails when it loads. */
function refusal(dir: string): LoraError {
  try {
    model.loadLora(`bad${count++}`, dir);
  } catch (e) {
    expect(e).toBeInstanceOf(LoraError);
    return e as LoraError;
  }
  throw new Error(`${dir} loaded`);
}

const A0 = "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight";
const B1 = "base_model.model.model.layers.1.self_attn.v_proj.lora_B.weight";

describe("accepted adapters", () => {
  it("reads r, alpha, targets and layers: list, regex, all-linear, layers_to_transform, rsLoRA, BF16", () => {
    const cases: [Partial<TinyLoraOptions>, { targets: string[]; layers: number[]; scale: number }][] = [
      [{}, { targets: ["q_proj", "v_proj"], layers: [0, 1], scale: 2 }],
      [
        { targets: "model\\.layers\\.\\d+\\.mlp\\.(gate|down)_proj", alpha: 6 },
        { targets: ["gate_proj", "down_proj"], layers: [0, 1], scale: 1.5 },
      ],
      [
        { targets: "all-linear", r: 8, alpha: 16, useRslora: true, dtype: "bf16" },
        { targets: ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"], layers: [0, 1], scale: Math.fround(16 / Math.sqrt(8)) },
      ],
      [
        { targets: ["self_attn.o_proj", "up_proj"], layers: [1], r: 3 },
        { targets: ["o_proj", "up_proj"], layers: [1], scale: 2 },
      ],
    ];
    for (const [over, want] of cases) {
      const h = model.loadLora(`ok${count}`, adapter(over));
      expect({ targets: [...h.targets], layers: [...h.layers], scale: h.scale }).toEqual(want);
      expect(h.fingerprint).toMatch(/^[0-9a-f]{64}$/);
      model.unloadLora(h);
    }
  });

  it("checks the base model by path, id or a name given at load; an adapter without one is taken on its shapes", () => {
    const elsewhere = adapter({ baseModel: "/models/elsewhere/random-llama-3" });
    model.unloadLora(model.loadLora("by-last-segment", elsewhere));
    const hub = adapter({ baseModel: "acme/tiny-llama" });
    expect(refusal(hub).field).toBe("base_model_name_or_path");
    model.unloadLora(model.loadLora("by-name", hub, { baseModelNames: ["acme/tiny-llama"] }));
    model.unloadLora(model.loadLora("unnamed", editConfig(adapter(), { base_model_name_or_path: null })));
  });

  it("refuses a second adapter under a name in use, and a handle after unloadLora", () => {
    const h = model.loadLora("twice", adapter());
    expect(() => model.loadLora("twice", adapter())).toThrow(ConfigError);
    model.unloadLora("twice");
    const cache = model.newCache(8);
    expect(() => model.prefill([5, 6], cache, { lora: h })).toThrow(/no LoRA adapter "twice" is loaded/);
    expect(cache.n).toBe(0);
    model.freeCache(cache);
  });
});

describe("refused, naming the adapter_config.json key", () => {
  const fields: [string, () => string, RegExp][] = [
    ["r", () => adapter({ r: 9 }), /r: rank 9 is over this engine's limit of 8 \(maxLoraRank/],
    ["use_dora", () => editConfig(adapter(), { use_dora: true }), /DoRA/],
    ["modules_to_save", () => editConfig(adapter(), { modules_to_save: ["lm_head"] }), /modules_to_save/],
    ["bias", () => editConfig(adapter(), { bias: "lora_only" }), /"none"/],
    ["rank_pattern", () => editConfig(adapter(), { rank_pattern: { q_proj: 2 } }), /per-module ranks/],
    ["init_lora_weights", () => editConfig(adapter(), { init_lora_weights: "pissa" }), /rewrites the base weights/],
    ["peft_type", () => editConfig(adapter(), { peft_type: "IA3" }), /only LORA/],
    ["fan_in_fan_out", () => editConfig(adapter(), { fan_in_fan_out: true }), /Conv1D/],
    ["some_new_feature", () => editConfig(adapter(), { some_new_feature: { on: true } }), /unknown adapter_config.json key/],
    ["target_modules", () => editConfig(adapter(), { target_modules: ["q_proj", "lm_head"] }), /"lm_head" is none of/],
    ["layers_to_transform", () => editConfig(adapter(), { layers_to_transform: [5] }), /\[0, 2\)/],
    ["layers_to_transform", () => editConfig(adapter(), { target_modules: "all-linear", layers_to_transform: [1] }), /string target_modules/],
    ["base_model_name_or_path", () => adapter({ baseModel: "meta-llama/Llama-3.1-8B" }), /trained on "meta-llama\/Llama-3.1-8B"/],
  ];
  it.each(fields)("%s", (field, make, message) => {
    const e = refusal(make());
    expect(e.field).toBe(field);
    expect(e.tensor).toBeUndefined();
    expect(e.message).toContain(`${field}:`);
    expect(e.message).toMatch(message);
  });
});

describe("refused, naming the tensor", () => {
  const tensors: [string, string, () => string, RegExp][] = [
    ["a missing tensor", B1, () => rewriteTensors(adapter(), (ts) => ts.filter((t) => t.name !== B1)), /is missing/],
    [
      "a wrong shape",
      A0,
      () => rewriteTensors(adapter(), (ts) => ts.map((t) => (t.name === A0 ? { ...t, shape: [4, 60], bytes: () => t.bytes().subarray(0, 4 * 60 * 4) } : t))),
      /has shape \[4, 60\], this model and r need \[4, 64\]/,
    ],
    [
      "a tensor of a module not targeted",
      "base_model.model.model.layers.0.self_attn.k_proj.lora_A.weight",
      () => rewriteTensors(adapter(), (ts) => [...ts, { ...ts[0], name: "base_model.model.model.layers.0.self_attn.k_proj.lora_A.weight" }]),
      /do not target/,
    ],
    [
      "a tensor of no projection",
      "base_model.model.lm_head.lora_A.weight",
      () => rewriteTensors(adapter(), (ts) => [...ts, { ...ts[0], name: "base_model.model.lm_head.lora_A.weight" }]),
      /not a LoRA A\/B weight/,
    ],
    ["an unsupported dtype", A0, () => retyped(adapter(), A0, "I32"), /dtype I32/],
    [
      "a non-finite value",
      A0,
      () => rewriteTensors(adapter(), (ts) => ts.map((t) => (t.name === A0 ? { ...t, bytes: () => withNaN(t.bytes(), 7) } : t))),
      /non-finite value at element 7/,
    ],
    ["a truncated file", B1, () => truncated(adapter()), /truncated/],
  ];
  it.each(tensors)("%s", (_what, tensor, make, message) => {
    const e = refusal(make());
    expect(e.tensor).toBe(tensor);
    expect(e.field).toBeUndefined();
    expect(e.message).toContain(tensor);
    expect(e.message).toMatch(message);
  });

  it("a folder without adapter_config.json, or with a pickled adapter_model.bin only", () => {
    const empty = join(root, "empty");
    mkdirSync(empty);
    expect(refusal(empty).message).toMatch(/no adapter_config.json/);
    const bin = adapter();
    rmSync(join(bin, "adapter_model.safetensors"));
    writeFileSync(join(bin, "adapter_model.bin"), "pickle");
    expect(refusal(bin).message).toMatch(/safe_serialization/);
  });

  it("nothing refused stayed loaded, and the model still runs", () => {
    expect(model.loras()).toEqual([]);
    const cache = model.newCache(4);
    expect(model.prefill([7, 8, 9], cache).every(Number.isFinite)).toBe(true);
    model.freeCache(cache);
  });
});

/** F32 bytes with element `i` set to NaN. */
function withNaN(bytes: Uint8Array, i: number): Uint8Array {
  const copy = new Uint8Array(bytes);
  new DataView(copy.buffer).setFloat32(i * 4, Number.NaN, true);
  return copy;
}

/** The adapter with tensor `name` declared as `dtype` (of F32's 4 bytes per element; the header keeps its length). */
function retyped(dir: string, name: string, dtype: string): string {
  const file = join(dir, "adapter_model.safetensors");
  const text = readFileSync(file).toString("latin1");
  const entry = `"${name}":{"dtype":"F32"`;
  expect(text).toContain(entry);
  writeFileSync(file, Buffer.from(text.replace(entry, `"${name}":{"dtype":"${dtype}"`), "latin1"));
  return dir;
}

/** The adapter with its weights file cut 16 bytes short (inside its last tensor, layer 1's v_proj B). */
function truncated(dir: string): string {
  const file = join(dir, "adapter_model.safetensors");
  truncateSync(file, readFileSync(file).length - 16);
  return dir;
}
