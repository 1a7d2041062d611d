// The one error type for a LoRA adapter that cannot be used: a key of adapter_config.json (or of a
// GGUF adapter's metadata) the engine does not support or that contradicts the model (`field`), or
// a tensor of adapter_model.safetensors (or of the GGUF file) that is missing, of the wrong shape or
// unreadable (`tensor`). The API layer turns it into a 400 naming what is wrong.
import { AirmError } from "@airm/rm-core";

export interface LoraErrorWhere {
  /** The adapter_config.json or GGUF metadata key at fault (`r`, `use_dora`, `base_model_name_or_path`, `general.architecture`, ...). */
  field?: string;
  /** The tensor at fault (its PEFT or GGUF name). */
  tensor?: string;
  cause?: unknown;
}

/** A LoRA adapter refused at load: names the file and the key or tensor at fault. */
export class LoraError extends AirmError {
  /** The adapter file (or folder) the problem is in. */
  readonly file: string;
  /** The adapter_config.json key at fault, when there is one. */
  readonly field: string | undefined;
  /** The tensor at fault, when there is one. */
  readonly tensor: string | undefined;
  constructor(file: string, message: string, where: LoraErrorWhere = {}) {
    super("CONFIG", `${file}: ${message}`, where.cause === undefined ? undefined : { cause: where.cause });
    this.file = file;
    this.field = where.field;
    this.tensor = where.tensor;
  }
}
