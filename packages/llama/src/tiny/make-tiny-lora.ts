// Generates a LoRA adapter for a model config as a PEFT folder: adapter_config.json with every key
// PEFT 0.21 writes, and adapter_model.safetensors with seeded random A and B (B not zero, so the
// update changes the outputs) for the modules it targets. Same options -> same bytes. For tests
// and demos of LoRA serving; the weights mean nothing.
import { mkdirSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import type { ModelConfig } from "../checkpoint-types.ts";
import { f32ToBf16 } from "../checkpoint/bf16-convert.ts";
import { parseAdapterConfig, targetedModules } from "../lora/adapter-config.ts";
import { loraTensorName, projectionShape } from "../lora/projections.ts";
import { ADAPTER_CONFIG, ADAPTER_WEIGHTS } from "../lora/read-adapter.ts";
import { seededNormalF32 } from "./seeded-weights.ts";
import { type TensorToWrite, writeSafetensors } from "./safetensors-writer.ts";

export interface TinyLoraOptions {
  /** Output folder (created; the two files are replaced). */
  out: string;
  /** The shapes of the base model. */
  model: ModelConfig;
  /** `base_model_name_or_path` (the base model's folder or hub id). */
  baseModel: string;
  r: number;
  /** lora_alpha (default 2r). */
  alpha?: number;
  useRslora?: boolean;
  /** target_modules: module names (PEFT list form) or one regular expression (default q_proj, v_proj). */
  targets?: string[] | string;
  /** layers_to_transform (default all layers). */
  layers?: number[];
  seed?: number;
  /** Stored dtype of A and B (default f32). */
  dtype?: "f32" | "bf16";
  /** Std of B times sqrt(r) (default 0.5); A has std 1/sqrt(in), so the update is of the order of the base output. */
  bScale?: number;
}

/** adapter_config.json as PEFT 0.21.2's LoraConfig.save_pretrained writes it, with the given arithmetic. */
function adapterConfigJson(o: TinyLoraOptions): Record<string, unknown> {
  return {
    alora_invocation_tokens: null,
    alpha_pattern: {},
    arrow_config: null,
    auto_mapping: null,
    base_model_name_or_path: o.baseModel,
    bias: "none",
    corda_config: null,
    ensure_weight_tying: false,
    eva_config: null,
    exclude_modules: null,
    fan_in_fan_out: false,
    inference_mode: true,
    init_lora_weights: true,
    kasa_config: null,
    layer_replication: null,
    layers_pattern: null,
    layers_to_transform: o.layers ?? null,
    loftq_config: {},
    lora_alpha: o.alpha ?? 2 * o.r,
    lora_bias: false,
    lora_dropout: 0.0,
    lora_ga_config: null,
    megatron_config: null,
    megatron_core: "megatron.core",
    modules_to_save: null,
    monteclora_config: null,
    peft_type: "LORA",
    peft_version: "0.21.2",
    qalora_group_size: 16,
    r: o.r,
    rank_pattern: {},
    revision: null,
    target_modules: o.targets ?? ["q_proj", "v_proj"],
    target_parameters: null,
    task_type: "CAUSAL_LM",
    trainable_token_indices: null,
    use_bdlora: null,
    use_dora: false,
    use_qalora: false,
    use_rslora: o.useRslora ?? false,
    velora_config: null,
  };
}

/** The bytes of f32 values as `dtype`. */
function encode(values: Float32Array, dtype: "f32" | "bf16"): Uint8Array {
  if (dtype === "f32") return new Uint8Array(values.buffer, values.byteOffset, values.byteLength);
  const out = new Uint16Array(values.length);
  for (let i = 0; i < values.length; i++) out[i] = f32ToBf16(values[i]);
  return new Uint8Array(out.buffer);
}

/** One seeded tensor of the adapter. */
function seededTensor(name: string, shape: [number, number], std: number, o: TinyLoraOptions): TensorToWrite {
  const dtype = o.dtype ?? "f32";
  return { name, dtype: dtype === "f32" ? "F32" : "BF16", shape, bytes: () => encode(seededNormalF32(o.seed ?? 1, name, shape[0] * shape[1], std), dtype) };
}

/**
 * Writes the adapter folder; returns the PEFT tensor names written, in order. Throws LoraError when
 * the options make an adapter this engine would refuse (the same checks as loading).
 */
export function makeTinyLora(o: TinyLoraOptions): string[] {
  const json = adapterConfigJson(o);
  const cfg = parseAdapterConfig(json, join(o.out, ADAPTER_CONFIG), o.model, o.r);
  const tensors: TensorToWrite[] = [];
  for (const { layer, proj } of targetedModules(cfg, o.model, join(o.out, ADAPTER_CONFIG))) {
    const s = projectionShape(o.model, proj);
    tensors.push(seededTensor(loraTensorName(layer, proj, "A"), [o.r, s.in], 1 / Math.sqrt(s.in), o));
    tensors.push(seededTensor(loraTensorName(layer, proj, "B"), [s.out, o.r], (o.bScale ?? 0.5) / Math.sqrt(o.r), o));
  }
  mkdirSync(o.out, { recursive: true });
  writeFileSync(join(o.out, ADAPTER_CONFIG), `${JSON.stringify(json, null, 2)}\n`);
  writeSafetensors(join(o.out, ADAPTER_WEIGHTS), tensors, { format: "pt" });
  return tensors.map((t) => t.name);
}
