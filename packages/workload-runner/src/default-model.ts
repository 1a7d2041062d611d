// Which model `airm up` serves: `--model` as a path, or as the name of a model in the cache
// (`airm model pull NAME`); with no `--model`, the first of DEFAULT_MODELS that is pulled, else the
// generated tiny Llama (made once, deterministically, in the model cache). Uses @airm/llama's
// cache and generator functions; loads no weights.

import { existsSync } from "node:fs";
import { join } from "node:path";
import { ConfigError } from "@airm/rm-core";

/**
 * The pulled models `airm up` serves without `--model`, best first. Qwen2.5-Coder-0.5B-Instruct
 * answers the README's question right with the default kernels and starts in seconds;
 * SmolLM2-135M-Instruct (what CI's real-model tests pin) does not (docs/decisions.md).
 */
export const DEFAULT_MODELS = ["qwen2.5-coder-0.5b-instruct", "smollm2-135m-instruct"] as const;

export interface ChosenModel {
  path: string;
  kind: "real" | "tiny";
  /** One line saying what was chosen and how to get the other. */
  note: string;
}

/** `--model`'s value: a known model's name resolves to its pulled file (ConfigError when it is not pulled); anything else is a path. */
export async function resolveModelArg(value: string, env: Record<string, string | undefined>): Promise<ChosenModel> {
  const llama = await import("@airm/llama");
  if (!(value in llama.KNOWN_MODELS)) return { path: value, kind: "real", note: `model ${value}` };
  const cached = await llama.resolveCachedModel(value, { cacheDir: llama.defaultCacheDir(env) });
  if (!cached)
    throw new ConfigError("model", `${value} is not in the model cache; run "airm model pull ${value}" first (or pass --model a local .gguf file or Hugging Face folder)`);
  return { path: cached.path, kind: "real", note: `serving ${value} from the model cache (${cached.path})` };
}

/** Picks the default model from the model cache `env` names (AIRM_MODEL_CACHE), generating the tiny one if none is pulled. */
export async function chooseDefaultModel(env: Record<string, string | undefined>): Promise<ChosenModel> {
  const llama = await import("@airm/llama");
  const cacheDir = llama.defaultCacheDir(env);
  for (const name of DEFAULT_MODELS) {
    const cached = await llama.resolveCachedModel(name, { cacheDir });
    if (cached) {
      return { path: cached.path, kind: "real", note: `serving ${name} from the model cache (${cached.path}); pass --model NAME|PATH to serve another model` };
    }
  }
  const out = join(cacheDir, "tiny-llama");
  if (!existsSync(join(out, "config.json")) || !existsSync(join(out, "tokenizer.json"))) llama.makeTinyModel({ arch: "llama", out });
  return {
    path: out,
    kind: "tiny",
    note: `serving the generated tiny Llama (${out}): random weights, so its text is gibberish. For a real model run "airm model pull ${DEFAULT_MODELS[0]}" first, or pass --model a Hugging Face folder or a .gguf file`,
  };
}
