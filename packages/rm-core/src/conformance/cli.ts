// airm-conformance <group> <name>: loads a plugin through the registry (from the current
// package's dependencies) and runs its group's conformance cases. Ends with `N passed, N failed`.

import { parseArgs } from "node:util";
import { isAirmError } from "../errors.ts";
import { registry } from "../registry.ts";
import { runKVTransportConformance } from "./suite.ts";

const USAGE = `usage: airm-conformance <group> <name>

Runs the rm-core conformance cases against the plugin <name> of <group>, found through the
dependencies of the package in the current directory (or AIRM_HOST_ROOT).

  group   airm.kv_transports
  name    a transport name, e.g. shm, tcp, nixl-ucx

Exit status is non-zero if any case fails or the plugin cannot be loaded.`;

export async function main(argv = process.argv.slice(2)): Promise<number> {
  const { positionals, values } = parseArgs({ args: argv, allowPositionals: true, options: { help: { type: "boolean", short: "h" } } });
  if (values.help) {
    console.log(USAGE);
    return 0;
  }
  if (positionals.length !== 2) {
    console.error(USAGE);
    return 2;
  }
  const [group, name] = positionals;
  if (group !== "airm.kv_transports") {
    console.error(`airm-conformance: no conformance cases for group "${group}"; known: airm.kv_transports`);
    return 2;
  }
  let plugin;
  try {
    plugin = await registry.load(group, name);
  } catch (e) {
    console.error(`airm-conformance: ${isAirmError(e) ? e.message : String(e)}`);
    return 2;
  }
  const fixture = plugin.conformance
    ? await plugin.conformance()
    : { factory: async () => (await plugin.create()) as never, teardown: async () => {} };
  console.log(`conformance ${group} ${name} (${registry.sourceOf(group, name)})`);
  let results;
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
