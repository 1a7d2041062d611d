// Loads an engine plugin with its config resolved from the host's environment and explicit
// settings (e.g. the worker's --threads), so an engine never reads the process environment.

import type { Engine, EngineLoadOptions, EnginePlugin } from "./contracts.ts";
import type { ResolveInput } from "./config/config-spec.ts";

/**
 * `plugin.load(options, config)` with `config = plugin.config.resolve(settings)`. Throws
 * ConfigError naming a bad or unknown setting, and whatever the engine's load throws.
 */
export async function openEngine(plugin: EnginePlugin, options: EngineLoadOptions, settings: ResolveInput = {}): Promise<Engine> {
  return plugin.load(options, plugin.config.resolve(settings));
}
