// Finds the executables of the packages this runner starts (worker, gateway, the model tool) and
// of the sidecars transports declare, through package dependencies, without importing them; and
// points the plugin registry at the worker's package, so the runner sees the engines and
// transports the workers it starts will load.

import { readFileSync, realpathSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { ConfigError, dependencyPackageJson, findPackageRoot, registry } from "@airm/rm-core";

const runnerRoot = findPackageRoot(dirname(fileURLToPath(import.meta.url)))!;

/** Absolute path of `bin` of package `pkg` as resolved from `from` (a package folder). Throws ConfigError. */
export function binFrom(from: string, pkg: string, bin: string): string {
  const file = pkg === "." ? join(from, "package.json") : dependencyPackageJson(from, pkg);
  if (!file) throw new ConfigError(bin, `package ${pkg} is not installed next to ${from}; run pnpm install`);
  const json = JSON.parse(readFileSync(file, "utf8")) as { bin?: Record<string, string> | string };
  const rel = typeof json.bin === "string" ? json.bin : json.bin?.[bin];
  if (!rel) throw new ConfigError(bin, `package ${pkg} has no bin named ${bin}`);
  return realpathSync(join(dirname(file), rel));
}

/** Absolute path of `bin` from dependency `pkg` of the runner. Throws ConfigError when absent. */
export function binPath(pkg: string, bin: string): string {
  return binFrom(runnerRoot, pkg, bin);
}

let hostAdded = false;

/** The process registry, with the worker's package as host (its dependencies are the installed plugins). */
export function pluginRegistry(): typeof registry {
  if (!hostAdded) {
    const worker = dependencyPackageJson(runnerRoot, "@airm/worker");
    if (!worker) throw new ConfigError("@airm/worker", "is not installed next to @airm/workload-runner; run pnpm install");
    registry.addHost(dirname(worker));
    hostAdded = true;
  }
  return registry;
}
