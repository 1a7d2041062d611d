// What every checkpoint format ends with: its tensors checked against the config, and the
// Checkpoint object (fingerprint computed on first access).
import type { Checkpoint, ModelConfig, TensorSource } from "../checkpoint-types.ts";
import type { ChatRenderer } from "../tokenizer/chat-template.ts";
import { expectedTensors } from "./expected-tensors.ts";
import { modelFingerprint } from "./fingerprint.ts";
import { ModelLoadError } from "./model-load-error.ts";

/**
 * Checks that `tensors` holds every tensor `config` needs with the right shape. Throws
 * ModelLoadError naming the file and the tensor otherwise (also for a dtype not in `dtypes`).
 */
export function checkTensors(config: ModelConfig, tensors: TensorSource, where: string, dtypes: readonly string[]): void {
  for (const want of expectedTensors(config)) {
    if (!tensors.has(want.name)) throw new ModelLoadError(where, `tensor "${want.name}" is missing from the checkpoint`, { item: want.name });
    const got = tensors.info(want.name);
    if (got.shape.length !== want.shape.length || got.shape.some((d, i) => d !== want.shape[i])) {
      throw new ModelLoadError(got.file, `tensor "${want.name}" has shape [${got.shape.join(", ")}] but the config needs [${want.shape.join(", ")}]`, { item: want.name });
    }
    if (!dtypes.includes(got.dtype)) {
      throw new ModelLoadError(got.file, `tensor "${want.name}" has dtype ${got.dtype}; supported are ${dtypes.join(", ")}`, { item: want.name });
    }
  }
}

/** Assembles a Checkpoint whose fingerprint is computed on first access (it reads every tensor). */
export function makeCheckpoint(parts: Omit<Checkpoint, "fingerprint" | "renderChat"> & { renderChat?: ChatRenderer | undefined }): Checkpoint {
  let fingerprint: string | undefined;
  const { renderChat, ...rest } = parts;
  const checkpoint: Checkpoint = {
    ...rest,
    get fingerprint(): string {
      fingerprint ??= modelFingerprint(parts.config, parts.tensors);
      return fingerprint;
    },
  };
  if (renderChat) checkpoint.renderChat = renderChat;
  return checkpoint;
}

/**
 * Opens a checkpoint: a Hugging Face folder (LlamaForCausalLM / Qwen2ForCausalLM with safetensors)
 * or a `.gguf` file (llama architecture). Validates config, tensor names, shapes and byte ranges;
 * tensor data is read later through `checkpoint.tensors`. The fingerprint is computed lazily on
 * first access (it hashes every tensor). Throws ModelLoadError naming the file and the tensor or
 * key for anything missing, corrupt, truncated or unsupported. Close with `checkpoint.tensors.close()`.
 */
