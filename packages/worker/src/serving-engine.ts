// Finds and loads the engine a worker drives. The engine is the one whose package declares the
// `--backend` (its package.json `backends`), found through the registry without importing any
// engine; the worker never names one. Checks at run time that the plugin offers what the
// contract promises, since a plugin is code the worker did not compile against.

import { ConfigError, openEngine, registry, type Engine, type EngineEntryMeta, type KVStream, type Registry, type ResolveInput, type WorkerRole } from "@airm/rm-core";

/** The engine a worker drives: rm-core's Engine contract. */
export type ServingEngine = Engine;
/** A request's KV inside the engine. */
export type EngineStream = KVStream;

const REQUIRED = ["prefill", "decode", "importKV", "release", "pickVariant", "variants"] as const;

/** Every backend the installed engines declare, with the engine and roles. */
export function declaredBackends(r: Registry = registry): { backend: string; engine: string; roles: WorkerRole[] }[] {
  return r.entries("airm.workloads").flatMap((e) =>
    Object.entries((e.meta as Partial<EngineEntryMeta>).backends ?? {}).map(([backend, d]) => ({ backend, engine: e.name, roles: d.roles })),
  );
}

/**
 * The engine plugin name that runs `backend` in `role`, from what the installed engines declare.
 * Throws ConfigError listing the declared backends, or saying which roles the backend runs.
 */
export function engineForBackend(backend: string, role: WorkerRole, r: Registry = registry): string {
  const all = declaredBackends(r);
  const found = all.filter((b) => b.backend === backend);
  if (found.length === 0) {
    throw new ConfigError("--backend", `unknown backend ${JSON.stringify(backend)}; the installed engines run ${all.map((b) => b.backend).join(", ") || "none"}`);
  }
  if (found.length > 1) throw new ConfigError("--backend", `backend ${JSON.stringify(backend)} is declared by engines ${found.map((b) => b.engine).join(" and ")}`);
  if (!found[0].roles.includes(role)) {
    throw new ConfigError("--backend", `backend ${backend} (engine ${found[0].engine}) runs the ${found[0].roles.join(", ")} role(s), not ${role}`);
  }
  return found[0].engine;
}

/**
 * Loads engine `name` (airm.workloads, kind "engine") with its config resolved from `settings`.
 * Throws UnknownPluginError, ConfigError when the plugin is not an engine or lacks what the worker
 * drives (or a setting is bad), and whatever the engine's load throws (ModelLoad, Device...).
 */
export async function loadServingEngine(
  name: string,
  options: { model: string; backend: string; chip?: number; seqLen?: number; batch?: number },
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
  return engine;
}
