// Builds our Tokenizer from GGUF tokenizer metadata: "gpt2" byte-level BPE (tokens, merges, token
// types, special ids, the pre-tokenizer name) by writing an equivalent tokenizer.json in memory and
// handing it to @huggingface/tokenizers; "llama" SentencePiece (tokens, scores, types, byte
// fallback) with spm-tokenizer.ts. Also extracts the chat template. Other tokenizer models are
// refused with an error naming the key.

import type { ModelConfig } from "../checkpoint-types.ts";
import type { GgufFile } from "../checkpoint/gguf-file.ts";
import { GgufMetadata } from "../checkpoint/gguf-metadata.ts";
import { ModelLoadError } from "../checkpoint/model-load-error.ts";
import { HfTokenizer } from "./hf-tokenizer.ts";
import { SpmTokenizer } from "./spm-tokenizer.ts";

/** llama.cpp token types. */
const TOKEN_TYPE_CONTROL = 3;
const TOKEN_TYPE_USER_DEFINED = 4;

const LLAMA3_SPLIT = "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
const QWEN2_SPLIT = "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

const byteLevel = (useRegex: boolean) => ({ type: "ByteLevel", add_prefix_space: false, trim_offsets: true, use_regex: useRegex });

/** The Hugging Face pre-tokenizer equivalent to llama.cpp's `tokenizer.ggml.pre` name. */
export function preTokenizerFor(pre: string | undefined): object {
  switch (pre) {
    case "smollm":
    case "starcoder":
    case "refact":
    case "codeshell":
      return { type: "Sequence", pretokenizers: [{ type: "Digits", individual_digits: true }, byteLevel(true)] };
    case "llama3":
    case "llama-bpe":
      return { type: "Sequence", pretokenizers: [{ type: "Split", pattern: { Regex: LLAMA3_SPLIT }, behavior: "Isolated", invert: false }, byteLevel(false)] };
    case "qwen2":
      return { type: "Sequence", pretokenizers: [{ type: "Split", pattern: { Regex: QWEN2_SPLIT }, behavior: "Isolated", invert: false }, byteLevel(false)] };
    default:
      return byteLevel(true);
  }
}

export interface GgufTokenizerParts {
  tokenizer: HfTokenizer | SpmTokenizer;
  chatTemplate: string | undefined;
  bosToken: string;
  eosToken: string;
}

/**
 * The tokenizer of a GGUF file. Throws ModelLoadError naming the key when the tokenizer model is
 * not "gpt2" or a required key (tokens, merges) is missing.
 */
export function ggufTokenizer(file: GgufFile, config: ModelConfig): GgufTokenizerParts {
  const md = new GgufMetadata(file);
  const model = md.str("tokenizer.ggml.model");
  if (model === "llama") return spmTokenizer(file, md, config);
  if (model !== "gpt2")
    throw new ModelLoadError(file.path, `tokenizer model "${model}" (tokenizer.ggml.model) is not supported; supported are "gpt2" (byte-level BPE) and "llama" (SentencePiece)`, {
      item: "tokenizer.ggml.model",
    });
  const tokens = md.strings("tokenizer.ggml.tokens");
  const merges = md.strings("tokenizer.ggml.merges");
  const types = md.ints("tokenizer.ggml.token_type") ?? [];
  if (types.length !== 0 && types.length !== tokens.length)
    throw new ModelLoadError(file.path, `tokenizer.ggml.token_type has ${types.length} entries for ${tokens.length} tokens`, { item: "tokenizer.ggml.token_type" });
  const vocab: Record<string, number> = {};
  const added: object[] = [];
  tokens.forEach((t, id) => {
    if (!(t in vocab)) vocab[t] = id;
    const type = types[id];
    if (type === TOKEN_TYPE_CONTROL || type === TOKEN_TYPE_USER_DEFINED) {
      added.push({ id, content: t, single_word: false, lstrip: false, rstrip: false, normalized: false, special: type === TOKEN_TYPE_CONTROL });
    }
  });
  const bosId = config.bosTokenId;
  const addBos = md.bool("tokenizer.ggml.add_bos_token", false) && bosId !== null;
  const pre = md.has("tokenizer.ggml.pre") ? md.str("tokenizer.ggml.pre") : undefined;
  const json = {
    version: "1.0",
    truncation: null,
    padding: null,
    added_tokens: added,
    normalizer: null,
    pre_tokenizer: preTokenizerFor(pre),
    post_processor: addBos
      ? {
          type: "TemplateProcessing",
          single: [{ SpecialToken: { id: tokens[bosId!], type_id: 0 } }, { Sequence: { id: "A", type_id: 0 } }],
          pair: [{ SpecialToken: { id: tokens[bosId!], type_id: 0 } }, { Sequence: { id: "A", type_id: 0 } }, { Sequence: { id: "B", type_id: 1 } }],
          special_tokens: {},
        }
      : null,
    decoder: { type: "ByteLevel", add_prefix_space: true, trim_offsets: true, use_regex: true },
    model: {
      type: "BPE",
      dropout: null,
      unk_token: null,
      continuing_subword_prefix: null,
      end_of_word_suffix: null,
      fuse_unk: false,
      byte_fallback: false,
      ignore_merges: pre === "llama3" || pre === "llama-bpe",
      vocab,
      merges,
    },
  };
  const tokenizer = new HfTokenizer(json, { clean_up_tokenization_spaces: false }, { file: file.path, bosTokenId: bosId, eosTokenIds: config.eosTokenIds });
  const chatTemplate = md.has("tokenizer.chat_template") ? md.str("tokenizer.chat_template") : undefined;
  const name = (id: number | null | undefined) => (id === null || id === undefined ? "" : (tokens[id] ?? ""));
  return { tokenizer, chatTemplate, bosToken: name(bosId), eosToken: name(config.eosTokenIds[0]) };
}

/** A SentencePiece ("llama") GGUF tokenizer: tokens, scores and types; BOS and a space prefix as the file says (llama.cpp's defaults: both on). */
function spmTokenizer(file: GgufFile, md: GgufMetadata, config: ModelConfig): GgufTokenizerParts {
  const tokens = md.strings("tokenizer.ggml.tokens");
  const rawScores = md.raw("tokenizer.ggml.scores");
  if (!Array.isArray(rawScores) || rawScores.length !== tokens.length)
    throw new ModelLoadError(file.path, `tokenizer.ggml.scores must hold one score per token (${tokens.length})`, { item: "tokenizer.ggml.scores" });
  const types = md.ints("tokenizer.ggml.token_type") ?? [];
  if (types.length !== 0 && types.length !== tokens.length)
    throw new ModelLoadError(file.path, `tokenizer.ggml.token_type has ${types.length} entries for ${tokens.length} tokens`, { item: "tokenizer.ggml.token_type" });
  const tokenizer = new SpmTokenizer({
    tokens,
    scores: rawScores.map((x) => Number(x)),
    types,
    bosTokenId: config.bosTokenId,
    eosTokenIds: config.eosTokenIds,
    addBos: md.bool("tokenizer.ggml.add_bos_token", true),
    addSpacePrefix: md.bool("tokenizer.ggml.add_space_prefix", true),
  });
  const chatTemplate = md.has("tokenizer.chat_template") ? md.str("tokenizer.chat_template") : undefined;
  const name = (id: number | null | undefined) => (id === null || id === undefined ? "" : (tokens[id] ?? ""));
  return { tokenizer, chatTemplate, bosToken: name(config.bosTokenId), eosToken: name(config.eosTokenIds[0]) };
}
