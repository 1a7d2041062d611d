// What configures an engine besides the model and the compiled shape it is asked for: CPU
// threads, chunked-prefill size, how many KV streams it is sized for, the compiled variants, the
// artifact cache, and how the card is found (device root, the pod's allocation). Vendor engines
// add their own entries (library paths) with `.with()`. Resolved once by the worker from its
// environment and passed to load(); nothing here reads the process environment.

import { homedir } from "node:os";
import { join } from "node:path";
import { ConfigError, defineConfig, flag, int, oneOf, opt, text, type ConfigValues, type EngineVariant, type ValueType } from "@airm/rm-core";
import { DEFAULT_KUBELET_CHECKPOINT } from "./kubelet-checkpoint.ts";
import { CHART_SEQ_LEN, parseVariants, variantName } from "./variants.ts";

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
  weights: opt(oneOf(["auto", "bf16", "q8_0", "q4_1"] as const), {
    env: "AIRM_WEIGHTS",
    default: "auto",
    doc: "How the CPU reference holds weight matrices. auto: a GGUF's Q8_0/Q4_0/Q4_1/Q4_K/Q6_K blocks stay as stored and run on integer kernels (Q4_0/Q4_1/Q4_K/Q6_K inputs at AIRM_ACTIVATIONS' width, Q8_0's at 16 bits), float checkpoints as bf16; bf16: everything dequantised to bf16 (the slower, pre-quantized path); q8_0 / q4_1: as auto, and float matrices quantized to that block type at load (about 2x / 3x fewer bytes per token than bf16, lossy).",
  }),
  activations: opt(oneOf(["i8", "i16"] as const), {
    env: "AIRM_ACTIVATIONS",
    default: "i8",
    doc: "Input width of the CPU reference's Q4_0/Q4_1/Q4_K/Q6_K kernels. i8: inputs quantized to 8 bits per block of 32 as llama.cpp does, exact integer dot products on wasm relaxed SIMD (1.3x decode and 1.5-1.7x prefill tokens/s of i16 on one thread, bench/RESULTS.md); i16: 16-bit inputs, slower and closer to the float model. Q8_0 matrices take 16-bit inputs either way. Part of the numerics fingerprint: prefill and decode workers must agree.",
  }),
  prefillChunk: opt(int({ min: 1, max: 65536 }), { env: "AIRM_PREFILL_CHUNK", default: 64, doc: "Tokens per chunk of the rngd-chunk backend's prefill." }),
  prefixCache: opt(int({ min: 0, max: 1024 }), {
    env: "AIRM_PREFIX_CACHE",
    default: 4,
    doc: "Prompts whose KV a prefill engine keeps for prefix reuse: a prompt starting with a kept one's first tokens (in blocks of 4; a chat template's system prompt) copies their KV instead of computing it, same bits. 0 turns it off.",
  }),
  prefillBatchTokens: opt(int({ min: 0, max: 65536 }), {
    env: "AIRM_PREFILL_BATCH_TOKENS",
    default: 0,
    doc: "Whole prompts that wait for a busy prefill engine run together in its next forward pass, up to this many prompt tokens per pass (same bits as one by one). 0 (default) runs them one at a time, first come first served: under a closed loop of chat clients on a CPU, batching cut the time to first token's p90 by ~20% and tripled its median (bench/RESULTS.md).",
  }),
  kvStreams: opt(int({ min: 1, max: 4096 }), {
    env: "AIRM_KV_STREAMS",
    default: 16,
    doc: "KV streams the engine is sized for (the denominator of its KV usage).",
  }),
  variants: opt(variantList, {
    env: "AIRM_VARIANTS",
    defaultText: "batches 1, 4, 8 and 16 (and --B) at the seq len",
    doc: "The compiled variants, e.g. B4xS512,B1xS512; wins over --seq-len and the default batches.",
  }),
  seqLen: opt(int({ min: 8, max: 131072 }), {
    env: "AIRM_SEQ_LEN",
    default: CHART_SEQ_LEN,
    doc: "Compiled context S when the worker gives no --seq-len (the chart's seqLen).",
  }),
  artifactCache: opt(text({ label: "path|off" }), {
    env: "AIRM_ARTIFACT_CACHE",
    default: join(homedir(), ".cache", "airm", "artifacts"),
    defaultText: "~/.cache/airm/artifacts",
    doc: "Folder of the packed-weights artifact cache (warm starts); `off` disables it.",
  }),
  engineLog: opt(flag(), { env: "AIRM_ENGINE_LOG", default: true, doc: "0 silences the engine's start-up line on stderr." }),
});

/** Every setting engine-kit reads. Vendor engines extend it with `.with()`. */
export const ENGINE_CONFIG = ENGINE_RUN_CONFIG.with(DEVICE_CONFIG);
export type EngineConfig = ConfigValues<typeof ENGINE_CONFIG.options>;
