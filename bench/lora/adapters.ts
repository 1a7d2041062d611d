// The LoRA bench's adapters: `count` generated adapters (makeTinyLora, random A and B, one seed
// each) for the base model's shapes, as PEFT folders for `airm up --lora-modules` and as llama.cpp
// GGUF LoRA files (peftToGguf) for llama-server's --lora, under one temp folder.
import { mkdtempSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { ggufModelConfig } from "../../packages/llama/src/checkpoint/gguf-checkpoint.ts";
import { closeGguf, openGguf } from "../../packages/llama/src/checkpoint/gguf-file.ts";
import { type ModelConfig, makeTinyLora, peftToGguf } from "../../packages/llama/src/index.ts";

export interface BenchAdapter {
  name: string;
  /** The PEFT folder. */
  folder: string;
  /** Its llama.cpp GGUF conversion. */
  gguf: string;
}

/** The shapes of the GGUF base model at `path`. */
export function ggufConfig(path: string): ModelConfig {
  const file = openGguf(path);
  try {
    return ggufModelConfig(file);
  } finally {
    closeGguf(file);
  }
}

/**
 * Writes `count` adapters named a, b, c, ... of rank `r` (alpha 2r) on q/k/v/o and the MLP
 * projections of every layer, seeds 1, 2, ..., for the GGUF base model at `base`, in a new temp
 * folder `dir` (the caller removes it).
 */
export function benchAdapters(base: string, count: number, r: number): { dir: string; adapters: BenchAdapter[] } {
  const config = ggufConfig(base);
  const dir = mkdtempSync(join(tmpdir(), "airm-bench-lora-"));
  const adapters = Array.from({ length: count }, (_, i) => {
    const name = String.fromCharCode(97 + i);
    const folder = join(dir, name);
    makeTinyLora({
      out: folder,
      model: config,
      baseModel: base,
      r,
      targets: ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
      seed: i + 1,
    });
    const gguf = join(dir, `${name}.gguf`);
    peftToGguf(folder, gguf, config);
    return { name, folder, gguf };
  });
  return { dir, adapters };
}
