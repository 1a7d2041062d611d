// airm-kv-nixl-info: what this host's NIXL would use for the nixl transport (the Python, the
// wheels' version, the backend plugins NIXL finds, the agent's backends, UCX's transport choice).

import { existsSync } from "node:fs";
import { defineCommand, isAirmError } from "@airm/rm-core";
import { NIXL_VERSION, PythonAgent, defaultNixlPython } from "./python-agent.ts";
import { SIDECAR_CONFIG } from "./sidecar-cli.ts";
import { ROUTES } from "./routes.ts";

export const INFO_COMMAND = defineCommand({
  name: "airm-kv-nixl-info",
  summary: "prints what this host's NIXL would use for the nixl KV transport",
  usage: ["airm-kv-nixl-info"],
  flags: {},
  env: [SIDECAR_CONFIG],
  notes: "Exits 1 when the NIXL wheels are missing or the agent does not start (the reason is printed).",
});

export async function main(argv = process.argv.slice(2), env: Record<string, string | undefined> = process.env): Promise<number> {
  try {
    const { help } = INFO_COMMAND.parse(argv);
    if (help) {
      process.stdout.write(INFO_COMMAND.help());
      return 0;
    }
    const python = SIDECAR_CONFIG.resolve({ env }).python ?? defaultNixlPython();
    console.log(`python: ${python}${existsSync(python) ? "" : " (missing: run scripts/tools/nixl.sh)"}`);
    console.log(`wheels: nixl ${NIXL_VERSION} + nixl-cu12 ${NIXL_VERSION} (expected)`);
    const agent = await PythonAgent.start({ python, name: `airm-info-${process.pid}`, env });
    try {
      const h = agent.hello;
      console.log(`agent: ${h.agent} (pid ${h.pid}), backends: ${h.backends.join(", ")}`);
      console.log(`plugins: ${h.plugins.join(", ")}`);
      console.log(`UCX transports: ${env.UCX_TLS ? `UCX_TLS=${env.UCX_TLS}` : "UCX's own choice (UCX_TLS unset: shared memory on one host, TCP or RDMA across)"}`);
      for (const r of Object.values(ROUTES))
        console.log(`route ${r.name}: ${h.plugins.includes(r.backend) ? "available" : `refused (${r.backend} plugin not loaded)`} - ${r.path}`);
    } finally {
      await agent.stop();
    }
    return 0;
  } catch (e) {
    console.error(isAirmError(e) || e instanceof Error ? (e as Error).message : String(e));
    return 1;
  }
}
