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

  it("qwen3: head_dim from the key or Qwen3Config's 128 (listed as defaulted), kv heads required, attention_bias refused", () => {
    const qwen3 = { ...QWEN2_CONFIG, architectures: ["Qwen3ForCausalLM"], model_type: "qwen3", head_dim: 8, attention_bias: false };
    expect(parseHfConfig(qwen3, "c")).toMatchObject({ architecture: "qwen3", headDim: 8, attentionBias: false });
    const { head_dim: _hd, ...noHeadDim } = qwen3;
    const defaulted: string[] = [];
    expect(parseHfConfig(noHeadDim, "c", defaulted).headDim).toBe(128);
    expect(defaulted).toContain("head_dim");
    const { architectures: _a, ...byModelType } = qwen3;
    expect(parseHfConfig(byModelType, "c").architecture).toBe("qwen3");
    const { num_key_value_heads: _kv, ...noKv } = qwen3;
    expect(configError(noKv).item).toBe("num_key_value_heads");
    const e = configError({ ...qwen3, attention_bias: true });
    expect(e.item).toBe("attention_bias");
    expect(e.message).toContain("o_proj");
  });

  it("gemma3: local layers, window, both RoPE bases and the attention scalar from 4.x or 5.x keys; soft-capping, rope scaling, other activations refused", () => {
    const gemma = {
      architectures: ["Gemma3ForCausalLM"],
      model_type: "gemma3_text",
      hidden_size: 16,
      intermediate_size: 32,
      num_hidden_layers: 6,
      num_attention_heads: 2,
      num_key_value_heads: 1,
      head_dim: 8,
      vocab_size: 64,
      hidden_activation: "gelu_pytorch_tanh",
      query_pre_attn_scalar: 8,
      sliding_window: 512,
      rope_theta: 1000000,
      rope_local_base_freq: 10000,
      final_logit_softcapping: null,
      attn_logit_softcapping: null,
      rope_scaling: null,
    };
    const want = { architecture: "gemma3", ropeTheta: 1e6, queryPreAttnScalar: 8, slidingWindow: { window: 512, layers: [true, true, true, true, true, false], ropeTheta: 10000 } };
    expect(parseHfConfig(gemma, "c")).toMatchObject({ ...want, tieWordEmbeddings: true, attentionBias: false });
    // transformers 5: layer_types and rope_parameters per layer type
    const { rope_theta: _t, rope_local_base_freq: _l, ...v5 } = gemma;
    const layerTypes = ["sliding_attention", "full_attention", "sliding_attention", "full_attention", "sliding_attention", "full_attention"];
    const rope_parameters = { full_attention: { rope_type: "default", rope_theta: 1e6 }, sliding_attention: { rope_type: "default", rope_theta: 1e4 } };
    expect(parseHfConfig({ ...v5, layer_types: layerTypes, rope_parameters }, "c").slidingWindow).toEqual({
      window: 512,
      layers: [true, false, true, false, true, false],
      ropeTheta: 1e4,
    });
    // defaults are Gemma3TextConfig's, and listed
    const { head_dim: _h, query_pre_attn_scalar: _q, sliding_window: _w, ...bare } = gemma;
    const defaulted: string[] = [];
    expect(parseHfConfig(bare, "c", defaulted)).toMatchObject({ headDim: 256, queryPreAttnScalar: 256, slidingWindow: { window: 4096 } });
    expect(defaulted).toEqual(expect.arrayContaining(["head_dim", "query_pre_attn_scalar", "sliding_window", "sliding_window_pattern"]));
    for (const [over, item] of [
      [{ final_logit_softcapping: 30 }, "final_logit_softcapping"],
      [{ attn_logit_softcapping: 50 }, "attn_logit_softcapping"],
      [{ rope_scaling: { rope_type: "linear", factor: 8 } }, "rope_scaling"],
      [{ hidden_activation: "gelu" }, "hidden_activation"],
      [{ use_bidirectional_attention: true }, "use_bidirectional_attention"],
      [{ sliding_window: 2 }, "sliding_window"],
      [{ layer_types: ["sliding_attention"] }, "layer_types"],
      [{ attention_bias: true }, "attention_bias"],
    ] as const) {
      expect(configError({ ...gemma, ...over }).item, item).toBe(item);
    }
  });

  it("merges generation_config eos (int or list) with config eos, generation first", () => {
    const config = parseHfConfig({ ...LLAMA_CONFIG, eos_token_id: [2, 7] }, "c");
    expect(parseGenerationConfig({ eos_token_id: 9 }, "g", config).eosTokenIds).toEqual([9, 2, 7]);
    expect(parseGenerationConfig({ eos_token_id: [7, 3] }, "g", config).eosTokenIds).toEqual([7, 3, 2]);
    expect(parseGenerationConfig(undefined, "g", config)).toEqual({ eosTokenIds: [2, 7] });
  });

  it("reads the sampling defaults vLLM's --generation-config auto takes; leaves out a bad one by name", () => {
    const config = parseHfConfig(LLAMA_CONFIG, "c");
    // Qwen2.5-Instruct's generation_config.json, with min_p added
    const qwen = { do_sample: true, eos_token_id: [151645, 151643], pad_token_id: 151643, repetition_penalty: 1.05, temperature: 0.7, top_p: 0.8, top_k: 20, min_p: 0.05 };
    expect(parseGenerationConfig(qwen, "/m/generation_config.json", config)).toEqual({
      eosTokenIds: [151645, 151643, 2],
      temperature: 0.7,
      topP: 0.8,
      topK: 20,
      minP: 0.05,
      repetitionPenalty: 1.05,
      samplingFrom: "generation_config.json",
    });
    // a file without sampling keys: none, and where they were looked for
    expect(parseGenerationConfig({ eos_token_id: 2 }, "/m/generation_config.json", config)).toEqual({ eosTokenIds: [2], samplingFrom: "generation_config.json" });
    const bad = parseGenerationConfig({ temperature: "hot", top_p: 0, top_k: 2.5, min_p: 2, repetition_penalty: 1.1 }, "g", config);
    expect(bad).toEqual({
      eosTokenIds: [2],
      repetitionPenalty: 1.1,
      samplingFrom: "g",
      samplingIgnored: [
        'temperature="hot" (temperature must be a number in [0, 2])',
        "top_p=0 (top_p must be a number in (0, 1])",
        "top_k=2.5 (top_k must be an integer >= -1)",
        "min_p=2 (min_p must be a number in [0, 1])",
      ],
    });
  });
});

/** SmolLM2-135M-Instruct's config.json as transformers 4.42 saved it (published with the model). */
const SMOLLM2_4X = {
  architectures: ["LlamaForCausalLM"],
  attention_bias: false,
  attention_dropout: 0.0,
  bos_token_id: 1,
  eos_token_id: 2,
  hidden_act: "silu",
  hidden_size: 576,
  initializer_range: 0.041666666666666664,
  intermediate_size: 1536,
  is_llama_config: true,
  max_position_embeddings: 8192,
  mlp_bias: false,
  model_type: "llama",
  num_attention_heads: 9,
  num_hidden_layers: 30,
  num_key_value_heads: 3,
  pad_token_id: 2,
  pretraining_tp: 1,
  rms_norm_eps: 1e-5,
  rope_interleaved: false,
  rope_scaling: null,
  rope_theta: 100000,
  tie_word_embeddings: true,
  torch_dtype: "bfloat16",
  transformers_version: "4.42.3",
  use_cache: true,
  vocab_size: 49152,
};

/** The same model re-saved by transformers 5.24 (LlamaConfig.save_pretrained): rope_parameters, dtype, no top-level rope_theta. */
const SMOLLM2_5X = {
  architectures: ["LlamaForCausalLM"],
  attention_bias: false,
  attention_dropout: 0.0,
  bos_token_id: 1,
  dtype: "bfloat16",
  eos_token_id: 2,
  head_dim: 64,
  hidden_act: "silu",
  hidden_size: 576,
  initializer_range: 0.041666666666666664,
  intermediate_size: 1536,
  max_position_embeddings: 8192,
  mlp_bias: false,
  model_type: "llama",
  num_attention_heads: 9,
  num_hidden_layers: 30,
  num_key_value_heads: 3,
  pad_token_id: 2,
  pretraining_tp: 1,
  rms_norm_eps: 1e-5,
  rope_parameters: { rope_theta: 100000.0, rope_type: "default" },
  tie_word_embeddings: true,
  transformers_version: "5.24.0",
  use_cache: true,
  vocab_size: 49152,
};

/** Qwen2.5-0.5B-Instruct's config.json (transformers 4.43) and its transformers-5 form. */
const QWEN25_4X = {
  architectures: ["Qwen2ForCausalLM"],
  attention_dropout: 0.0,
  bos_token_id: 151643,
  eos_token_id: 151645,
  hidden_act: "silu",
  hidden_size: 896,
  initializer_range: 0.02,
  intermediate_size: 4864,
  max_position_embeddings: 32768,
  max_window_layers: 21,
  model_type: "qwen2",
  num_attention_heads: 14,
  num_hidden_layers: 24,
  num_key_value_heads: 2,
  rms_norm_eps: 1e-6,
  rope_theta: 1000000.0,
  sliding_window: 131072,
  tie_word_embeddings: true,
  torch_dtype: "bfloat16",
  transformers_version: "4.43.1",
  use_cache: true,
  use_sliding_window: false,
  vocab_size: 151936,
};
const { rope_theta: _qt, torch_dtype: _qd, ...qwenRest } = QWEN25_4X;
const QWEN25_5X = {
  ...qwenRest,
  dtype: "bfloat16",
  layer_types: Array.from({ length: 24 }, () => "full_attention"),
  rope_parameters: { rope_theta: 1000000.0, rope_type: "default" },
  sliding_window: null,
  transformers_version: "5.24.0",
};

/** Llama 3.1's rope scaling, as 4.x (rope_scaling + rope_theta) and 5.x (rope_parameters) write it. */
const LLAMA31_4X = {
  ...LLAMA_CONFIG,
  rope_theta: 500000.0,
  rope_scaling: { factor: 8.0, low_freq_factor: 1.0, high_freq_factor: 4.0, original_max_position_embeddings: 8192, rope_type: "llama3" },
};
const { rope_theta: _lt, rope_scaling: _ls, ...llamaRest } = LLAMA31_4X;
const LLAMA31_5X = { ...llamaRest, rope_parameters: { ...LLAMA31_4X.rope_scaling, rope_theta: 500000.0 } };

describe("transformers 4.x and 5.x configs", () => {
  it.each([
    ["SmolLM2 (llama, default rope)", SMOLLM2_4X, SMOLLM2_5X],
    ["Qwen2.5 (qwen2)", QWEN25_4X, QWEN25_5X],
    ["Llama 3.1 rope scaling", LLAMA31_4X, LLAMA31_5X],
  ])("%s: both forms resolve to the same values and default the same keys", (_name, v4, v5) => {
    const d4: string[] = [];
    const d5: string[] = [];
    const a = parseHfConfig(v4, "4.x/config.json", d4);
    const b = parseHfConfig(v5, "5.x/config.json", d5);
    expect(b).toEqual(a);
    // the small Llama fixture has no attention_bias key; the published configs name every key
    const expected = "attention_bias" in v4 || v4 === QWEN25_4X ? [] : ["attention_bias"];
    expect(d4).toEqual(expected);
    expect(d5).toEqual(expected);
  });

  it("resolves the SmolLM2 values a transformers-5 folder used to lose (rope theta 100000, not 10000)", () => {
    expect(parseHfConfig(SMOLLM2_5X, "c")).toMatchObject({
      ropeTheta: 100000,
      ropeScaling: null,
      rmsNormEps: 1e-5,
      tieWordEmbeddings: true,
      attentionBias: false,
      headDim: 64,
      numKvHeads: 3,
      maxPositionEmbeddings: 8192,
      storedDtype: "bfloat16",
    });
    expect(parseHfConfig(QWEN25_5X, "c")).toMatchObject({ ropeTheta: 1000000, attentionBias: true, tieWordEmbeddings: true, headDim: 64 });
    expect(parseHfConfig(LLAMA31_5X, "c").ropeScaling).toEqual({ type: "llama3", factor: 8, lowFreqFactor: 1, highFreqFactor: 4, originalMaxPositionEmbeddings: 8192 });
  });

  it("takes what a config leaves out from the architecture's documented defaults and lists those keys", () => {
    const { rms_norm_eps: _e, rope_parameters: _r, tie_word_embeddings: _t, max_position_embeddings: _m, attention_bias: _b, ...bare } = SMOLLM2_5X;
    const defaulted: string[] = [];
    expect(parseHfConfig(bare, "c", defaulted)).toMatchObject({ rmsNormEps: 1e-6, ropeTheta: 10000, tieWordEmbeddings: false, maxPositionEmbeddings: 2048, attentionBias: false });
    expect(defaulted.sort()).toEqual(["attention_bias", "max_position_embeddings", "rms_norm_eps", "rope_theta", "tie_word_embeddings"]);
    const q: string[] = [];
    const { max_position_embeddings: _qm, ...qBare } = QWEN25_5X;
    expect(parseHfConfig(qBare, "c", q).maxPositionEmbeddings).toBe(32768);
    expect(q).toEqual(["max_position_embeddings"]);
  });

  it.each([
    ["an unknown rope type (5.x)", { ...SMOLLM2_5X, rope_parameters: { rope_type: "yarn", rope_theta: 1e5, factor: 4 } }, "rope_parameters.rope_type"],
    ["an unknown rope type (4.x)", { ...SMOLLM2_4X, rope_scaling: { type: "dynamic", factor: 2 } }, "rope_scaling.type"],
    ["a rope key the type does not read", { ...SMOLLM2_5X, rope_parameters: { rope_type: "default", rope_theta: 1e5, factor: 2 } }, "rope_parameters.factor"],
    ["a partial rotary factor", { ...SMOLLM2_5X, partial_rotary_factor: 0.5 }, "partial_rotary_factor"],
    ["interleaved rope pairs", { ...SMOLLM2_4X, rope_interleaved: true }, "rope_interleaved"],
    ["another activation", { ...SMOLLM2_5X, hidden_act: "gelu" }, "hidden_act"],
    ["an MLP bias", { ...SMOLLM2_5X, mlp_bias: true }, "mlp_bias"],
    ["a quantization config", { ...SMOLLM2_5X, quantization_config: { quant_method: "gptq", bits: 4 } }, "quantization_config"],
    ["a sliding window (qwen2)", { ...QWEN25_4X, use_sliding_window: true }, "use_sliding_window"],
    ["sliding layers (5.x layer_types)", { ...QWEN25_5X, layer_types: ["full_attention", "sliding_attention"] }, "layer_types"],
    ["a dtype that is not a float", { ...SMOLLM2_5X, dtype: "int8" }, "dtype"],
    ["a rope theta that is not a number", { ...SMOLLM2_4X, rope_theta: "1e5" }, "config.rope_theta"],
    ["qwen2 without num_key_value_heads (its class default would be a guess)", (({ num_key_value_heads: _k, ...r }) => r)(QWEN25_4X), "num_key_value_heads"],
  ])("refuses %s, naming the key", (_what, raw, key) => {
    const e = configError(raw);
    expect(e.item).toBe(key);
    expect(e.message).toContain("/m/config.json");
  });
});
