// airm-kv-relay: the command line around startRelay(). Parses flags (falling back to the
// AIRM_KV_TCP_* variables), prints one "listening" line on stdout, and stops on SIGINT/SIGTERM.

import { parseArgs } from "node:util";
import { isAirmError, untilStopSignal } from "@airm/rm-core";
import { startRelay } from "./relay-server.ts";
import { DEFAULT_ADDR, DEFAULT_MAX_MB, DEFAULT_TTL_S, ENV_VARS, envFlag, envNumber, parseHostPort } from "./tcp-config.ts";

const USAGE = `usage: airm-kv-relay [--listen HOST:PORT] [options]

Keeps KV blobs in memory for the tcp transport: prefill workers push, decode workers pull.

Options:
  --listen HOST:PORT    address to listen on (default ${DEFAULT_ADDR}; bind the pod IP or 0.0.0.0 across nodes)
  --metrics-port PORT   serve GET /metrics (Prometheus) and GET /health on this port (default AIRM_METRICS_PORT; unset: off)
  --max-mb MIB          byte cap for blobs in MiB (default AIRM_KV_TCP_MAX_MB, else ${DEFAULT_MAX_MB})
  --ttl-s SECONDS       drop blobs not released within this time (default AIRM_KV_TCP_TTL_S, else ${DEFAULT_TTL_S})
  --no-crc              do not check the pushers' CRC-32 (default: check, unless AIRM_KV_TCP_CRC=0)
  --log                 log size and SHA-256 of every blob stored (default AIRM_KV_TCP_LOG)
  -h, --help            this text

Environment:
${Object.entries(ENV_VARS)
  .map(([k, v]) => `  ${k.padEnd(20)}  ${v}`)
  .join("\n")}

Prints "airm-kv-relay listening on HOST:PORT" once ready; logs (JSON, pino) go to stderr.`;

function intArg(value: string | undefined, name: string, max = Number.MAX_SAFE_INTEGER): number | undefined {
  if (value === undefined) return undefined;
  const n = Number(value);
  if (!Number.isFinite(n) || n < 0 || n > max) throw new Error(`--${name} ${JSON.stringify(value)} is not a number in 0..${max}`);
  return n;
}

/** Runs the relay until SIGINT/SIGTERM; returns the exit code (2 for bad arguments). */
export async function main(argv = process.argv.slice(2)): Promise<number> {
  let relay;
  try {
    const { values } = parseArgs({
      args: argv,
      options: {
        listen: { type: "string" },
        "metrics-port": { type: "string" },
        "max-mb": { type: "string" },
        "ttl-s": { type: "string" },
        "no-crc": { type: "boolean" },
        log: { type: "boolean" },
        help: { type: "boolean", short: "h" },
      },
    });
    if (values.help) {
      console.log(USAGE);
      return 0;
    }
    const { host, port } = parseHostPort(values.listen ?? DEFAULT_ADDR, "--listen");
    const metricsPort = intArg(values["metrics-port"], "metrics-port", 65535) ?? (process.env.AIRM_METRICS_PORT ? envNumber("AIRM_METRICS_PORT", 0) : undefined);
    const maxMb = intArg(values["max-mb"], "max-mb") ?? envNumber("AIRM_KV_TCP_MAX_MB", DEFAULT_MAX_MB);
    const ttlS = intArg(values["ttl-s"], "ttl-s") ?? envNumber("AIRM_KV_TCP_TTL_S", DEFAULT_TTL_S);
    relay = await startRelay({
      host,
      port,
      metricsPort,
      maxBytes: Math.floor(maxMb * 1024 * 1024),
      ttlMs: ttlS * 1000,
      crc: values["no-crc"] ? false : envFlag("AIRM_KV_TCP_CRC", true),
      log: values.log ? true : envFlag("AIRM_KV_TCP_LOG", false),
    });
  } catch (e) {
    console.error(`airm-kv-relay: ${isAirmError(e) || e instanceof Error ? e.message : String(e)}\n(airm-kv-relay --help lists the options)`);
    return 2;
  }
  console.log(`airm-kv-relay listening on ${relay.address}${relay.metricsPort !== undefined ? ` (metrics on port ${relay.metricsPort})` : ""}`);
  await untilStopSignal();
  await relay.close();
  return 0;
}
