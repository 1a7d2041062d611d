// Finds the executables of the packages this runner starts (worker, gateway, relay, model tool)
// through its own dependencies, without importing them.

import { readFileSync, realpathSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { ConfigError, dependencyPackageJson, findPackageRoot } from "@airm/rm-core";

const runnerRoot = findPackageRoot(dirname(fileURLToPath(import.meta.url)))!;

/** Absolute path of `bin` from dependency `pkg` of the runner. Throws ConfigError when absent. */
export function binPath(pkg: string, bin: string): string {
  const file = dependencyPackageJson(runnerRoot, pkg);
  if (!file) throw new ConfigError(bin, `package ${pkg} is not installed next to @airm/workload-runner; run pnpm install`);
  const json = JSON.parse(readFileSync(file, "utf8")) as { bin?: Record<string, string> | string };
  const rel = typeof json.bin === "string" ? json.bin : json.bin?.[bin];
  if (!rel) throw new ConfigError(bin, `package ${pkg} has no bin named ${bin}`);
  return realpathSync(join(dirname(file), rel));
}
