// Reading what plugins declare in their package.json entries, without importing them: which
// engine runs a `--backend` and in which roles, and what a transport needs beside the workers
// (a sidecar process, a per-cluster folder). Hosts ask here instead of naming plugins.

import type { ClusterDirSpec, EngineEntryMeta, SidecarSpec, TransportEntryMeta, WorkerRole } from "./contracts.ts";
import { ConfigError, UnknownPluginError } from "./errors.ts";
import { registry as defaultRegistry, type Registry } from "./registry.ts";

/** Every backend the installed engines declare, with its engine and roles. */
export function declaredBackends(r: Registry = defaultRegistry): { backend: string; engine: string; roles: WorkerRole[] }[] {
  return r
    .entries("airm.workloads")
    .flatMap((e) => Object.entries((e.meta as Partial<EngineEntryMeta>).backends ?? {}).map(([backend, d]) => ({ backend, engine: e.name, roles: d.roles })));
}

/**
 * The engine plugin name that runs `backend` in `role`, from what the installed engines declare.
 * Throws ConfigError (key `what`) listing the declared backends, or saying which roles it runs.
 */
export function engineForBackend(backend: string, role: WorkerRole, r: Registry = defaultRegistry, what = "--backend"): string {
  const all = declaredBackends(r);
  const found = all.filter((b) => b.backend === backend);
  if (found.length === 0) throw new ConfigError(what, `unknown backend ${JSON.stringify(backend)}; the installed engines run ${all.map((b) => b.backend).join(", ") || "none"}`);
  if (found.length > 1) throw new ConfigError(what, `backend ${JSON.stringify(backend)} is declared by engines ${found.map((b) => b.engine).join(" and ")}`);
  if (!found[0].roles.includes(role)) throw new ConfigError(what, `backend ${backend} (engine ${found[0].engine}) runs the ${found[0].roles.join(", ")} role(s), not ${role}`);
  return found[0].engine;
}

export interface TransportNeeds {
  name: string;
  /** The package that declared it. */
  source: string;
  /** Its folder (a sidecar's bin is resolved from there). */
  dir: string | null;
  sidecar: SidecarSpec | null;
  clusterDir: ClusterDirSpec | null;
}

/**
 * What transport `name` declares it needs. Throws UnknownPluginError listing the installed
 * transports, ConfigError for a malformed declaration (naming the package).
 */
export function transportNeeds(name: string, r: Registry = defaultRegistry): TransportNeeds {
  const e = r.entry("airm.kv_transports", name);
  if (!e) throw new UnknownPluginError("airm.kv_transports", name, r.list("airm.kv_transports"));
  const meta = e.meta as TransportEntryMeta;
  const bad = (what: string) => new ConfigError(`${e.source} airm.kv_transports.${name}.${what}`, "is malformed; see SidecarSpec / ClusterDirSpec in @airm/rm-core's contracts");
  const s = meta.sidecar;
  if (s !== undefined) {
    const ok =
      typeof s.name === "string" &&
      typeof s.bin === "string" &&
      Array.isArray(s.args) &&
      Number.isInteger(s.port) &&
      typeof s.env === "object" &&
      (s.ready === "connect" || typeof (s.ready as { http?: unknown })?.http === "string");
    if (!ok) throw bad("sidecar");
  }
  const d = meta.clusterDir;
  if (d !== undefined && !(typeof d.env === "string" && typeof d.under === "string" && typeof d.prefix === "string")) throw bad("clusterDir");
  return { name, source: e.source, dir: e.dir, sidecar: s ?? null, clusterDir: d ?? null };
}
