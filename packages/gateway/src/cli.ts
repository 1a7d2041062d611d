// `airm-gateway`: parses the command line (node:util parseArgs) and environment, starts the
// gateway and stops it on SIGINT/SIGTERM.

import { parseArgs } from "node:util";
import { isAirmError, untilStopSignal } from "@airm/rm-core";
import { startGateway } from "./gateway-server.ts";

const HELP = `airm-gateway: the OpenAI-compatible front door of rngd-pd

usage: airm-gateway [--port 8000] --prefill URL[,URL...] --decode URL[,URL...]
       airm-gateway [--port 8000] --solo URL[,URL...]

  --port N            port of the OpenAI API (default 8000; 0 picks a free port)
  --host H            address to listen on (default 127.0.0.1)
  --prefill URLS      prefill workers, comma-separated (e.g. http://127.0.0.1:8101)
  --decode URLS       decode workers, comma-separated (e.g. http://127.0.0.1:8102)
  --solo URLS         solo workers instead of a prefill/decode pair
  --metrics-port N    serve airm_* metrics on this port (default: AIRM_METRICS_PORT, else none)
  --max-body-bytes N  largest request body (default 1048576)
  -h, --help          this text

environment: AIRM_METRICS_PORT, AIRM_PREFILL_TIMEOUT_MS (120000), AIRM_DECODE_IDLE_TIMEOUT_MS (60000),
AIRM_KV_TIMEOUT_MS (60000), AIRM_HEALTH_INTERVAL_MS (2000).
Routes: POST /v1/completions, POST /v1/chat/completions, GET /v1/models, GET /health.
`;

function intOf(name: string, v: string | undefined): number | undefined {
  if (v === undefined || v === "") return undefined;
  const n = Number(v);
  if (!Number.isInteger(n) || n < 0) throw new Error(`${name} must be a non-negative integer, got ${JSON.stringify(v)}`);
  return n;
}

const list = (v: string | undefined) => (v ? v.split(",").map((s) => s.trim()).filter(Boolean) : undefined);

/** Runs the CLI; resolves with an exit code once the gateway has stopped (or failed to start). */
export async function main(argv = process.argv.slice(2), env = process.env): Promise<number> {
  let values;
  try {
    ({ values } = parseArgs({
      args: argv,
      options: {
        port: { type: "string", default: "8000" },
        host: { type: "string", default: "127.0.0.1" },
        prefill: { type: "string" },
        decode: { type: "string" },
        solo: { type: "string" },
        "metrics-port": { type: "string" },
        "max-body-bytes": { type: "string" },
        help: { type: "boolean", short: "h" },
      },
      strict: true,
    }));
  } catch (err) {
    console.error(`airm-gateway: ${(err as Error).message}\n\n${HELP}`);
    return 2;
  }
  if (values.help) {
    console.log(HELP);
    return 0;
  }
  let gw;
  try {
    gw = await startGateway({
      port: intOf("--port", values.port)!,
      host: values.host,
      prefill: list(values.prefill),
      decode: list(values.decode),
      solo: list(values.solo),
      metricsPort: intOf("--metrics-port", values["metrics-port"] ?? env.AIRM_METRICS_PORT),
      maxBodyBytes: intOf("--max-body-bytes", values["max-body-bytes"]),
      prefillTimeoutMs: intOf("AIRM_PREFILL_TIMEOUT_MS", env.AIRM_PREFILL_TIMEOUT_MS),
      decodeIdleTimeoutMs: intOf("AIRM_DECODE_IDLE_TIMEOUT_MS", env.AIRM_DECODE_IDLE_TIMEOUT_MS),
      kvTimeoutMs: intOf("AIRM_KV_TIMEOUT_MS", env.AIRM_KV_TIMEOUT_MS),
      healthIntervalMs: intOf("AIRM_HEALTH_INTERVAL_MS", env.AIRM_HEALTH_INTERVAL_MS),
    });
  } catch (err) {
    console.error(`airm-gateway: ${isAirmError(err) ? err.message : (err as Error).message}`);
    return 2;
  }
  console.log(JSON.stringify({ msg: "airm-gateway listening", url: gw.url, metrics_port: gw.metricsPort }));
  await untilStopSignal();
  await gw.close();
  return 0;
}
