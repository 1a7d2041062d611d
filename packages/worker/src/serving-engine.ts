// Loads the engine a worker drives by name through the registry (the worker never imports an
// engine package) and checks at run time that the plugin offers what the contract promises.

import { ConfigError, registry, type Engine, type KVStream } from "@airm/rm-core";

/** The engine a worker drives: rm-core's Engine contract. */
export type ServingEngine = Engine;
/** A request's KV inside the engine. */
export type EngineStream = KVStream;

const REQUIRED = ["prefill", "decode", "importKV", "release", "pickVariant", "variants"] as const;

/**
 * Loads engine `name` (airm.workloads, kind "engine") through the registry.
 * Throws UnknownPluginError (lists installed engines), ConfigError when the plugin is not an engine
 * or lacks what the worker drives, and whatever the engine's load throws (ModelLoad, Device...).
 */
export async function loadServingEngine(
  name: string,
  options: { model: string; backend: string; chip?: number; seqLen?: number; batch?: number; threads?: number },
): Promise<ServingEngine> {
  const plugin = await registry.load("airm.workloads", name);
  if (plugin.kind !== "engine") throw new ConfigError("--backend", `airm.workloads "${name}" is a ${plugin.kind}, not an engine`);
  const engine = await plugin.load(options);
  const missing = REQUIRED.filter((m) => typeof (engine as unknown as Record<string, unknown>)[m] !== "function");
  if (!engine.tokenizer || typeof engine.tokenizer.encode !== "function") missing.push("tokenizer" as never);
  if (missing.length) {
    await engine.close().catch(() => {});
    throw new ConfigError("--backend", `engine "${name}" lacks ${missing.join(", ")}, which the worker needs to serve`);
  }
  return engine;
}

/** The engine plugin name that runs a `--backend`: rngd, rngd-chunk, rngd-full -> rngd; atom -> atom. */
export function engineForBackend(backend: string): string {
  if (backend === "rngd" || backend === "rngd-chunk" || backend === "rngd-full") return "rngd";
  if (backend === "atom") return "atom";
  throw new ConfigError("--backend", `unknown backend ${JSON.stringify(backend)}; use rngd, rngd-chunk, rngd-full or atom`);
}
