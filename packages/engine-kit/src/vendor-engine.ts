// Turns EngineLoadOptions into a running engine for one vendor: validates the backend, selects
// the card, decides the execution path (native only when the vendor library, a card and the
// compiled graphs are all there), sizes variants, threads, chunking and the artifact cache, and
// says at start-up which path it runs on. Vendors plug in their names and native probe.

import { ConfigError } from "@airm/rm-core";
import type { DeviceInfo, EngineVariant } from "@airm/rm-core";
import { ArtifactCache, artifactCacheDir } from "./artifact-cache.ts";
import { selectChip, type ChipSelection } from "./chip-selection.ts";
import { CpuBackedEngine, type NativeHostDecode } from "./cpu-engine.ts";
import type { Vendor } from "./device-discovery.ts";
import type { EngineLoadOptions } from "@airm/rm-core";
import { defaultVariants, normalizeVariants } from "./variants.ts";

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

export interface VendorEngineSpec {
  name: string;
  vendor: Vendor;
  backends: Record<string, BackendMode>;
  defaultBackend: string;
  /** Device-plugin ids the vendor's own library resolves (uuid/serial/bdf -> kernel index), with a one-line note. */
  deviceIdMap?(env: NodeJS.ProcessEnv): { map: Map<string, number>; detail: string } | null;
  /** Decides the native path; called after the card is selected. Throws ConfigError on a half-installed runtime. */
  probeNative(selection: ChipSelection, env: NodeJS.ProcessEnv): NativeProbe;
}

function intEnv(env: NodeJS.ProcessEnv, key: string, fallback: number, min: number, max: number): number {
  const raw = env[key];
  if (raw === undefined || raw === "") return fallback;
  const n = Number(raw);
  if (!Number.isInteger(n) || n < min || n > max) throw new ConfigError(key, `must be an integer in [${min}, ${max}], got "${raw}"`);
  return n;
}

/**
 * Loads an engine of `spec` for `options`. Throws ConfigError (unknown backend, bad threads,
 * bad variants, missing model), DeviceSelectionError (see selectChip), ModelLoadError (from
 * @airm/llama) and NativeRuntimeError (vendor library present but refusing).
 */
export async function loadVendorEngine(spec: VendorEngineSpec, options: EngineLoadOptions): Promise<CpuBackedEngine> {
  const env = options.env ?? process.env;
  const backend = options.backend ?? spec.defaultBackend;
  const mode = spec.backends[backend];
  if (!mode) throw new ConfigError("backend", `engine ${spec.name} runs ${Object.keys(spec.backends).join(", ")}; got "${backend}"`);
  if (typeof options.model !== "string" || options.model.length === 0) throw new ConfigError("model", "a model folder (or file) is required");
  const threads = options.threads ?? intEnv(env, "AIRM_THREADS", 1, 1, 2);
  if (threads !== 1 && threads !== 2) throw new ConfigError("threads", `must be 1 or 2, got ${threads}`);
  const ids = spec.deviceIdMap?.(env) ?? null;
  const selection = selectChip({ vendor: spec.vendor, chip: options.chip ?? 0, env, deviceIds: ids?.map });
  if (ids) selection.detail = `${selection.detail}; ${ids.detail}`;
  const variants: EngineVariant[] = options.variants?.length
    ? normalizeVariants(options.variants)
    : defaultVariants({ seqLen: options.seqLen, batch: options.batch, env });
  const active =
    options.seqLen !== undefined || options.batch !== undefined
      ? variants.find((v) => v.seqLen === (options.seqLen ?? v.seqLen) && v.batch === (options.batch ?? v.batch))
      : undefined;
  const probe = spec.probeNative(selection, env);
  const device: DeviceInfo = probe.hostDecode
    ? { vendor: spec.vendor, path: "native", device: probe.device ?? selection.device, detail: `${probe.detail}; ${selection.detail}` }
    : { vendor: "cpu", path: "cpu-reference", device: null, detail: `${spec.name} execution model on the CPU reference (@airm/llama); ${probe.detail}; ${selection.detail}` };
  const cacheOff = env.AIRM_ARTIFACT_CACHE === "off";
  const engine = await CpuBackedEngine.open(options.model, {
    name: spec.name,
    backend,
    prefillMode: mode.prefillMode,
    residence: mode.residence,
    device,
    variants,
    activeVariant: active,
    chunkSize: intEnv(env, "AIRM_PREFILL_CHUNK", 64, 1, 65536),
    threads,
    artifactCache: cacheOff ? null : new ArtifactCache(artifactCacheDir(env)),
    maxStreams: intEnv(env, "AIRM_KV_STREAMS", 16, 1, 4096),
    nativeHostDecode: probe.hostDecode,
  });
  if (env.AIRM_ENGINE_LOG !== "0") {
    process.stderr.write(
      `[${spec.name}] backend ${backend}, path ${device.path}${device.device ? ` on ${device.device}` : ""}, ` +
        `weights ${engine.stats().weightsFrom} in ${engine.stats().loadMs.toFixed(0)} ms (${engine.cacheNote}); ${device.detail}\n`,
    );
  }
  return engine;
}
