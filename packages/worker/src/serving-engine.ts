// Loads the engine a worker drives (the one whose package declares the `--backend`, found with
// rm-core's engineForBackend: the worker never names an engine). Checks at run time that the
// plugin offers what the contract promises, since a plugin is code the worker did not compile
// against.

import { ConfigError, openEngine, registry, type Engine, type KVStream, type LoraServingOptions, type ResolveInput } from "@airm/rm-core";

/** The engine a worker drives: rm-core's Engine contract. */
export type ServingEngine = Engine;
/** A request's KV inside the engine. */
export type EngineStream = KVStream;

const REQUIRED = ["prefill", "decode", "importKV", "fork", "recompute", "release", "pickVariant", "variants", "kvCache", "reserve", "onBlocksFreed"] as const;

/**
 * Loads engine `name` (airm.workloads, kind "engine") with its config resolved from `settings`.
 * Throws UnknownPluginError, ConfigError when the plugin is not an engine or lacks what the worker
 * drives (or a setting is bad), and whatever the engine's load throws (ModelLoad, Device...).
 */
export async function loadServingEngine(
  name: string,
  options: { model: string; backend: string; chip?: number; maxModelLen?: number; batch?: number; lora?: LoraServingOptions },
  settings: ResolveInput,
): Promise<ServingEngine> {
  const plugin = await registry.load("airm.workloads", name);
  if (plugin.kind !== "engine") throw new ConfigError("--backend", `airm.workloads "${name}" is a ${plugin.kind}, not an engine`);
  const engine = await openEngine(plugin, options, settings);
  const missing: string[] = REQUIRED.filter((m) => typeof (engine as unknown as Record<string, unknown>)[m] !== "function");
  if (!engine.tokenizer || typeof engine.tokenizer.encode !== "function") missing.push("tokenizer");
  if (missing.length) {
    await engine.close().catch(() => {});
    throw new ConfigError("--backend", `engine "${name}" lacks ${missing.join(", ")}, which the worker needs to serve`);
  }
  if (options.lora && !engine.loras) {
    await engine.close().catch(() => {});
    throw new ConfigError("--enable-lora", `engine "${name}" (backend ${options.backend}) cannot serve LoRA adapters`);
  }
  return engine;
}
