// The tensors (Hugging Face names and shapes) a Llama/Qwen2/Qwen3/Gemma 3 config needs. Loaders check a
// checkpoint against this list; the model reads tensors by these names.

import type { ModelConfig } from "../checkpoint-types.ts";
import { traitsOf } from "./architecture-traits.ts";

export interface ExpectedTensor {
  name: string;
  shape: number[];
}

/** Every tensor the forward pass reads, with its HF shape ([out, in] for linear weights). */
export function expectedTensors(config: ModelConfig): ExpectedTensor[] {
  const { hiddenSize: h, intermediateSize: inter, numHeads, numKvHeads, headDim: hd, vocabSize: v } = config;
  const out: ExpectedTensor[] = [{ name: "model.embed_tokens.weight", shape: [v, h] }];
  for (let l = 0; l < config.numLayers; l++) {
    const p = `model.layers.${l}.`;
    out.push({ name: `${p}input_layernorm.weight`, shape: [h] });
    out.push({ name: `${p}self_attn.q_proj.weight`, shape: [numHeads * hd, h] });
    out.push({ name: `${p}self_attn.k_proj.weight`, shape: [numKvHeads * hd, h] });
    out.push({ name: `${p}self_attn.v_proj.weight`, shape: [numKvHeads * hd, h] });
    if (config.attentionBias) {
      out.push({ name: `${p}self_attn.q_proj.bias`, shape: [numHeads * hd] });
      out.push({ name: `${p}self_attn.k_proj.bias`, shape: [numKvHeads * hd] });
      out.push({ name: `${p}self_attn.v_proj.bias`, shape: [numKvHeads * hd] });
    }
    if (traitsOf(config).qkNorm) {
      out.push({ name: `${p}self_attn.q_norm.weight`, shape: [hd] });
      out.push({ name: `${p}self_attn.k_norm.weight`, shape: [hd] });
    }
    out.push({ name: `${p}self_attn.o_proj.weight`, shape: [h, numHeads * hd] });
    out.push({ name: `${p}post_attention_layernorm.weight`, shape: [h] });
    if (traitsOf(config).sandwichNorms) {
      out.push({ name: `${p}pre_feedforward_layernorm.weight`, shape: [h] });
      out.push({ name: `${p}post_feedforward_layernorm.weight`, shape: [h] });
    }
    out.push({ name: `${p}mlp.gate_proj.weight`, shape: [inter, h] });
    out.push({ name: `${p}mlp.up_proj.weight`, shape: [inter, h] });
    out.push({ name: `${p}mlp.down_proj.weight`, shape: [h, inter] });
  }
  out.push({ name: "model.norm.weight", shape: [h] });
  if (!config.tieWordEmbeddings) out.push({ name: "lm_head.weight", shape: [v, h] });
  return out;
}
