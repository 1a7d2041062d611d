// Typed errors shared by every @airm package. Each carries a stable `code` and a message that
// says what to do next. Checks use the brand (`isAirmError`), not `instanceof`, so two copies of
// rm-core in one process still recognise each other's errors.

const BRAND = Symbol.for("@airm/rm-core/error");

export type AirmErrorCode =
  | "UNKNOWN_PLUGIN"
  | "PLUGIN_SHAPE"
  | "TRANSPORT_ERROR"
  | "TRANSPORT_TIMEOUT"
  | "TRANSPORT_NO_SPACE"
  | "TRANSPORT_CLOSED"
  | "INVALID_KEY"
  | "UNSUPPORTED"
  | "KV_INTEGRITY"
  | "CONTEXT_OVERFLOW"
  | "KV_CACHE_FULL"
  | "PREEMPTED"
  | "CONFIG"
  | "DEVICE"
  | "MODEL_LOAD"
  | "GRAMMAR"
  | "UNKNOWN_LORA"
  | "USAGE";

export class AirmError extends Error {
  readonly code: AirmErrorCode;
  readonly [BRAND] = true;
  constructor(code: AirmErrorCode, message: string, options?: { cause?: unknown }) {
    super(message, options);
    this.code = code;
    this.name = new.target.name;
  }
}

/** True for any error thrown by an @airm package (any copy of rm-core). */
export function isAirmError(e: unknown, code?: AirmErrorCode): e is AirmError {
  if (typeof e !== "object" || e === null || (e as Record<symbol, unknown>)[BRAND] !== true) return false;
  return code === undefined || (e as AirmError).code === code;
}

/** A plugin name that is not installed in the host. Lists what is installed. */
export class UnknownPluginError extends AirmError {
  readonly group: string;
  readonly pluginName: string;
  readonly installed: string[];
  constructor(group: string, name: string, installed: string[]) {
    super(
      "UNKNOWN_PLUGIN",
      `no plugin named "${name}" in group "${group}"; installed: ${installed.length ? installed.join(", ") : "(none)"}. ` +
        `Add the package that provides it to the host's package.json dependencies, or pick one of the installed names.`,
    );
    this.group = group;
    this.pluginName = name;
    this.installed = installed;
  }
}

/** Two packages declare the same plugin name in one group: the host cannot tell which is meant. */
export class DuplicatePluginError extends AirmError {
  readonly group: string;
  readonly pluginName: string;
  readonly packages: string[];
  constructor(group: string, name: string, packages: string[]) {
    super(
      "PLUGIN_SHAPE",
      `plugin "${name}" of group "${group}" is declared by ${packages.map((p) => `"${p}"`).join(" and ")}; ` +
        `a name must come from one package: remove one of them from the host's dependencies (or AIRM_PLUGINS), or rename one plugin`,
    );
    this.group = group;
    this.pluginName = name;
    this.packages = packages;
  }
}

/** A plugin package whose module or export does not have the shape its group requires. */
export class PluginShapeError extends AirmError {
  readonly packageName: string;
  constructor(packageName: string, detail: string) {
    super("PLUGIN_SHAPE", `plugin package "${packageName}": ${detail}`);
    this.packageName = packageName;
  }
}

/** A KV transport failed. Never answered by falling back to another transport. */
export class TransportError extends AirmError {
  constructor(message: string, code: AirmErrorCode = "TRANSPORT_ERROR", options?: { cause?: unknown }) {
    super(code, message, options);
  }
}

/** A pull (or a wait) did not complete within its timeout. */
export class TransportTimeoutError extends TransportError {
  constructor(message: string) {
    super(message, "TRANSPORT_TIMEOUT");
  }
}

/** A blob key or request id that could escape its namespace or is not well formed. */
export class InvalidKeyError extends AirmError {
  constructor(message: string) {
    super("INVALID_KEY", message);
  }
}

/** The transport or engine does not support what was asked (dtype, layout, tier, scope). */
export class UnsupportedError extends AirmError {
  constructor(message: string) {
    super("UNSUPPORTED", message);
  }
}

/** KV bytes or a manifest that does not match: wrong CRC, model, layout or shape. */
export class KVIntegrityError extends AirmError {
  readonly field: string;
  constructor(field: string, message: string) {
    super("KV_INTEGRITY", message);
    this.field = field;
  }
}

/**
 * A request whose prompt plus max_tokens does not fit a limit: the model's context
 * (max_model_len, the default), the whole KV cache, or one cache's capacity. The message names it.
 */
export class ContextOverflowError extends AirmError {
  readonly requested: number;
  readonly limit: number;
  /** What the limit is, as the message names it (e.g. "max_model_len"). */
  readonly limitName: string;
  constructor(requested: number, limit: number, detail = "", limitName = "max_model_len") {
    super(
      "CONTEXT_OVERFLOW",
      `prompt + max_tokens = ${requested} tokens exceeds ${limitName} of ${limit} tokens${detail ? ` (${detail})` : ""}; shorten the prompt or lower max_tokens.`,
    );
    this.requested = requested;
    this.limit = limit;
    this.limitName = limitName;
  }
}

/**
 * No block of the paged KV cache is free for what was asked right now. Transient: admission
 * waits for blocks, and a growing stream makes the engine preempt another one instead.
 */
export class KVCacheFullError extends AirmError {
  constructor(message: string) {
    super("KV_CACHE_FULL", message);
  }
}

/** The engine took a stream's blocks back so that older streams go on; recompute it (engine.recompute) before stepping it again. */
export class PreemptedError extends AirmError {
  readonly streamId: string;
  constructor(streamId: string) {
    super("PREEMPTED", `stream ${streamId} was preempted (its KV blocks were needed by older streams); recompute it from its tokens to go on`);
    this.streamId = streamId;
  }
}

/** Bad configuration: names the key and what is allowed. */
export class ConfigError extends AirmError {
  readonly key: string;
  constructor(key: string, message: string) {
    super("CONFIG", `${key}: ${message}`);
    this.key = key;
  }
}

/** The accelerator this process should own cannot be chosen or opened (which card, why). */
export class DeviceError extends AirmError {
  constructor(message: string, options?: { cause?: unknown }) {
    super("DEVICE", message, options);
  }
}

/**
 * A structured-output constraint (JSON schema, regex, choice, grammar, tool call) that cannot be
 * built (`invalid`: the request's fault, its field in `param`) or whose matcher failed while it
 * ran (a token the grammar rejected, the grammar engine gone): never tokens outside the grammar.
 */
export class GrammarError extends AirmError {
  readonly param: string | null;
  readonly invalid: boolean;
  constructor(message: string, options: { param?: string | null; invalid: boolean; cause?: unknown }) {
    super("GRAMMAR", message, options.cause === undefined ? undefined : { cause: options.cause });
    this.param = options.param ?? null;
    this.invalid = options.invalid;
  }
}

/** A command line that cannot be run as given (unknown flag, bad value): the bin exits 2. */
export class UsageError extends AirmError {
  constructor(message: string) {
    super("USAGE", message);
  }
}

/** A request named a LoRA adapter that is not loaded (vLLM answers 404): load it first, or fix the name. */
export class UnknownLoraError extends AirmError {
  readonly lora: string;
  constructor(lora: string, loaded: string[]) {
    super(
      "UNKNOWN_LORA",
      `no LoRA adapter ${JSON.stringify(lora)} is loaded${loaded.length ? ` (loaded: ${loaded.join(", ")})` : " (none is)"}; load it with POST /v1/load_lora_adapter or --lora-modules`,
    );
    this.lora = lora;
  }
}
