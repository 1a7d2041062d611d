import { describe, expect, it } from "vitest";
import { parseGenerationConfig, parseHfConfig } from "../src/checkpoint/hf-config.ts";
import { ModelLoadError } from "../src/checkpoint/model-load-error.ts";
import { LLAMA_CONFIG, QWEN2_CONFIG } from "./fixtures/io/hf-folder.ts";

function configError(raw: unknown): ModelLoadError {
  try {
    parseHfConfig(raw, "/m/config.json");
  } catch (e) {
    expect(e).toBeInstanceOf(ModelLoadError);
    return e as ModelLoadError;
  }
  throw new Error("expected a ModelLoadError");
}

describe("config.json parsing", () => {
  it("accepts rope_scaling with `type` as well as `rope_type`, and null / default as none", () => {
    const { rope_type: _drop, ...rest } = LLAMA_CONFIG.rope_scaling;
    expect(parseHfConfig({ ...LLAMA_CONFIG, rope_scaling: { ...rest, type: "llama3" } }, "c").ropeScaling).toEqual({
      type: "llama3",
      factor: 8,
      lowFreqFactor: 1,
      highFreqFactor: 4,
      originalMaxPositionEmbeddings: 8192,
    });
    expect(parseHfConfig({ ...LLAMA_CONFIG, rope_scaling: null }, "c").ropeScaling).toBeNull();
    expect(parseHfConfig({ ...LLAMA_CONFIG, rope_scaling: { rope_type: "default" } }, "c").ropeScaling).toBeNull();
  });

  it("derives head_dim and kv heads, or takes them as given", () => {
    const { num_key_value_heads: _kv, ...noKv } = LLAMA_CONFIG;
    expect(parseHfConfig(noKv, "c")).toMatchObject({ numKvHeads: 4, headDim: 4 });
    expect(parseHfConfig({ ...LLAMA_CONFIG, head_dim: 8 }, "c").headDim).toBe(8);
    expect(parseHfConfig({ ...QWEN2_CONFIG, eos_token_id: [5, 6] }, "c").eosTokenIds).toEqual([5, 6]);
  });

  it("names the file and the key for bad or unsupported values", () => {
    let e = configError({ ...LLAMA_CONFIG, rope_scaling: { rope_type: "yarn", factor: 4 } });
    expect(e.message).toContain("/m/config.json");
    expect(e.message).toContain("yarn");
    e = configError({ ...LLAMA_CONFIG, rope_scaling: { rope_type: "llama3", factor: 8 } });
    expect(e.message).toContain("original_max_position_embeddings");
    const { hidden_size: _h, ...noHidden } = LLAMA_CONFIG;
    e = configError(noHidden);
    expect(e.item).toBe("hidden_size");
    e = configError({ ...LLAMA_CONFIG, num_key_value_heads: 3 });
    expect(e.message).toContain("num_key_value_heads");
    e = configError({ ...LLAMA_CONFIG, architectures: ["GPT2LMHeadModel"] });
    expect(e.message).toContain("GPT2LMHeadModel");
    e = configError({ ...LLAMA_CONFIG, eos_token_id: "two" });
    expect(e.item).toBe("eos_token_id");
    e = configError([1, 2]);
    expect(e.message).toContain("not a JSON object");
  });

  it("merges generation_config eos (int or list) with config eos, generation first", () => {
    const config = parseHfConfig({ ...LLAMA_CONFIG, eos_token_id: [2, 7] }, "c");
    expect(parseGenerationConfig({ eos_token_id: 9 }, "g", config).eosTokenIds).toEqual([9, 2, 7]);
    expect(parseGenerationConfig({ eos_token_id: [7, 3] }, "g", config).eosTokenIds).toEqual([7, 3, 2]);
    expect(parseGenerationConfig(undefined, "g", config)).toEqual({ eosTokenIds: [2, 7] });
  });
});
