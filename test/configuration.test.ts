// Configuration is read through the config layer: every AIRM_* / PD_* variable the code names is
// declared by some package (so docs/configuration.md and --help list it), and the process
// environment is read only where a process starts (bin entry points, launchers of child processes,
// the plugin registry).
import { describe, expect, test } from "vitest";
import { declaredVariables } from "../scripts/gen-docs.ts";
import { allSources } from "./source-files.ts";

/** Where `process.env` may be read: bins' main(), processes that spawn others, the registry. */
const READS_PROCESS_ENV = new Set([
  "packages/rm-core/src/conformance/cli.ts",
  "packages/rm-core/src/registry.ts",
  "packages/kv-relay/src/relay-cli.ts",
  "packages/kv-relay/src/relay-process.ts",
  "packages/kv-nixl-ucx/src/ucx-info-cli.ts",
  "packages/kv-nixl/src/sidecar-cli.ts",
  "packages/kv-nixl/src/info-cli.ts",
  "packages/llama/src/tiny/airm-model-cli.ts",
  "packages/worker/src/cli.ts",
  "packages/gateway/src/cli.ts",
  "packages/workload-runner/src/up-command.ts",
  "packages/workload-runner/src/top/top-command.ts",
  "packages/workload-runner/src/rngd-pd-workload.ts",
  "packages/workload-runner/src/local-cluster.ts",
  "packages/workload-runner/src/k8s-command.ts",
  "packages/workload-runner/src/bench/bench-command.ts",
]);

describe("configuration", () => {
  test("every AIRM_* / PD_* variable named in the code is declared by a package's config", () => {
    const declared = declaredVariables();
    const undeclared: string[] = [];
    for (const [file, text] of allSources()) {
      for (const m of text.matchAll(/\b(?:AIRM|PD)_[A-Z0-9_]*[A-Z0-9]\b/g)) {
        if (!declared.has(m[0])) undeclared.push(`${file}: ${m[0]}`);
      }
    }
    expect(undeclared).toEqual([]);
    expect(declared.size).toBeGreaterThan(30);
  });

  test("the process environment is read only where a process starts", () => {
    const readers = allSources()
      .filter(([file]) => file.startsWith("packages/"))
      .filter(([, text]) => /process\.env\b/.test(text.replace(/\/\/.*$/gm, "").replace(/\/\*[\s\S]*?\*\//g, "")))
      .map(([file]) => file);
    expect(readers.filter((f) => !READS_PROCESS_ENV.has(f))).toEqual([]);
  });
});
