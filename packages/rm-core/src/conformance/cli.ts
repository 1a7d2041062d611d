// airm-conformance <group> <name>: loads a plugin through the registry (from the current
// package's dependencies) and runs its group's conformance cases. Ends with `N passed, N failed`.

import { defineCommand } from "../config/command-line.ts";
import { isAirmError } from "../errors.ts";
import { registry } from "../registry.ts";
import { RM_CORE_CONFIG } from "../rm-core-config.ts";
import type { ConformanceFixture } from "../contracts.ts";
import { type CaseResult, runKVTransportConformance } from "./suite.ts";

const command = defineCommand({
  name: "airm-conformance",
  summary: "runs the rm-core conformance cases against one installed plugin",
  usage: ["airm-conformance <group> <name>"],
  flags: {},
  positionals: { min: 2, max: 2 },
  env: [RM_CORE_CONFIG],
  notes: `The plugin <name> of <group> is found through the dependencies of the package in the current
directory (or AIRM_HOST_ROOT, plus AIRM_PLUGINS), and configured from this environment as a
worker would configure it.

  group   airm.kv_transports
  name    a transport name, e.g. shm, tcp, nixl-ucx

Exit status is non-zero if any case fails or the plugin cannot be loaded.`,
});

export async function main(argv = process.argv.slice(2), env: Record<string, string | undefined> = process.env): Promise<number> {
  let parsed: ReturnType<typeof command.parse>;
  try {
    parsed = command.parse(argv);
  } catch (e) {
    console.error(`${(e as Error).message}\n\n${command.help()}`);
    return 2;
  }
  if (parsed.help) {
    process.stdout.write(command.help());
    return 0;
  }
  const [group, name] = parsed.positionals;
  if (group !== "airm.kv_transports") {
    console.error(`airm-conformance: no conformance cases for group "${group}"; known: airm.kv_transports`);
    return 2;
  }
  let fixture: ConformanceFixture;
  try {
    const p = await registry.load(group, name);
    fixture = p.conformance ? await p.conformance(env) : { factory: async () => (await p.create(p.config.resolve({ env }))) as never, teardown: async () => {} };
  } catch (e) {
    console.error(`airm-conformance: ${isAirmError(e) ? e.message : String(e)}`);
    return 2;
  }
  console.log(`conformance ${group} ${name} (${registry.sourceOf(group, name)})`);
  let results: CaseResult[];
  try {
    results = await runKVTransportConformance(fixture);
  } finally {
    await fixture.teardown();
  }
  const passed = results.filter((r) => r.status === "passed").length;
  const failed = results.filter((r) => r.status === "failed").length;
  const skipped = results.filter((r) => r.status === "skipped").length;
  console.log(`${passed} passed, ${failed} failed${skipped ? `, ${skipped} skipped` : ""}`);
  return failed > 0 ? 1 : 0;
}
