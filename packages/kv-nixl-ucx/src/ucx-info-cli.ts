// airm-kv-ucx-info: prints the UCX version, transports and devices nixl-ucx would use on this host
// under the current UCX_* environment (or --tls), and the endpoint error mode that follows.

import { parseArgs } from "node:util";
import { isAirmError } from "@airm/rm-core";
import { ENV_VARS } from "./nixl-ucx-transport.ts";
import { ucxHostInfo } from "./ucx-host-info.ts";

const USAGE = `usage: airm-kv-ucx-info [--tls LIST] [--json] [--raw]

Opens a UCX context and worker the way a nixl-ucx endpoint does and prints what UCX picked.

  --tls LIST   use this UCX_TLS instead of the environment's (e.g. tcp, posix,self, rc,ud,sm,self)
  --json       one JSON object instead of text
  --raw        also print UCX's own context/worker report

Variables:
${Object.entries(ENV_VARS)
  .map(([k, v]) => `  ${k.padEnd(22)} ${v}`)
  .join("\n")}`;

export function main(argv = process.argv.slice(2)): number {
  let values;
  try {
    ({ values } = parseArgs({
      args: argv,
      options: { tls: { type: "string" }, json: { type: "boolean" }, raw: { type: "boolean" }, help: { type: "boolean", short: "h" } },
    }));
  } catch (e) {
    console.error(`airm-kv-ucx-info: ${(e as Error).message}\n\n${USAGE}`);
    return 2;
  }
  if (values.help) {
    console.log(USAGE);
    return 0;
  }
  let info;
  try {
    info = ucxHostInfo({ tls: values.tls });
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
