// Picks the KV transport by name: an explicit option, else AIRM_KV_TRANSPORT, else `shm`.
// Copy-only transports come back wrapped in FencedTransport. Nothing ever falls back.

import type { CopyOnlyTransport, KVTransport } from "./contracts.ts";
import { FencedTransport } from "./fenced-transport.ts";
import { registry as defaultRegistry, type Registry } from "./registry.ts";

export const DEFAULT_KV_TRANSPORT = "shm";

export interface SelectTransportOptions {
  /** Transport name; wins over AIRM_KV_TRANSPORT. */
  name?: string;
  /** Passed to the plugin's create(). */
  options?: Record<string, unknown>;
  env?: NodeJS.ProcessEnv;
  registry?: Registry;
}

/** The transport name that selectTransport would open. */
export function transportName(opts: Pick<SelectTransportOptions, "name" | "env"> = {}): string {
  const env = opts.env ?? process.env;
  return opts.name || env.AIRM_KV_TRANSPORT || DEFAULT_KV_TRANSPORT;
}

/** Opens the selected transport. Throws UnknownPluginError for a name that is not installed. */
export async function selectTransport(opts: SelectTransportOptions = {}): Promise<KVTransport> {
  const name = transportName(opts);
  const plugin = await (opts.registry ?? defaultRegistry).load("airm.kv_transports", name);
  const t = await plugin.create(opts.options);
  return t.support.copyOnly ? new FencedTransport(t as CopyOnlyTransport) : (t as KVTransport);
}
