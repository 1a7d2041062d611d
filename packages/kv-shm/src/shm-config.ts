// The shm transport's options: its root folder (PD_SHM_ROOT), blob lifetime and slab size.
// Resolution (explicit options > variables > defaults) is rm-core's config layer; the transport
// itself is in shm-transport.ts.

import { defineConfig, num, opt, text, type ConfigValues } from "@airm/rm-core";
import { DEFAULT_SHM_ROOT } from "./shm-layout.ts";
import type { ShmSettings } from "./shm-transport.ts";

export const DEFAULT_TTL_S = 300;
export const DEFAULT_SLAB_MB = 128;

export const SHM_CONFIG = defineConfig("@airm/kv-shm", {
  root: opt(text({ label: "path" }), {
    env: "PD_SHM_ROOT",
    default: DEFAULT_SHM_ROOT,
    doc: "The shared folder under /dev/shm; prefill and decode must name the same one on the same host (`airm up` makes one per cluster).",
  }),
  ttlS: opt(num({ positive: true }), {
    env: "PD_SHM_TTL_S",
    default: DEFAULT_TTL_S,
    doc: "Seconds a pushed blob lives before it is removed if nobody released it.",
  }),
  slabMb: opt(num({ positive: true }), {
    env: "PD_SHM_SLAB_MB",
    default: DEFAULT_SLAB_MB,
    doc: "Size of each slab file a producer reserves and maps (MiB); a larger blob gets a slab of its own size.",
  }),
});

export type ShmOptions = ConfigValues<typeof SHM_CONFIG.options>;

/** The transport's settings from resolved options. */
export function shmSettings(o: ShmOptions): ShmSettings {
  return { root: o.root, ttlMs: o.ttlS * 1000, slabBytes: Math.ceil(o.slabMb * 1024 * 1024) };
}
