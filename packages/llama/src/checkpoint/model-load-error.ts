// The one error type for everything that can go wrong while reading a checkpoint: it names the
// file and, when there is one, the tensor or key. Callers branch on `code === "MODEL_LOAD"`.

import { AirmError } from "@airm/rm-core";

/** A checkpoint file that cannot be used: corrupt, truncated, missing pieces, unsupported. */
export class ModelLoadError extends AirmError {
  /** The file (or folder) the problem is in. */
  readonly file: string;
  /** The tensor or metadata key involved, when there is one. */
  readonly item: string | undefined;
  constructor(file: string, message: string, options?: { item?: string; cause?: unknown }) {
    super("MODEL_LOAD", `${file}: ${message}`, options?.cause === undefined ? undefined : { cause: options.cause });
    this.file = file;
    this.item = options?.item;
  }
}
