// The GGUF serve-load runs both systems on: SmolLM2-135M-Instruct from the model cache.
import { defaultCacheDir, listModels } from "../../packages/llama/src/model-cache/model-cache.ts";

/** The cached GGUF path, or undefined when `airm model pull smollm2-135m-instruct` has not run. */
export function cachedSmolLM2(): string | undefined {
  return listModels({ cacheDir: defaultCacheDir(process.env) }).find((m) => m.name === "smollm2-135m-instruct")?.path;
}
