// Settings of an shm endpoint: explicit options first, then PD_SHM_ROOT / PD_SHM_TTL_S /
// PD_SHM_SLAB_MB, then defaults. Validation only; the transport itself is in shm-transport.ts.

import { z } from "zod";
import { ConfigError } from "@airm/rm-core";
import { DEFAULT_SHM_ROOT } from "./shm-layout.ts";
import type { ShmSettings } from "./shm-transport.ts";

export const DEFAULT_TTL_S = 300;
export const DEFAULT_SLAB_MB = 128;

const optionsSchema = z
  .object({
    root: z.string().min(1).optional(),
    ttlMs: z.number().positive().finite().optional(),
    slabBytes: z.number().int().positive().max(2 ** 40).optional(),
  })
  .strict();

export type ShmOptions = z.infer<typeof optionsSchema>;

function positiveNumber(env: NodeJS.ProcessEnv, name: string): number | undefined {
  const raw = env[name];
  if (raw === undefined || raw === "") return undefined;
  const v = Number(raw);
  if (!Number.isFinite(v) || v <= 0) throw new ConfigError(name, `must be a positive number, got ${JSON.stringify(raw)}`);
  return v;
}

/**
 * Resolves endpoint settings from `options` (root, ttlMs, slabBytes) and the environment.
 * Throws ConfigError naming the bad option or variable.
 */
export function resolveShmSettings(options: Record<string, unknown> = {}, env: NodeJS.ProcessEnv = process.env): ShmSettings {
  const parsed = optionsSchema.safeParse(options);
  if (!parsed.success) {
    const issue = parsed.error.issues[0];
    const key = issue.path.length ? `shm.${issue.path.join(".")}` : "shm options";
    throw new ConfigError(key, `${issue.message}; allowed options are root (a folder), ttlMs (> 0) and slabBytes (a positive integer)`);
  }
  const o = parsed.data;
  const ttlS = positiveNumber(env, "PD_SHM_TTL_S") ?? DEFAULT_TTL_S;
  const slabMb = positiveNumber(env, "PD_SHM_SLAB_MB") ?? DEFAULT_SLAB_MB;
  return {
    root: o.root ?? (env.PD_SHM_ROOT || DEFAULT_SHM_ROOT),
    ttlMs: o.ttlMs ?? ttlS * 1000,
    slabBytes: o.slabBytes ?? Math.ceil(slabMb * 1024 * 1024),
  };
}
