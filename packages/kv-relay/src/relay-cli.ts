// airm-kv-relay: the command line around startRelay(). Flags win over the AIRM_KV_TCP_*
// variables (RELAY_CONFIG); AIRM_INTERNAL_TOKEN (RM_CORE_CONFIG) makes it refuse callers without
// that token, AIRM_TLS_DIR serve mutual TLS only. Prints one "listening" line on stdout and stops on SIGINT/SIGTERM (or when the
// `airm up` that started it is gone).

import { defineCommand, flagOf, hostPort, int, isAirmError, num, RM_CORE_CONFIG, switchOf, tlsMaterialOf, untilStopSignal } from "@airm/rm-core";
import { DEFAULT_ADDR, parseHostPort } from "./address.ts";
import { RELAY_CONFIG } from "./relay-config.ts";
import { startRelay } from "./relay-server.ts";

export const RELAY_COMMAND = defineCommand({
  name: "airm-kv-relay",
  summary: "keeps KV blobs in memory for the tcp transport (and nixl-ucx's descriptors): prefill workers push, decode workers pull",
  usage: ["airm-kv-relay [--listen HOST:PORT] [options]"],
  flags: {
    listen: flagOf(hostPort(), { default: DEFAULT_ADDR, doc: "address to listen on; bind the pod IP or 0.0.0.0 across nodes" }),
    metricsPort: flagOf(int({ min: 0, max: 65535 }), { defaultText: "AIRM_METRICS_PORT; unset: off", doc: "serve GET /metrics (Prometheus) and GET /health on this port" }),
    maxMb: flagOf(num({ positive: true }), { defaultText: "AIRM_KV_TCP_MAX_MB", doc: "byte cap for blobs in MiB" }),
    ttlS: flagOf(num({ min: 0 }), { defaultText: "AIRM_KV_TCP_TTL_S", doc: "drop blobs not released within this time" }),
    noCrc: switchOf({ doc: "do not check the pushers' CRC-32 (default: check, unless AIRM_KV_TCP_CRC=0)" }),
    log: switchOf({ doc: "log size and SHA-256 of every blob stored (default AIRM_KV_TCP_LOG)" }),
  },
  env: [RELAY_CONFIG, RM_CORE_CONFIG],
  notes: 'Prints "airm-kv-relay listening on HOST:PORT" once ready; logs (JSON, pino) go to stderr.',
});

/** Runs the relay until SIGINT/SIGTERM; returns the exit code (2 for bad arguments or variables). */
export async function main(argv = process.argv.slice(2), env: Record<string, string | undefined> = process.env): Promise<number> {
  let relay: Awaited<ReturnType<typeof startRelay>>;
  try {
    const { values: f, help } = RELAY_COMMAND.parse(argv);
    if (help) {
      process.stdout.write(RELAY_COMMAND.help());
      return 0;
    }
    const c = RELAY_CONFIG.resolve({ env, options: { maxMb: f.maxMb, ttlS: f.ttlS, metricsPort: f.metricsPort, crc: f.noCrc ? false : undefined, log: f.log || undefined } });
    const { internalToken, tlsDir, tlsReloadS } = RM_CORE_CONFIG.resolve({ env });
    const tls = tlsMaterialOf(tlsDir, { reloadS: tlsReloadS });
    const { host, port } = parseHostPort(f.listen, "--listen");
    relay = await startRelay({
      host,
      port,
      metricsPort: c.metricsPort,
      maxBytes: Math.floor(c.maxMb * 1024 * 1024),
      ttlMs: c.ttlS * 1000,
      crc: c.crc,
      log: c.log,
      reusePool: c.reusePool,
      directReads: c.directReads,
      token: internalToken,
      tls,
    });
  } catch (e) {
    console.error(`${isAirmError(e) || e instanceof Error ? (e as Error).message : String(e)}\n(airm-kv-relay --help lists the options)`);
    return 2;
  }
  const extras = [relay.tls ? "mutual TLS" : "", relay.metricsPort !== undefined ? `metrics on port ${relay.metricsPort}` : ""].filter(Boolean);
  console.log(`airm-kv-relay listening on ${relay.address}${extras.length ? ` (${extras.join(", ")})` : ""}`);
  await untilStopSignal(env);
  await relay.close();
  return 0;
}
