// Opens the KV transport by name: an explicit name, else AIRM_KV_TRANSPORT, else `shm`. The
// plugin's options are resolved from explicit options and the host's environment through the
// plugin's own config spec (bad or unknown options fail with their name); copy-only transports
// come back wrapped in FencedTransport. Nothing ever falls back to another transport.

import type { CopyOnlyTransport, KVTransport } from "./contracts.ts";
import { FencedTransport } from "./fenced-transport.ts";
import { registry as defaultRegistry, type Registry } from "./registry.ts";
import { RM_CORE_CONFIG } from "./rm-core-config.ts";

export { DEFAULT_KV_TRANSPORT } from "./rm-core-config.ts";

export interface SelectTransportOptions {
  /** Transport name; wins over AIRM_KV_TRANSPORT. */
  name?: string;
  /** The plugin's options given in code (they win over its environment variables). */
  options?: Record<string, unknown>;
  /** The environment the host was configured with (default: none, only options and defaults). */
  env?: NodeJS.ProcessEnv | Record<string, string | undefined>;
  registry?: Registry;
}

/** The transport name that selectTransport would open. Throws ConfigError for a malformed name. */
export function transportName(opts: Pick<SelectTransportOptions, "name" | "env"> = {}): string {
  return RM_CORE_CONFIG.resolve({ env: opts.env, options: { kvTransport: opts.name || undefined } }).kvTransport;
}

/**
 * Opens the selected transport. Throws UnknownPluginError for a name that is not installed and
 * ConfigError for an option or variable of the plugin that is bad or unknown.
 */
export async function selectTransport(opts: SelectTransportOptions = {}): Promise<KVTransport> {
  const name = transportName(opts);
  const plugin = await (opts.registry ?? defaultRegistry).load("airm.kv_transports", name);
  const options = plugin.config.resolve({ env: opts.env, options: opts.options });
  const t = await plugin.create(options);
  return t.support.copyOnly ? new FencedTransport(t as CopyOnlyTransport) : (t as KVTransport);
}
