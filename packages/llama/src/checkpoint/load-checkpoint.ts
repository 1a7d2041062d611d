// loadCheckpoint: a Hugging Face folder (config.json, safetensors single or sharded, tokenizer,
// chat template, generation config) or a GGUF file becomes a Checkpoint. Tensors are read lazily
// by the model through the TensorSource; this module only validates names, shapes and ranges.

import { existsSync, readFileSync, statSync } from "node:fs";
import { basename, join, resolve } from "node:path";
import type { Checkpoint, ModelConfig } from "../checkpoint-types.ts";
import { chatTemplateSource, compileChatTemplate, specialTokenContent, type ChatRenderer } from "../tokenizer/chat-template.ts";
import { HfTokenizer } from "../tokenizer/hf-tokenizer.ts";
import { loadGgufCheckpoint } from "./gguf-checkpoint.ts";
import { checkTensors, makeCheckpoint } from "./make-checkpoint.ts";
import { parseGenerationConfig, parseHfConfig } from "./hf-config.ts";
import { ModelLoadError } from "./model-load-error.ts";
import { SafetensorsSource } from "./safetensors-source.ts";

function readJson(file: string, required: true): unknown;
function readJson(file: string, required: false): unknown | undefined;
function readJson(file: string, required: boolean): unknown | undefined {
  if (!existsSync(file)) {
    if (required) throw new ModelLoadError(file, `is missing; a Hugging Face model folder needs it`);
    return undefined;
  }
  try {
    return JSON.parse(readFileSync(file, "utf8"));
  } catch (cause) {
    throw new ModelLoadError(file, `is not valid JSON: ${(cause as Error).message}`, { cause });
  }
}

function safetensorsFiles(dir: string): string[] {
  const indexFile = join(dir, "model.safetensors.index.json");
  if (existsSync(indexFile)) {
    const index = readJson(indexFile, true) as { weight_map?: Record<string, unknown> };
    if (!index || typeof index.weight_map !== "object" || index.weight_map === null) throw new ModelLoadError(indexFile, `has no "weight_map" object`, { item: "weight_map" });
    const shards = [...new Set(Object.values(index.weight_map))];
    for (const shard of shards) {
      if (typeof shard !== "string" || shard.includes("/") || shard.includes("\\") || shard.startsWith("."))
        throw new ModelLoadError(indexFile, `weight_map names an invalid shard ${JSON.stringify(shard)}`, { item: "weight_map" });
      if (!existsSync(join(dir, shard))) throw new ModelLoadError(join(dir, shard), `is missing (listed in ${basename(indexFile)})`);
    }
    return (shards as string[]).sort().map((s) => join(dir, s));
  }
  const single = join(dir, "model.safetensors");
  if (!existsSync(single)) throw new ModelLoadError(dir, `has neither model.safetensors nor model.safetensors.index.json`);
  return [single];
}

/** Tokenizer, chat renderer and bos/eos from a folder's tokenizer files. */
function loadFolderTokenizer(dir: string, config: ModelConfig, eosTokenIds: number[]): { tokenizer: HfTokenizer; renderChat?: ChatRenderer } {
  const tokFile = join(dir, "tokenizer.json");
  const tokJson = readJson(tokFile, true);
  const cfgFile = join(dir, "tokenizer_config.json");
  const tokConfig = (readJson(cfgFile, false) ?? {}) as Record<string, unknown>;
  const tokenizer = new HfTokenizer(tokJson, tokConfig, { file: tokFile, bosTokenId: config.bosTokenId, eosTokenIds });
  const bosToken = specialTokenContent(tokConfig.bos_token) ?? (config.bosTokenId !== null ? tokenizer.idToToken(config.bosTokenId) : undefined) ?? "";
  const eosToken = specialTokenContent(tokConfig.eos_token) ?? (eosTokenIds[0] !== undefined ? tokenizer.idToToken(eosTokenIds[0]) : undefined) ?? "";
  if (tokenizer.bosTokenId === null && bosToken) tokenizer.bosTokenId = tokenizer.tokenToId(bosToken) ?? null;
  const eosFromConfig = eosToken ? tokenizer.tokenToId(eosToken) : undefined;
  if (tokenizer.eosTokenIds.length === 0 && eosFromConfig !== undefined) tokenizer.eosTokenIds.push(eosFromConfig);
  // transformers 5 writes the template to chat_template.jinja only; 4.x into tokenizer_config.json.
  // The .jinja file wins when both exist, as in transformers.
  const jinjaFile = join(dir, "chat_template.jinja");
  const fromJinja = existsSync(jinjaFile) ? readFileSync(jinjaFile, "utf8") : undefined;
  const source = fromJinja ?? chatTemplateSource(tokConfig.chat_template);
  const renderChat = source === undefined ? undefined : compileChatTemplate(source, { bosToken, eosToken }, fromJinja !== undefined ? jinjaFile : cfgFile);
  return renderChat ? { tokenizer, renderChat } : { tokenizer };
}

/** True when `a` and `b` hold byte-identical tokenizer files (both present or both absent). */
function sameTokenizerFiles(a: string, b: string): boolean {
  for (const f of ["tokenizer.json", "tokenizer_config.json", "chat_template.jinja"]) {
    const [fa, fb] = [join(a, f), join(b, f)];
    const [ea, eb] = [existsSync(fa), existsSync(fb)];
    if (ea !== eb) return false;
    if (ea && !readFileSync(fa).equals(readFileSync(fb))) return false;
  }
  return true;
}

function loadHfFolder(dir: string, reuse?: Checkpoint): Checkpoint {
  const configFile = join(dir, "config.json");
  const configDefaults: string[] = [];
  const config = parseHfConfig(readJson(configFile, true), configFile, configDefaults);
  const genFile = join(dir, "generation_config.json");
  const generation = parseGenerationConfig(readJson(genFile, false), genFile, config);
  const tensors = new SafetensorsSource(safetensorsFiles(dir), dir);
  try {
    checkTensors(config, tensors, dir, ["BF16", "F16", "F32"]);
    // A checkpoint of the same tokenizer (a weight update) shares the parsed one: building a
    // 49k-token tokenizer costs ~0.1 s, more than uploading a few changed tensors.
    const shared = reuse && reuse.tokenizer instanceof HfTokenizer && statSync(reuse.path).isDirectory() && sameTokenizerFiles(reuse.path, dir);
    const { tokenizer, renderChat } = shared
      ? { tokenizer: reuse.tokenizer as HfTokenizer, renderChat: reuse.renderChat }
      : loadFolderTokenizer(dir, config, generation.eosTokenIds);
    if (generation.eosTokenIds.length === 0) generation.eosTokenIds.push(...tokenizer.eosTokenIds);
    const finalConfig: ModelConfig = {
      ...config,
      eosTokenIds: config.eosTokenIds.length ? config.eosTokenIds : [...generation.eosTokenIds],
      bosTokenId: config.bosTokenId ?? tokenizer.bosTokenId,
    };
    return makeCheckpoint({ path: dir, id: basename(dir), config: finalConfig, tensors, tokenizer, renderChat, generation, configDefaults });
  } catch (e) {
    tensors.close();
    throw e;
  }
}

export interface LoadCheckpointOptions {
  /**
   * An open checkpoint whose tokenizer and chat template are reused when this folder's tokenizer
   * files are byte-identical to its own (a weight update of the same model); otherwise ignored.
   */
  reuseTokenizerFrom?: Checkpoint;
}

export async function loadCheckpoint(path: string, options: LoadCheckpointOptions = {}): Promise<Checkpoint> {
  const full = resolve(path);
  let isDir: boolean;
  try {
    isDir = statSync(full).isDirectory();
  } catch (cause) {
    throw new ModelLoadError(full, `does not exist or cannot be read; pass a Hugging Face model folder or a .gguf file`, { cause });
  }
  if (isDir) return loadHfFolder(full, options.reuseTokenizerFrom);
  if (full.toLowerCase().endsWith(".gguf")) return loadGgufCheckpoint(full);
  throw new ModelLoadError(full, `is a file but not a .gguf; pass a Hugging Face model folder or a .gguf file`);
}
