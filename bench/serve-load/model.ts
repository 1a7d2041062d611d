// The GGUF serve-load runs both systems on: SmolLM2-135M-Instruct from the model cache; and the
// model the serving benches run on (that GGUF, else the generated 135m preset).
import { existsSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { makeTinyModel } from "../../packages/llama/src/index.ts";
import { defaultCacheDir, listModels } from "../../packages/llama/src/model-cache/model-cache.ts";

/** The cached GGUF path, or undefined when `airm model pull smollm2-135m-instruct` has not run. */
export function cachedSmolLM2(): string | undefined {
  return listModels({ cacheDir: defaultCacheDir(process.env) }).find((m) => m.name === "smollm2-135m-instruct")?.path;
}

/**
 * The pulled SmolLM2-135M-Instruct GGUF, else the generated 135m preset (random weights) in the
 * temp folder, made on first use; says so when it falls back.
 */
export function benchModel(): string {
  const pulled = cachedSmolLM2();
  if (pulled) return pulled;
  const path = join(tmpdir(), "airm-bench-135m");
  if (!existsSync(join(path, "config.json"))) makeTinyModel({ arch: "llama", preset: "135m", out: path });
  console.log(`no pulled SmolLM2 GGUF: the generated 135m preset (random weights) at ${path}`);
  return path;
}
