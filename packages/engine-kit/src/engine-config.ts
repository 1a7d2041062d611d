// What configures an engine besides the model and the compiled shape it is asked for: CPU
// threads, chunked-prefill size, how many KV streams it is sized for, the compiled variants, the
// artifact cache, and how the card is found (device root, the pod's allocation). Vendor engines
// add their own entries (library paths) with `.with()`. Resolved once by the worker from its
// environment and passed to load(); nothing here reads the process environment.

import { homedir } from "node:os";
import { join } from "node:path";
import { BLOCK_SIZES, ConfigError, DEFAULT_BLOCK_SIZE, defineConfig, flag, int, num, oneOf, opt, text, type ConfigValues, type EngineVariant, type ValueType } from "@airm/rm-core";
import { DEFAULT_KV_SHARE, parseKvCacheMemory, showKvCacheMemory, type KvCacheMemory } from "./kv-budget.ts";
import { DEFAULT_KUBELET_CHECKPOINT } from "./kubelet-checkpoint.ts";
import { parseVariants, variantName } from "./variants.ts";

/** `B4xS512,B1xS256` (or an array of variants in code). */
const variantList: ValueType<EngineVariant[]> = {
  label: "B<batch>xS<seq>,...",
  parse(raw) {
    if (Array.isArray(raw)) return parseVariants(raw.map((v: EngineVariant) => variantName(v)).join(","));
    if (typeof raw !== "string") throw new Error(`expected a list like B4xS512,B1xS256, got ${JSON.stringify(raw)}`);
    try {
      return parseVariants(raw);
    } catch (e) {
      throw new Error(e instanceof ConfigError ? e.message.replace(/^AIRM_VARIANTS: /, "") : String(e));
    }
  },
  show: (v) => v.map(variantName).join(","),
};

/** `0.25` (a share of the memory available) or bytes (`512M`, `2G`, `189000000`). */
const kvMemory: ValueType<KvCacheMemory> = {
  label: "share|bytes",
  parse(raw) {
    if (typeof raw === "object" && raw !== null && ("share" in raw || "bytes" in raw)) return raw as KvCacheMemory;
    try {
      return parseKvCacheMemory(String(raw));
    } catch (e) {
      throw new Error((e as Error).message.replace(/^kv-cache-memory: /, ""));
    }
  },
  show: showKvCacheMemory,
};

/** A block size the kernels take. */
const blockSize: ValueType<number> = {
  label: BLOCK_SIZES.join("|"),
  parse(raw) {
    const n = typeof raw === "number" ? raw : Number(String(raw).trim());
    if (!(BLOCK_SIZES as readonly number[]).includes(n)) throw new Error(`must be one of ${BLOCK_SIZES.join(", ")}, got ${JSON.stringify(raw)}`);
    return n;
  },
  show: String,
};

/** Where cards are found and how `--chip -1` learns this pod's allocation. */
export const DEVICE_CONFIG = defineConfig("@airm/engine-kit", {
  devRoot: opt(text({ label: "path" }), { env: "AIRM_DEV_ROOT", default: "/dev", doc: "Where device nodes are looked for (tests point it at fixture folders)." }),
  podUid: opt(text({ label: "uid" }), {
    env: "POD_UID",
    defaultText: "unset",
    doc: "This pod's UID (the chart sets it from the downward API); with --chip -1 it selects the pod's record in the kubelet checkpoint.",
  }),
  kubeletCheckpoint: opt(text({ label: "path" }), {
    env: "AIRM_KUBELET_CHECKPOINT",
    default: DEFAULT_KUBELET_CHECKPOINT,
    doc: "The kubelet device-plugin checkpoint (mounted read-only by the chart) that --chip -1 reads.",
  }),
  deviceIdMap: opt(text({ label: "JSON" }), {
    env: "AIRM_DEVICE_ID_MAP",
    defaultText: "unset",
    doc: 'JSON map from a device-plugin id the vendor library cannot resolve to a card: {"<id>": "npu1"}.',
  }),
});

export type DeviceConfig = ConfigValues<typeof DEVICE_CONFIG.options>;

/** The engine's own settings (threads, chunking, KV sizing, variants, artifact cache, start-up line). */
export const ENGINE_RUN_CONFIG = defineConfig("@airm/engine-kit", {
  threads: opt(int({ min: 1, max: 2 }), {
    env: "AIRM_THREADS",
    default: 1,
    doc: "CPU threads of the reference backend per engine (the worker's --threads wins).",
  }),
  secondThread: opt(oneOf(["always", "when-idle"] as const), {
    env: "AIRM_SECOND_THREAD",
    default: "always",
    doc: "With 2 threads: always use the second one, or (when-idle) only while no other part on the core board (AIRM_CORE_BOARD) has work, so that one stream alone gets both cores and busy parts never run more threads than cores. Same tokens either way.",
  }),
  coreBoard: opt(text({ label: "FILE:SLOT" }), {
    env: "AIRM_CORE_BOARD",
    defaultText: "unset",
    doc: "A file the parts of one host share (4 bytes per part, made by `airm up`) and this part's slot in it: the part says there whether it has work, and with AIRM_SECOND_THREAD=when-idle reads whether the others do.",
  }),
  weights: opt(oneOf(["auto", "bf16", "q8_0", "q4_1"] as const), {
    env: "AIRM_WEIGHTS",
    default: "auto",
    doc: "How the CPU reference holds weight matrices. auto: a GGUF's Q8_0/Q4_0/Q4_1/Q5_0/Q5_1/IQ4_NL/MXFP4/Q3_K/Q4_K/Q5_K/Q6_K/IQ4_XS blocks stay as stored and run on integer kernels (Q4/Q3_K/Q6_K inputs at AIRM_ACTIVATIONS' width, Q5's at 8 bits (as bf16 under i16), Q8_0's and IQ4's at 16 bits), Q2_K and float checkpoints as bf16; bf16: everything dequantised to bf16 (the slower, pre-quantized path); q8_0 / q4_1: as auto, and float matrices quantized to that block type at load (about 2x / 3x fewer bytes per token than bf16, lossy).",
  }),
  activations: opt(oneOf(["i8", "i16"] as const), {
    env: "AIRM_ACTIVATIONS",
    default: "i8",
    doc: "Input width of the CPU reference's Q4_0/Q4_1/Q4_K/Q3_K/Q6_K kernels (the Q5 types have 8-bit ones only). i8: inputs quantized to 8 bits per block of 32 as llama.cpp does, exact integer dot products on wasm relaxed SIMD (1.3x decode and 1.5-1.7x prefill tokens/s of i16 on one thread, bench/RESULTS.md); i16: 16-bit inputs, slower and closer to the float model. Q8_0 matrices take 16-bit inputs either way. Part of the numerics fingerprint: prefill and decode workers must agree.",
  }),
  prefillChunk: opt(int({ min: 1, max: 65536 }), { env: "AIRM_PREFILL_CHUNK", default: 64, doc: "Tokens per chunk of the rngd-chunk backend's prefill." }),
  prefixCaching: opt(flag(), {
    env: "AIRM_ENABLE_PREFIX_CACHING",
    default: true,
    doc: "Prefix caching by block (vLLM's --enable-prefix-caching): every full KV block a prompt or a finished stream leaves stays in the cache under its block hash (parent hash, token ids, model and numerics fingerprints, cache_salt) until the pool needs it (least recently used first); a prompt that starts with kept blocks shares them instead of computing them, same bits. 0 turns it off (--no-enable-prefix-caching).",
  }),
  prefillBatchTokens: opt(int({ min: 0, max: 65536 }), {
    env: "AIRM_PREFILL_BATCH_TOKENS",
    default: 0,
    doc: "Whole prompts that wait for a busy prefill engine run together in its next forward pass, up to this many prompt tokens per pass (same bits as one by one). 0 (default) runs them one at a time, first come first served: under a closed loop of chat clients on a CPU, batching cut the time to first token's p90 by ~20% and tripled its median (bench/RESULTS.md).",
  }),
  blockSize: opt(blockSize, {
    env: "AIRM_BLOCK_SIZE",
    default: DEFAULT_BLOCK_SIZE,
    doc: "Positions per block of the paged KV cache (vLLM's --block-size). Prefill and decode workers must agree: the KV crosses in blocks.",
  }),
  kvCacheMemory: opt(kvMemory, {
    env: "AIRM_KV_CACHE_MEMORY",
    default: { share: DEFAULT_KV_SHARE },
    doc: `The paged KV cache's budget: a share (0-1] of the memory the process can still have once the weights are in (MemAvailable, or the cgroup limit), or bytes (512M, 2G). Default ${DEFAULT_KV_SHARE}: the cache takes memory only as blocks are used, and a quarter leaves room for the other parts of a cluster on the same machine. It must hold one request of max_model_len; the start-up line prints the blocks and tokens it buys.`,
  }),
  maxModelLen: opt(int({ min: 8, max: 1 << 20 }), {
    env: "AIRM_MAX_MODEL_LEN",
    defaultText: "the model's context (max_position_embeddings / context_length)",
    doc: "The longest request (prompt + max_tokens) served (vLLM's --max-model-len); at most the model's own context. The worker's --max-model-len wins.",
  }),
  maxNumBatchedTokens: opt(int({ min: 16, max: 1 << 20 }), {
    env: "AIRM_MAX_NUM_BATCHED_TOKENS",
    default: 2048,
    doc: "Most tokens in one forward pass, decode steps included (vLLM's --max-num-batched-tokens): a longer prompt prefills in chunks of this size.",
  }),
  prefillShare: opt(num({ min: 0.01, max: 1 }), {
    env: "AIRM_PREFILL_SHARE",
    default: 0.25,
    doc: "Where streams decode on the worker that prefills (solo, --local-prefill, a preempted stream's recompute), a prompt chunk shares their passes and adds at most this share of a decode pass's time (from measured costs): running streams keep their pace (TPOT up to 1 + share) while a long prompt prefills beside them.",
  }),
  variants: opt(variantList, {
    env: "AIRM_VARIANTS",
    defaultText: "batches 1, 4, 8 and 16 (and --B) at contexts 512, 1024, ... up to max_model_len",
    doc: "The compiled (batch, context) variants an NPU would run, e.g. B4xS512,B1xS2048: which requests fit a graph. The largest context caps max_model_len.",
  }),
  artifactCache: opt(text({ label: "path|off" }), {
    env: "AIRM_ARTIFACT_CACHE",
    default: join(homedir(), ".cache", "airm", "artifacts"),
    defaultText: "~/.cache/airm/artifacts",
    doc: "Folder of the packed-weights artifact cache (warm starts); `off` disables it.",
  }),
  generationConfig: opt(oneOf(["auto", "vllm"] as const), {
    env: "AIRM_GENERATION_CONFIG",
    default: "auto",
    doc: "Whose sampling defaults a request gets for the fields it leaves out (temperature, top_p, top_k, min_p, repetition_penalty), as vLLM's --generation-config: auto takes the model's own, from a Hugging Face folder's generation_config.json or a GGUF's general.sampling.* keys (llama.cpp's); vllm ignores them (temperature 1, the rest off). A value the request gives always wins. The start-up line prints the defaults in use; the gateway takes them from the workers' /health.",
  }),
  engineLog: opt(flag(), { env: "AIRM_ENGINE_LOG", default: true, doc: "0 silences the engine's start-up line on stderr." }),
});

/** Every setting engine-kit reads. Vendor engines extend it with `.with()`. */
export const ENGINE_CONFIG = ENGINE_RUN_CONFIG.with(DEVICE_CONFIG);
export type EngineConfig = ConfigValues<typeof ENGINE_CONFIG.options>;
