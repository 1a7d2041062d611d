// adapter_config.json of a PEFT LoRA adapter: the keys that change the arithmetic (r, lora_alpha,
// use_rslora, target_modules, layers_to_transform), the base model it was trained on, and every
// PEFT feature this engine does not compute refused by its key. Knows PEFT's config format and the
// model's shape, not files or kernels.
import type { ModelConfig } from "../checkpoint-types.ts";
import { LoraError } from "./lora-error.ts";
import { LORA_PROJECTIONS, type LoraProjection, modulePath } from "./projections.ts";

const fr = Math.fround;

/** Which modules an adapter targets: PEFT's list (exact module names or name suffixes) or one regex (full match). */
export type TargetModules = { kind: "list"; names: string[] } | { kind: "regex"; pattern: string };

export interface LoraAdapterConfig {
  r: number;
  alpha: number;
  useRslora: boolean;
  /** alpha / r, or alpha / sqrt(r) with rsLoRA, rounded to f32 (torch multiplies the f32 update by it). */
  scale: number;
  targets: TargetModules;
  /** The layers the adapter applies to (`layers_to_transform`), or null for all. */
  layers: number[] | null;
  /** `base_model_name_or_path`, when the config says. */
  baseModel: string | null;
}

/** Keys that must be absent or unset (null, false, empty): PEFT features this engine does not compute. */
const REFUSED_WHEN_SET: Record<string, string> = {
  use_dora: "DoRA (weight-decomposed LoRA) is not supported; merge the adapter or train a plain LoRA",
  modules_to_save: "fully trained modules (modules_to_save) are not supported; only low-rank updates are",
  rank_pattern: "per-module ranks (rank_pattern) are not supported",
  alpha_pattern: "per-module alphas (alpha_pattern) are not supported",
  exclude_modules: "exclude_modules is not supported; list the targeted modules in target_modules",
  layer_replication: "layer replication is not supported",
  lora_bias: "LoRA biases (lora_bias) are not supported",
  use_qalora: "QALoRA is not supported",
  target_parameters: "LoRA on parameters (target_parameters, MoE experts) is not supported",
  trainable_token_indices: "trainable tokens are not supported",
  alora_invocation_tokens: "activated LoRA (aLoRA) is not supported",
  use_bdlora: "block-diagonal LoRA is not supported",
  velora_config: "VeLoRA is not supported",
  monteclora_config: "MonteCLoRA is not supported",
  megatron_config: "Megatron parallel linear layers are not supported",
  arrow_config: "Arrow routing is not supported",
  kasa_config: "KaSA is not supported",
};

/** Keys read elsewhere or that do not change the inference arithmetic. */
const IGNORED = new Set([
  "peft_type",
  "task_type",
  "inference_mode",
  "revision",
  "lora_dropout",
  "init_lora_weights",
  "loftq_config",
  "eva_config",
  "corda_config",
  "lora_ga_config",
  "runtime_config",
  "auto_mapping",
  "peft_version",
  "qalora_group_size",
  "megatron_core",
  "ensure_weight_tying",
  "layers_pattern",
  "r",
  "lora_alpha",
  "use_rslora",
  "bias",
  "fan_in_fan_out",
  "target_modules",
  "layers_to_transform",
  "base_model_name_or_path",
]);

/** init_lora_weights values that leave the base weights as they are (the others rewrite them: PiSSA, OLoRA, CorDA, LoftQ, LoRA-GA). */
const PLAIN_INITS = new Set<unknown>([true, false, "gaussian", "eva", "orthogonal"]);

/** Whether a config value is set: anything but absent, null, false, "" or an empty list or object. */
function isSet(v: unknown): boolean {
  if (v === undefined || v === null || v === false || v === "") return false;
  if (Array.isArray(v)) return v.length > 0;
  if (typeof v === "object") return Object.keys(v).length > 0;
  return true;
}

/** Refuses every key naming a PEFT feature that is set, and every unknown key that is set. */
function refuseUnsupported(o: Record<string, unknown>, file: string): void {
  for (const [key, value] of Object.entries(o)) {
    if (!isSet(value)) continue;
    const why = REFUSED_WHEN_SET[key];
    if (why !== undefined) throw new LoraError(file, `${key}: ${why}`, { field: key });
    if (!IGNORED.has(key))
      throw new LoraError(file, `${key}: unknown adapter_config.json key, set to ${JSON.stringify(value)}; this engine does not know what it changes`, { field: key });
  }
  if (o.peft_type !== undefined && o.peft_type !== "LORA")
    throw new LoraError(file, `peft_type: only LORA adapters are supported, got ${JSON.stringify(o.peft_type)}`, { field: "peft_type" });
  if (o.bias !== undefined && o.bias !== "none")
    throw new LoraError(file, `bias: must be "none" (trained biases are not supported), got ${JSON.stringify(o.bias)}`, { field: "bias" });
  if (o.fan_in_fan_out === true) throw new LoraError(file, "fan_in_fan_out: true is for Conv1D (GPT-2) layers; Llama-family projections are Linear", { field: "fan_in_fan_out" });
  if (o.init_lora_weights !== undefined && !PLAIN_INITS.has(o.init_lora_weights)) {
    throw new LoraError(file, `init_lora_weights: ${JSON.stringify(o.init_lora_weights)} rewrites the base weights at training time; convert the adapter to a plain LoRA first`, {
      field: "init_lora_weights",
    });
  }
}

/** r: a positive integer no larger than `maxRank`. */
function checkedRank(v: unknown, file: string, maxRank: number): number {
  if (typeof v !== "number" || !Number.isInteger(v) || v < 1) throw new LoraError(file, `r: must be a positive integer, got ${JSON.stringify(v)}`, { field: "r" });
  if (v > maxRank) throw new LoraError(file, `r: rank ${v} is over this engine's limit of ${maxRank} (maxLoraRank, --max-lora-rank)`, { field: "r" });
  return v;
}

/** target_modules: a non-empty list of names, a regex (PEFT full-matches it against module paths) or "all-linear". */
function checkedTargets(v: unknown, file: string): TargetModules {
  if (v === "all-linear") return { kind: "list", names: [...LORA_PROJECTIONS] };
  if (typeof v === "string") {
    try {
      new RegExp(v);
    } catch (cause) {
      throw new LoraError(file, `target_modules: ${JSON.stringify(v)} is not a regular expression this engine can read`, { field: "target_modules", cause });
    }
    return { kind: "regex", pattern: v };
  }
  if (!Array.isArray(v) || v.length === 0 || !v.every((n) => typeof n === "string")) {
    throw new LoraError(file, `target_modules: must be a list of module names, a regular expression or "all-linear", got ${JSON.stringify(v)}`, { field: "target_modules" });
  }
  return { kind: "list", names: v as string[] };
}

/** layers_to_transform (an index or a list of them, each below `layers`) under the default layers pattern, or null. */
function checkedLayers(o: Record<string, unknown>, file: string, layers: number): number[] | null {
  const v = o.layers_to_transform;
  if (v === undefined || v === null) return null;
  const pattern = o.layers_pattern;
  if (isSet(pattern) && pattern !== "layers" && !(Array.isArray(pattern) && pattern.length === 1 && pattern[0] === "layers")) {
    throw new LoraError(file, `layers_pattern: this model's layers are model.layers, got ${JSON.stringify(pattern)}`, { field: "layers_pattern" });
  }
  if (typeof o.target_modules === "string") {
    throw new LoraError(file, `layers_to_transform: cannot be used with a string target_modules (a regular expression or "all-linear"; PEFT refuses it too)`, {
      field: "layers_to_transform",
    });
  }
  const list = Array.isArray(v) ? v : [v];
  if (list.length === 0 || !list.every((l) => Number.isInteger(l) && l >= 0 && l < layers)) {
    throw new LoraError(file, `layers_to_transform: must be layer indices in [0, ${layers}), got ${JSON.stringify(v)}`, { field: "layers_to_transform" });
  }
  return [...new Set(list as number[])].sort((a, b) => a - b);
}

/** A finite number (lora_alpha), with PEFT's default when absent. */
function checkedAlpha(v: unknown, file: string): number {
  if (v === undefined) return 8;
  if (typeof v !== "number" || !Number.isFinite(v)) throw new LoraError(file, `lora_alpha: must be a finite number, got ${JSON.stringify(v)}`, { field: "lora_alpha" });
  return v;
}

/**
 * The arithmetic of adapter_config.json (`json`, parsed), checked: throws LoraError naming the key
 * for a feature this engine does not compute, a rank over `maxRank`, or a value of the wrong type.
 */
export function parseAdapterConfig(json: unknown, file: string, model: ModelConfig, maxRank: number): LoraAdapterConfig {
  if (typeof json !== "object" || json === null || Array.isArray(json)) throw new LoraError(file, "is not a JSON object");
  const o = json as Record<string, unknown>;
  refuseUnsupported(o, file);
  const r = checkedRank(o.r ?? 8, file, maxRank);
  const alpha = checkedAlpha(o.lora_alpha, file);
  if (o.use_rslora !== undefined && typeof o.use_rslora !== "boolean")
    throw new LoraError(file, `use_rslora: must be true or false, got ${JSON.stringify(o.use_rslora)}`, { field: "use_rslora" });
  const useRslora = o.use_rslora === true;
  const base = o.base_model_name_or_path;
  if (base !== undefined && base !== null && typeof base !== "string") throw new LoraError(file, "base_model_name_or_path: must be a string", { field: "base_model_name_or_path" });
  return {
    r,
    alpha,
    useRslora,
    scale: fr(useRslora ? alpha / Math.sqrt(r) : alpha / r),
    targets: checkedTargets(o.target_modules, file),
    layers: checkedLayers(o, file, model.numLayers),
    baseModel: typeof base === "string" && base !== "" ? base : null,
  };
}

/** Whether PEFT would wrap module `path` for `targets` (a list entry equal to the path or to a dotted suffix of it; a regex matching the whole path). */
function targets(t: TargetModules, path: string): boolean {
  if (t.kind === "regex") return new RegExp(`^(?:${t.pattern})$`).test(path);
  return t.names.some((n) => path === n || path.endsWith(`.${n}`));
}

/**
 * Every (layer, projection) the adapter targets on this model. A list entry that names none of
 * the seven projections (lm_head, embed_tokens, another architecture's module) is refused, naming
 * target_modules, since this engine applies LoRA to those projections only.
 */
export function targetedModules(cfg: LoraAdapterConfig, model: ModelConfig, file: string): { layer: number; proj: LoraProjection }[] {
  const paths: { layer: number; proj: LoraProjection; path: string }[] = [];
  for (let l = 0; l < model.numLayers; l++) for (const p of LORA_PROJECTIONS) paths.push({ layer: l, proj: p, path: modulePath(l, p) });
  if (cfg.targets.kind === "list") {
    for (const name of cfg.targets.names) {
      if (!paths.some((m) => targets({ kind: "list", names: [name] }, m.path))) {
        throw new LoraError(file, `target_modules: "${name}" is none of ${LORA_PROJECTIONS.join(", ")}; this engine applies LoRA to those projections only`, {
          field: "target_modules",
        });
      }
    }
  }
  const layers = cfg.layers;
  const hit = paths.filter((m) => targets(cfg.targets, m.path) && (layers === null || layers.includes(m.layer)));
  if (hit.length === 0) throw new LoraError(file, "target_modules: matches no projection of this model", { field: "target_modules" });
  return hit.map(({ layer, proj }) => ({ layer, proj }));
}
