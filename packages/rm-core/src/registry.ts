// The plugin registry: finds plugins declared in the `airm` field of the host's dependencies
// (and of the folders AIRM_PLUGINS names), imports each lazily once per process, and hands them
// out by (group, name), with what their package.json entry declares (an engine's backends, a
// transport's sidecar). Hosts never import a plugin; they ask here. Two packages declaring one
// name is an error naming both. One registry per process, even when two copies of rm-core load.

import { existsSync, readFileSync, realpathSync } from "node:fs";
import { createRequire } from "node:module";
import { dirname, join, resolve } from "node:path";
import { pathToFileURL } from "node:url";
import type { AnyPlugin, EnginePlugin, KVTransportPlugin, PluginGroup, WorkloadPlugin } from "./contracts.ts";
import { ConfigError, DuplicatePluginError, PluginShapeError, UnknownPluginError } from "./errors.ts";
import { RM_CORE_CONFIG } from "./rm-core-config.ts";

export type PluginFor<G extends string> = G extends "airm.kv_transports" ? KVTransportPlugin : G extends "airm.workloads" ? EnginePlugin | WorkloadPlugin : AnyPlugin;

/** What the registry knows of a plugin before importing it. */
export interface PluginEntry {
  group: string;
  name: string;
  /** The package that declared it, or "(registered)". */
  source: string;
  /** The declaring package's folder (null for registered plugins). */
  dir: string | null;
  /** The package.json entry's other fields (e.g. `backends`, `sidecar`); {} for registered plugins. */
  meta: Record<string, unknown>;
}

interface Entry extends PluginEntry {
  load(): Promise<unknown>;
  /** Other packages declaring the same name (an error at use). */
  clashes: string[];
}

interface PackageJson {
  name?: string;
  main?: string;
  module?: string;
  exports?: unknown;
  dependencies?: Record<string, string>;
  optionalDependencies?: Record<string, string>;
  airm?: Record<string, Record<string, { export?: string; module?: string; [k: string]: unknown }>>;
}

function readJson(file: string): PackageJson {
  return JSON.parse(readFileSync(file, "utf8")) as PackageJson;
}

/** The folder of the nearest package.json at or above `dir`. */
export function findPackageRoot(dir: string): string | undefined {
  let d = resolve(dir);
  for (;;) {
    if (existsSync(join(d, "package.json"))) return d;
    const up = dirname(d);
    if (up === d) return undefined;
    d = up;
  }
}

/**
 * The package.json of dependency `dep` as the host would resolve it: node_modules folders from the
 * host up (as Node looks), then require.resolve (which needs "./package.json" to be exported).
 */
export function dependencyPackageJson(host: string, dep: string, req: NodeJS.Require = createRequire(join(host, "package.json"))): string | undefined {
  for (let d = host; ; d = dirname(d)) {
    const f = join(d, "node_modules", dep, "package.json");
    if (existsSync(f)) return f;
    if (dirname(d) === d) break;
  }
  try {
    return req.resolve(`${dep}/package.json`);
  } catch {
    return undefined;
  }
}

/** The file a package's "." export points at for `import` (string, import/default conditions, module, main). */
function entryFile(pkgDir: string, pkg: PackageJson): string {
  let target: unknown = pkg.exports;
  if (typeof target === "object" && target !== null && "." in (target as object)) target = (target as Record<string, unknown>)["."];
  for (let i = 0; i < 4 && typeof target === "object" && target !== null; i++) {
    const t = target as Record<string, unknown>;
    target = t.import ?? t.node ?? t.default;
  }
  const rel = typeof target === "string" ? target : (pkg.module ?? pkg.main ?? "index.js");
  return join(pkgDir, rel);
}

function checkShape(group: string, name: string, source: string, value: unknown): AnyPlugin {
  const p = value as Record<string, unknown> | undefined;
  const fail = (detail: string): never => {
    throw new PluginShapeError(source, `${group} "${name}": ${detail}`);
  };
  if (typeof p !== "object" || p === null) fail(`export is ${p === null ? "null" : typeof p}, expected a plugin object`);
  if (p!.name !== name) fail(`plugin.name is ${JSON.stringify(p!.name)}, expected ${JSON.stringify(name)}`);
  const config = p!.config as { resolve?: unknown } | undefined;
  if (group === "airm.kv_transports") {
    if (p!.kind !== "kv_transport") fail(`plugin.kind must be "kv_transport", got ${JSON.stringify(p!.kind)}`);
    if (typeof p!.create !== "function") fail("plugin.create must be a function");
    if (typeof p!.support !== "object" || p!.support === null) fail("plugin.support must describe scope, tiers, dtypes and copyOnly");
    if (typeof config?.resolve !== "function") fail("plugin.config must be a ConfigSpec (defineConfig from @airm/rm-core) declaring create()'s options");
  } else if (group === "airm.workloads") {
    if (p!.kind === "engine") {
      if (typeof p!.load !== "function") fail("an engine plugin needs a load(options) function");
      if (typeof config?.resolve !== "function") fail("an engine plugin needs a config (defineConfig from @airm/rm-core)");
    } else if (p!.kind === "workload") {
      if (typeof p!.run !== "function") fail("a workload plugin needs a run(workload, config) function");
    } else fail(`plugin.kind must be "engine" or "workload", got ${JSON.stringify(p!.kind)}`);
  }
  return p as unknown as AnyPlugin;
}

export class Registry {
  private readonly hosts: string[] = [];
  private readonly manual = new Map<string, Entry>();
  private discovered: Map<string, Entry> | undefined;
  private readonly loaded = new Map<string, Promise<AnyPlugin>>();
  private readonly discover: boolean;

  /** `discover: false` gives a registry that only knows what register() adds (tests, bundles). */
  constructor(options: { discover?: boolean } = {}) {
    this.discover = options.discover ?? true;
  }

  /**
   * Adds a host package whose dependencies are scanned (a folder, a file in it, or a file: URL).
   * Without any, the host is the package around the current working directory.
   */
  addHost(where: string | URL): void {
    const path = where instanceof URL || where.startsWith("file:") ? new URL(where).pathname : where;
    const root = findPackageRoot(existsSync(path) && !path.endsWith(".json") ? path : dirname(path));
    if (!root) throw new ConfigError("host", `no package.json at or above ${path}; a host is a package folder`);
    if (!this.hosts.includes(root)) {
      this.hosts.push(root);
      this.discovered = undefined;
    }
  }

  /** Registers a plugin by hand (tests, bundles). Wins over a discovered one of the same name. */
  register(group: PluginGroup | string, plugin: AnyPlugin | { name: string; load(): Promise<AnyPlugin> }): void {
    const source = "(registered)";
    const load = "load" in plugin && !("kind" in plugin) ? () => plugin.load() : async () => plugin;
    this.manual.set(`${group}\0${plugin.name}`, { group, name: plugin.name, source, dir: null, meta: {}, load, clashes: [] });
    this.loaded.delete(`${group}\0${plugin.name}`);
  }

  /** Names installed in `group`, sorted. */
  list(group: PluginGroup | string): string[] {
    const names = new Set<string>();
    for (const e of [...this.scan().values(), ...this.manual.values()]) if (e.group === group) names.add(e.name);
    return [...names].sort();
  }

  /** Where a plugin comes from: its package name, or "(registered)". */
  sourceOf(group: string, name: string): string | undefined {
    return this.find(group, name)?.source;
  }

  /**
   * What `group` holds, without importing anything: name, package, folder and the declared
   * metadata. Throws DuplicatePluginError when two packages declare one name.
   */
  entries(group: PluginGroup | string): PluginEntry[] {
    return this.list(group).map((name) => this.entry(group, name)!);
  }

  /** One entry (see entries), or undefined when nothing declares it. Throws DuplicatePluginError. */
  entry(group: PluginGroup | string, name: string): PluginEntry | undefined {
    const e = this.find(group, name);
    if (!e) return undefined;
    const { load: _load, clashes: _clashes, ...rest } = e;
    return rest;
  }

  private find(group: string, name: string): Entry | undefined {
    const id = `${group}\0${name}`;
    const e = this.manual.get(id) ?? this.scan().get(id);
    if (e?.clashes.length) throw new DuplicatePluginError(group, name, [e.source, ...e.clashes]);
    return e;
  }

  /**
   * The plugin `name` of `group`, imported once per process.
   * Throws UnknownPluginError (listing the installed names) or PluginShapeError (naming the package).
   */
  async load<G extends PluginGroup | string>(group: G, name: string): Promise<PluginFor<G>> {
    const id = `${group}\0${name}`;
    let p = this.loaded.get(id);
    if (!p) {
      const entry = this.find(group, name);
      if (!entry) throw new UnknownPluginError(group, name, this.list(group));
      p = entry.load().then((v) => checkShape(group, name, entry.source, v));
      p.catch(() => this.loaded.delete(id));
      this.loaded.set(id, p);
    }
    return p as Promise<PluginFor<G>>;
  }

  /** Forgets discovered and loaded plugins (tests). */
  reset(): void {
    this.hosts.length = 0;
    this.manual.clear();
    this.loaded.clear();
    this.discovered = undefined;
  }

  private scan(): Map<string, Entry> {
    if (this.discovered) return this.discovered;
    const found = new Map<string, Entry>();
    if (!this.discover) return (this.discovered = found);
    // The registry is the process's one view of what is installed, so it reads its own two
    // variables from the process environment (see RM_CORE_CONFIG).
    const cfg = RM_CORE_CONFIG.resolve({ env: process.env });
    const base = this.hosts.length ? this.hosts : [cfg.hostRoot ?? findPackageRoot(process.cwd())].filter((h): h is string => Boolean(h));
    const hosts = [
      ...base,
      ...(cfg.plugins ?? []).map((p) => {
        const root = findPackageRoot(p);
        if (!root || !existsSync(join(p, "package.json")))
          throw new ConfigError("AIRM_PLUGINS", `${p} is not a package folder (no package.json); list plugin package folders separated by ":"`);
        return root;
      }),
    ];
    const realDirs = new Map<string, string>();
    const real = (d: string) => {
      let r = realDirs.get(d);
      if (r === undefined) realDirs.set(d, (r = realpathSync(d)));
      return r;
    };
    for (const host of hosts) {
      const hostPkgFile = join(host, "package.json");
      if (!existsSync(hostPkgFile)) continue;
      const hostPkg = readJson(hostPkgFile);
      const req = createRequire(hostPkgFile);
      const deps = { ...hostPkg.optionalDependencies, ...hostPkg.dependencies };
      const candidates: [string, string, PackageJson][] = [[host, hostPkg.name ?? host, hostPkg]];
      for (const dep of Object.keys(deps)) {
        const pkgFile = dependencyPackageJson(host, dep, req);
        if (!pkgFile) continue; // listed but not installed (optional dependency): not offered
        candidates.push([dirname(pkgFile), dep, readJson(pkgFile)]);
      }
      for (const [dir, pkgName, pkg] of candidates) {
        for (const [field, entries] of Object.entries(pkg.airm ?? {})) {
          const group = `airm.${field}`;
          for (const [name, spec] of Object.entries(entries ?? {})) {
            const id = `${group}\0${name}`;
            const seen = found.get(id);
            if (seen) {
              // The same package reached through two hosts is one plugin; another package is a clash.
              if (real(seen.dir!) !== real(dir) && !seen.clashes.includes(pkgName)) seen.clashes.push(pkgName);
              continue;
            }
            const file = spec.module ? join(dir, spec.module) : entryFile(dir, pkg);
            const exportName = spec.export ?? "default";
            const { export: _e, module: _m, ...meta } = spec;
            found.set(id, {
              group,
              name,
              source: pkgName,
              dir,
              meta,
              clashes: [],
              load: async () => {
                let mod: Record<string, unknown>;
                try {
                  mod = (await import(pathToFileURL(file).href)) as Record<string, unknown>;
                } catch (e) {
                  throw new PluginShapeError(pkgName, `cannot import ${file}: ${(e as Error).message}`);
                }
                if (!(exportName in mod)) {
                  throw new PluginShapeError(pkgName, `${group} "${name}": module has no export "${exportName}" (it has: ${Object.keys(mod).join(", ") || "none"})`);
                }
                return mod[exportName];
              },
            });
          }
        }
      }
    }
    this.discovered = found;
    return found;
  }
}

const KEY = Symbol.for("@airm/rm-core/registry@1");
const g = globalThis as unknown as Record<symbol, Registry | undefined>;

/** The process-wide registry (shared by every copy of rm-core in the process). */
export const registry: Registry = (g[KEY] ??= new Registry());
