// Which model `airm up` serves when none is given: SmolLM2-135M-Instruct from the model cache
// when it has been pulled, else the generated tiny Llama (made once, deterministically, in the
// model cache). Uses @airm/llama's cache and generator functions; loads no weights.

import { existsSync } from "node:fs";
import { join } from "node:path";

export const REAL_MODEL = "smollm2-135m-instruct";

export interface ChosenModel {
  path: string;
  kind: "real" | "tiny";
  /** One line saying what was chosen and how to get the other. */
  note: string;
}

/** Picks the default model from the model cache `env` names (AIRM_MODEL_CACHE), generating the tiny one if it is not there yet. */
export async function chooseDefaultModel(env: Record<string, string | undefined>): Promise<ChosenModel> {
  const llama = await import("@airm/llama");
  const cacheDir = llama.defaultCacheDir(env);
  const cached = await llama.resolveCachedModel(REAL_MODEL, { cacheDir });
  if (cached) {
    return {
      path: cached.path,
      kind: "real",
      note: `serving ${REAL_MODEL} from the model cache (${cached.path}); pass --model DIR to serve another model`,
    };
  }
  const out = join(cacheDir, "tiny-llama");
  if (!existsSync(join(out, "config.json")) || !existsSync(join(out, "tokenizer.json"))) llama.makeTinyModel({ arch: "llama", out });
  return {
    path: out,
    kind: "tiny",
    note: `serving the generated tiny Llama (${out}): random weights, so its text is gibberish. For a real model run "airm model pull ${REAL_MODEL}" first, or pass --model a Hugging Face Llama/Qwen2 folder or a .gguf file`,
  };
}
