// What a Gemma 3 text config.json (Gemma3ForCausalLM, model_type gemma3_text) adds to the Llama
// keys, as transformers 4.x and 5.x write it: interleaved sliding-window layers (`layer_types`, or
// `sliding_window_pattern`), the local RoPE base (`rope_local_base_freq`, or 5.x's per-layer-type
// `rope_parameters`), `query_pre_attn_scalar`; and what is refused (soft-capping, bidirectional
// attention, rope scaling). Defaults are Gemma3TextConfig's. Leaves the common keys to hf-config.ts.

import type { ModelConfig } from "../checkpoint-types.ts";
import { ModelLoadError } from "./model-load-error.ts";

type Json = Record<string, unknown>;

/** Gemma3TextConfig's defaults for the keys below. */
export const GEMMA3_DEFAULTS = { sliding_window: 4096, sliding_window_pattern: 6, query_pre_attn_scalar: 256, rope_theta: 1_000_000, rope_local_base_freq: 10_000, head_dim: 256 };

function positiveNumber(c: Json, key: string, file: string, fallback: number, defaulted: string[], where = key): number {
  const v = c[key];
  if (v === undefined || v === null) {
    defaulted.push(where);
    return fallback;
  }
  if (typeof v !== "number" || !Number.isFinite(v) || v <= 0) throw new ModelLoadError(file, `${where} must be a positive number, got ${JSON.stringify(v)}`, { item: where });
  return v;
}

/** Refuses what Gemma 3 configs can ask for and this engine does not compute. */
function refuseGemma3(c: Json, file: string): void {
  for (const key of ["final_logit_softcapping", "attn_logit_softcapping"]) {
    if (c[key] !== undefined && c[key] !== null)
      throw new ModelLoadError(file, `${key} ${JSON.stringify(c[key])} is not supported (no soft-capping is computed here; Gemma 3 sets it to null)`, { item: key });
  }
  if (c.use_bidirectional_attention === true)
    throw new ModelLoadError(file, `use_bidirectional_attention true is not supported (attention is causal here)`, { item: "use_bidirectional_attention" });
  if (c.rope_scaling !== undefined && c.rope_scaling !== null)
    throw new ModelLoadError(file, `rope_scaling ${JSON.stringify(c.rope_scaling)} is not supported for gemma3 (the larger Gemma 3 models' linear scaling is not computed here)`, {
      item: "rope_scaling",
    });
  const act = c.hidden_activation ?? c.hidden_act;
  if (act !== undefined && act !== "gelu_pytorch_tanh")
    throw new ModelLoadError(file, `hidden_activation ${JSON.stringify(act)} is not supported for gemma3; this engine computes gelu_pytorch_tanh`, { item: "hidden_activation" });
}

/** Which layers slide: `layer_types` when given, else every layer but each `sliding_window_pattern`-th. */
function slidingLayers(c: Json, file: string, layers: number, defaulted: string[]): boolean[] {
  if (Array.isArray(c.layer_types)) {
    const types = c.layer_types as unknown[];
    if (types.length !== layers) throw new ModelLoadError(file, `layer_types has ${types.length} entries for ${layers} layers`, { item: "layer_types" });
    return types.map((t) => {
      if (t !== "sliding_attention" && t !== "full_attention")
        throw new ModelLoadError(file, `layer_types contains ${JSON.stringify(t)}; supported are "sliding_attention" and "full_attention"`, { item: "layer_types" });
      return t === "sliding_attention";
    });
  }
  const pattern = Math.round(positiveNumber(c, "sliding_window_pattern", file, GEMMA3_DEFAULTS.sliding_window_pattern, defaulted));
  return Array.from({ length: layers }, (_, i) => (i + 1) % pattern !== 0);
}

/** The global and local RoPE bases: 5.x's rope_parameters per layer type, else 4.x's rope_theta and rope_local_base_freq. */
function gemma3RopeThetas(c: Json, file: string, defaulted: string[]): { global: number; local: number } {
  const rp = c.rope_parameters;
  if (rp !== undefined && rp !== null) {
    if (typeof rp !== "object" || Array.isArray(rp)) throw new ModelLoadError(file, `"rope_parameters" must be an object`, { item: "rope_parameters" });
    const theta = (kind: string, fallback: number): number => {
      const r = (rp as Json)[kind] as Json | undefined;
      if (r === undefined || r === null) {
        defaulted.push(`rope_parameters.${kind}`);
        return fallback;
      }
      const type = r.rope_type ?? r.type ?? "default";
      if (type !== "default")
        throw new ModelLoadError(file, `rope_parameters.${kind}.rope_type ${JSON.stringify(type)} is not supported for gemma3; supported is "default"`, {
          item: `rope_parameters.${kind}`,
        });
      return positiveNumber(r, "rope_theta", file, fallback, defaulted, `rope_parameters.${kind}.rope_theta`);
    };
    return { global: theta("full_attention", GEMMA3_DEFAULTS.rope_theta), local: theta("sliding_attention", GEMMA3_DEFAULTS.rope_local_base_freq) };
  }
  return {
    global: positiveNumber(c, "rope_theta", file, GEMMA3_DEFAULTS.rope_theta, defaulted),
    local: positiveNumber(c, "rope_local_base_freq", file, GEMMA3_DEFAULTS.rope_local_base_freq, defaulted),
  };
}

/**
 * The Gemma 3 part of a ModelConfig from config.json: rope bases, the sliding window and its
 * layers, the attention scalar. Throws ModelLoadError naming the key for what is not computed
 * here or malformed; keys taken from Gemma3TextConfig's defaults are pushed onto `defaulted`.
 */
export function gemma3Config(c: Json, file: string, layers: number, defaulted: string[]): Pick<ModelConfig, "ropeTheta" | "ropeScaling" | "slidingWindow" | "queryPreAttnScalar"> {
  refuseGemma3(c, file);
  const thetas = gemma3RopeThetas(c, file, defaulted);
  const window = Math.round(positiveNumber(c, "sliding_window", file, GEMMA3_DEFAULTS.sliding_window, defaulted));
  if (window < 4) throw new ModelLoadError(file, `sliding_window ${window} is below 4, which the attention kernels need`, { item: "sliding_window" });
  return {
    ropeTheta: thetas.global,
    ropeScaling: null,
    slidingWindow: { window, layers: slidingLayers(c, file, layers, defaulted), ropeTheta: thetas.local },
    queryPreAttnScalar: positiveNumber(c, "query_pre_attn_scalar", file, GEMMA3_DEFAULTS.query_pre_attn_scalar, defaulted),
  };
}
