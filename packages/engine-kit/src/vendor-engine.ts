// Turns EngineLoadOptions into a running engine for one vendor: validates the backend, selects
// the card, decides the execution path (native only when the vendor library, a card and the
// compiled graphs are all there), sizes variants, threads, chunking and the artifact cache, and
// says at start-up which path it runs on. Vendors plug in their names and native probe.

import { parseCoreBoard } from "./core-board.ts";
import { ConfigError, type ConfigSpec, type ConfigValues, type DeviceInfo, type EngineLoadOptions, type EngineLoras, type EngineVariant, type OptionMap } from "@airm/rm-core";
import { ArtifactCache } from "./artifact-cache.ts";
import { selectChip, type ChipSelection } from "./chip-selection.ts";
import { CpuBackedEngine, type NativeHostDecode } from "./cpu-engine.ts";
import type { Vendor } from "./device-discovery.ts";
import { ENGINE_CONFIG, type EngineConfig } from "./engine-config.ts";
import { normalizeVariants } from "./variants.ts";

export interface BackendMode {
  prefillMode: "whole" | "chunked";
  residence: "device" | "host";
}

/** What a vendor found when asked whether it can run natively. */
export interface NativeProbe {
  /** Set when the native path is taken. */
  hostDecode?: NativeHostDecode;
  /** The device address the native runtime drives (e.g. `rbln:0`). */
  device?: string;
  /** One line: why native or why not. */
  detail: string;
}

export interface VendorEngineSpec<V extends OptionMap = OptionMap> {
  name: string;
  vendor: Vendor;
  backends: Record<string, BackendMode>;
  defaultBackend: string;
  /** The vendor's own settings (library paths...), added to ENGINE_CONFIG. */
  config: ConfigSpec<V>;
  /** Device-plugin ids the vendor's own library resolves (uuid/serial/bdf -> kernel index), with a one-line note. */
  deviceIdMap?(config: ConfigValues<V>): { map: Map<string, number>; detail: string } | null;
  /** Decides the native path; called after the card is selected. Throws ConfigError on a half-installed runtime. */
  probeNative(selection: ChipSelection, config: ConfigValues<V>): NativeProbe;
}

/** "KV cache: N blocks = M tokens (...)": the start-up line about the paged KV cache. */
export function kvLine(engine: CpuBackedEngine): string {
  const kv = engine.kvCache();
  const gib = (kv.totalBlocks * kv.blockBytes) / 2 ** 30;
  return (
    `KV cache: ${kv.totalBlocks} blocks = ${kv.totalBlocks * kv.blockSize} tokens (${gib.toFixed(2)} GiB, ${engine.kvBudgetNote}; blocks of ${kv.blockSize}); ` +
    `max_model_len ${kv.maxModelLen}: ${Math.floor(kv.totalBlocks / Math.ceil(kv.maxModelLen / kv.blockSize))} requests of that length at once`
  );
}

/** "LoRA: max_loras 4, max_lora_rank 64; loaded: sql (r8), ...": the start-up line of an engine serving adapters. */
export function loraLine(loras: EngineLoras): string {
  const loaded = loras.list().map((l) => `${l.name} (r${l.rank})`);
  return `LoRA: max_loras ${loras.maxLoras}, max_lora_rank ${loras.maxLoraRank}; loaded: ${loaded.length ? loaded.join(", ") : "none"}`;
}

/** The full config of a vendor engine: ENGINE_CONFIG plus the vendor's own entries (each row keeps its package). */
export function vendorEngineConfig<V extends OptionMap>(spec: { config: ConfigSpec<V> }): ConfigSpec<typeof ENGINE_CONFIG.options & V> {
  return ENGINE_CONFIG.with(spec.config);
}

/**
 * Loads an engine of `spec` for `options` with `config` (ENGINE_CONFIG plus the vendor's, resolved;
 * default: all defaults); `options.lora` serves LoRA adapters on the CPU-reference path (the
 * native path refuses them: UnsupportedError). Throws ConfigError (unknown backend, bad variants, missing model, a bad adapter),
 * DeviceSelectionError (see selectChip), ModelLoadError (from @airm/llama) and NativeRuntimeError
 * (vendor library present but refusing).
 */
export async function loadVendorEngine<V extends OptionMap>(
  spec: VendorEngineSpec<V>,
  options: EngineLoadOptions,
  config: EngineConfig & ConfigValues<V> = vendorEngineConfig(spec).resolve({}) as EngineConfig & ConfigValues<V>,
): Promise<CpuBackedEngine> {
  const backend = options.backend ?? spec.defaultBackend;
  const mode = spec.backends[backend];
  if (!mode) throw new ConfigError("backend", `engine ${spec.name} runs ${Object.keys(spec.backends).join(", ")}; got "${backend}"`);
  if (typeof options.model !== "string" || options.model.length === 0) throw new ConfigError("model", "a model folder (or file) is required");
  const threads = config.threads as 1 | 2;
  const ids = spec.deviceIdMap?.(config) ?? null;
  const selection = selectChip({ vendor: spec.vendor, chip: options.chip ?? 0, config, deviceIds: ids?.map });
  if (ids) selection.detail = `${selection.detail}; ${ids.detail}`;
  // Explicit variants (the load option, else AIRM_VARIANTS); unset, the engine compiles its
  // defaults up to max_model_len.
  const variants: EngineVariant[] | undefined = options.variants?.length ? normalizeVariants(options.variants) : config.variants;
  const probe = spec.probeNative(selection, config);
  const device: DeviceInfo = probe.hostDecode
    ? { vendor: spec.vendor, path: "native", device: probe.device ?? selection.device, detail: `${probe.detail}; ${selection.detail}` }
    : { vendor: "cpu", path: "cpu-reference", device: null, detail: `${spec.name} execution model on the CPU reference (@airm/llama); ${probe.detail}; ${selection.detail}` };
  const cacheOff = config.artifactCache === "off";
  const engine = await CpuBackedEngine.open(options.model, {
    name: spec.name,
    backend,
    prefillMode: mode.prefillMode,
    residence: mode.residence,
    device,
    variants,
    batch: options.batch,
    chunkSize: config.prefillChunk,
    threads,
    secondThread: config.secondThread,
    coreBoard: config.coreBoard === undefined ? undefined : parseCoreBoard(config.coreBoard),
    weights: config.weights,
    activations: config.activations,
    artifactCache: cacheOff ? null : new ArtifactCache(config.artifactCache),
    prefixCaching: config.prefixCaching,
    prefillBatchTokens: config.prefillBatchTokens,
    blockSize: config.blockSize,
    kvCacheMemory: config.kvCacheMemory,
    maxModelLen: options.maxModelLen ?? config.maxModelLen,
    maxNumBatchedTokens: config.maxNumBatchedTokens,
    prefillShare: config.prefillShare,
    generationConfig: config.generationConfig,
    nativeHostDecode: probe.hostDecode,
    lora: options.lora,
  });
  if (config.engineLog) {
    const defaults = engine.configDefaults.length ? `; config.json lacks ${engine.configDefaults.join(", ")}: architecture defaults used` : "";
    process.stderr.write(
      `[${spec.name}] backend ${backend}, path ${device.path}${device.device ? ` on ${device.device}` : ""}, ` +
        `weights ${engine.stats().weightsFrom} in ${engine.stats().loadMs.toFixed(0)} ms (${engine.cacheNote}; held as ${engine.weightsHeld}); ${device.detail}${defaults}\n` +
        `[${spec.name}] ${kvLine(engine)}\n` +
        `[${spec.name}] ${engine.generationDefaultsNote}\n` +
        (engine.loras ? `[${spec.name}] ${loraLine(engine.loras)}\n` : ""),
    );
  }
  return engine;
}
