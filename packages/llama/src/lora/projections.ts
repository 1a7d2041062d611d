// The seven linear projections of a Llama-family layer a LoRA adapter may target, their PEFT
// module names and shapes, and where each lands in the model's fused matmuls (q/k/v in one
// output row range, gate/up in another). Knows the config, not the kernels.
import type { ModelConfig } from "../checkpoint-types.ts";

export const LORA_PROJECTIONS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"] as const;
export type LoraProjection = (typeof LORA_PROJECTIONS)[number];

/** The fused matmuls of a layer: q/k/v, o, gate/up, down. */
export type LoraGroup = "qkv" | "o" | "gu" | "down";

/** The projections each fused matmul holds, in output row order. */
export const GROUP_PROJECTIONS: Record<LoraGroup, readonly LoraProjection[]> = {
  qkv: ["q_proj", "k_proj", "v_proj"],
  o: ["o_proj"],
  gu: ["gate_proj", "up_proj"],
  down: ["down_proj"],
};

/** A projection's input and output widths, and its first output row in its fused matmul. */
export interface ProjectionShape {
  in: number;
  out: number;
  rowOffset: number;
}

/** The shape of `p` under config `c` ([out, in] as Hugging Face stores the weight). */
export function projectionShape(c: ModelConfig, p: LoraProjection): ProjectionShape {
  const q = c.numHeads * c.headDim;
  const kv = c.numKvHeads * c.headDim;
  const h = c.hiddenSize;
  const I = c.intermediateSize;
  const shapes: Record<LoraProjection, ProjectionShape> = {
    q_proj: { in: h, out: q, rowOffset: 0 },
    k_proj: { in: h, out: kv, rowOffset: q },
    v_proj: { in: h, out: kv, rowOffset: q + kv },
    o_proj: { in: q, out: h, rowOffset: 0 },
    gate_proj: { in: h, out: I, rowOffset: 0 },
    up_proj: { in: h, out: I, rowOffset: I },
    down_proj: { in: I, out: h, rowOffset: 0 },
  };
  return shapes[p];
}

/** The module path of projection `p` of layer `l` as PEFT sees it inside the causal LM. */
export function modulePath(l: number, p: LoraProjection): string {
  const block = p === "gate_proj" || p === "up_proj" || p === "down_proj" ? "mlp" : "self_attn";
  return `model.layers.${l}.${block}.${p}`;
}

/** The PEFT state-dict name of a LoRA weight: `base_model.model.<module>.lora_A.weight` ([r, in]) or `lora_B` ([out, r]). */
export function loraTensorName(l: number, p: LoraProjection, which: "A" | "B"): string {
  return `base_model.model.${modulePath(l, p)}.lora_${which}.weight`;
}

const TENSOR_NAME = /^base_model\.model\.model\.layers\.(\d+)\.(?:self_attn\.([qkvo]_proj)|mlp\.(gate_proj|up_proj|down_proj))\.lora_([AB])\.weight$/;

/** Layer, projection and A/B of a PEFT LoRA tensor name, or undefined for any other name. */
export function parseLoraTensorName(name: string): { layer: number; proj: LoraProjection; which: "A" | "B" } | undefined {
  const m = TENSOR_NAME.exec(name);
  if (!m) return undefined;
  return { layer: Number(m[1]), proj: (m[2] ?? m[3]) as LoraProjection, which: m[4] as "A" | "B" };
}
