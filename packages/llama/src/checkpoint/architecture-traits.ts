// What each supported architecture computes beyond the Llama block (RMSNorm, rotate-half RoPE,
// GQA attention, SwiGLU MLP): the config parsers, the expected-tensor list and the model read these
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
}

export const ARCHITECTURE_TRAITS: Record<Architecture, ArchitectureTraits> = {
  llama: { hfClass: "LlamaForCausalLM", ggufName: "llama", qkNorm: false, ggufPermutesQk: true },
  qwen2: { hfClass: "Qwen2ForCausalLM", ggufName: "qwen2", qkNorm: false, ggufPermutesQk: false },
  qwen3: { hfClass: "Qwen3ForCausalLM", ggufName: "qwen3", qkNorm: true, ggufPermutesQk: false },
};

/** The traits of a config's architecture. */
export function traitsOf(config: Pick<ModelConfig, "architecture">): ArchitectureTraits {
  return ARCHITECTURE_TRAITS[config.architecture];
}
