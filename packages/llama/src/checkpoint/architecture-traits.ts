// What each supported architecture computes beyond the Llama block (RMSNorm, rotate-half RoPE,
// GQA attention, SwiGLU MLP; Gemma 3 differs most: (1 + w) norms, sandwich norms, scaled
// embeddings, GeGLU, and sliding-window layers, which ModelConfig.slidingWindow describes): the config parsers, the expected-tensor list and the model read these
// traits instead of testing architecture names. Knows names and traits, no arithmetic.

import type { Architecture, ModelConfig } from "../checkpoint-types.ts";

export interface ArchitectureTraits {
  /** Hugging Face class name in config.json's `architectures`. */
  hfClass: string;
  /** GGUF `general.architecture`. */
  ggufName: string;
  /** Per-head RMSNorm of q and k (weights `self_attn.q_norm` / `k_norm` of head_dim) after the projections, before RoPE. */
  qkNorm: boolean;
  /** llama.cpp's converter permutes q/k rows for its interleaved RoPE (the loader undoes it). */
  ggufPermutesQk: boolean;
  /** RMSNorm weights act as (1 + w) (Gemma's convention; llama.cpp's converter stores w + 1 in the GGUF). */
  normPlusOne: boolean;
  /** Norms after attention and after the MLP too ("sandwich": post_attention_layernorm on the attention output, pre_/post_feedforward_layernorm around the MLP). */
  sandwichNorms: boolean;
  /** Embeddings scaled by sqrt(hidden_size) (in f32, our activation dtype). */
  embedScale: boolean;
  /** The gated MLP's activation: SiLU (SwiGLU) or gelu with the tanh approximation (GeGLU). */
  activation: "silu" | "gelu_tanh";
}

const LLAMA_BLOCK = { qkNorm: false, ggufPermutesQk: false, normPlusOne: false, sandwichNorms: false, embedScale: false, activation: "silu" } as const;

export const ARCHITECTURE_TRAITS: Record<Architecture, ArchitectureTraits> = {
  llama: { hfClass: "LlamaForCausalLM", ggufName: "llama", ...LLAMA_BLOCK, ggufPermutesQk: true },
  qwen2: { hfClass: "Qwen2ForCausalLM", ggufName: "qwen2", ...LLAMA_BLOCK },
  qwen3: { hfClass: "Qwen3ForCausalLM", ggufName: "qwen3", ...LLAMA_BLOCK, qkNorm: true },
  gemma3: {
    hfClass: "Gemma3ForCausalLM",
    ggufName: "gemma3",
    qkNorm: true,
    ggufPermutesQk: false,
    normPlusOne: true,
    sandwichNorms: true,
    embedScale: true,
    activation: "gelu_tanh",
  },
};

/** The traits of a config's architecture. */
export function traitsOf(config: Pick<ModelConfig, "architecture">): ArchitectureTraits {
  return ARCHITECTURE_TRAITS[config.architecture];
}
