// airm-kv-ucx-info: prints the UCX version, transports and devices nixl-ucx would use on this host
// under the current UCX_* environment (or --tls), and the endpoint error mode that follows.

import { defineCommand, flagOf, isAirmError, switchOf, text } from "@airm/rm-core";
import { NIXL_UCX_CONFIG } from "./nixl-ucx-transport.ts";
import { ucxHostInfo } from "./ucx-host-info.ts";

const COMMAND = defineCommand({
  name: "airm-kv-ucx-info",
  summary: "opens a UCX context and worker the way a nixl-ucx endpoint does and prints what UCX picked",
  usage: ["airm-kv-ucx-info [--tls LIST] [--json] [--raw]"],
  flags: {
    tls: flagOf(text({ label: "list" }), { defaultText: "the environment's UCX_TLS", doc: "use this UCX_TLS instead (e.g. tcp, posix,self, rc,ud,sm,self)" }),
    json: switchOf({ doc: "one JSON object instead of text" }),
    raw: switchOf({ doc: "also print UCX's own context/worker report" }),
  },
  env: [NIXL_UCX_CONFIG],
  notes: "UCX itself reads UCX_* (UCX_TLS picks the wire, UCX_NET_DEVICES the NIC).",
});

export function main(argv = process.argv.slice(2), env: Record<string, string | undefined> = process.env): number {
  let values: ReturnType<typeof COMMAND.parse>["values"];
  try {
    const parsed = COMMAND.parse(argv);
    if (parsed.help) {
      process.stdout.write(COMMAND.help());
      return 0;
    }
    values = parsed.values;
  } catch (e) {
    console.error(`${(e as Error).message}\n\n${COMMAND.help()}`);
    return 2;
  }
  let info: ReturnType<typeof ucxHostInfo>;
  try {
    info = ucxHostInfo({ tls: values.tls, env });
  } catch (e) {
    console.error(`airm-kv-ucx-info: ${isAirmError(e) ? e.message : String(e)}`);
    return 1;
  }
  if (values.json) {
    const { raw, ...rest } = info;
    console.log(JSON.stringify(values.raw ? info : rest, null, 2));
    return 0;
  }
  const tlsSource = values.tls !== undefined ? `--tls ${values.tls}` : info.env.UCX_TLS !== undefined ? `UCX_TLS=${info.env.UCX_TLS}` : "UCX_TLS unset (all)";
  console.log(`UCX ${info.version} (${tlsSource})`);
  console.log(`transports: ${info.transports.join(", ")}`);
  console.log(`devices:    ${info.devices.join(", ")}`);
  console.log(`resources:  ${info.resources.join(", ")}`);
  console.log(`endpoint error handling: ${info.errMode}${info.errMode === "none" ? " (a shared-memory transport is enabled; UCX 1.13 shm cannot report peer failure)" : ""}`);
  console.log(`worker address: ${info.workerAddressBytes} bytes`);
  const envs = Object.entries(info.env);
  if (envs.length) console.log(`UCX environment: ${envs.map(([k, v]) => `${k}=${v}`).join(" ")}`);
  if (values.raw) console.log(info.raw.trimEnd());
  return 0;
}
