// airm-kv-nixl-agent: runs the host's NIXL agent sidecar until SIGINT/SIGTERM.

import { RELAY_CLIENT_CONFIG } from "@airm/kv-relay";
import { ConfigError, RM_CORE_CONFIG, defineCommand, defineConfig, flag, flagOf, hostPort, isAirmError, num, opt, text, tlsMaterialOf, untilStopSignal } from "@airm/rm-core";
import { defaultNixlPython } from "./python-agent.ts";
import { startSidecar } from "./sidecar.ts";
import { DEFAULT_NIXL_ADDR } from "./nixl-transport.ts";

export const SIDECAR_CONFIG = defineConfig("@airm/kv-nixl sidecar", {
  python: opt(text({ label: "path" }), {
    env: "AIRM_NIXL_PYTHON",
    defaultText: "~/.cache/airm/nixl-1.5.1/venv/bin/python (scripts/tools/nixl.sh installs it)",
    doc: "The Python whose site-packages hold the nixl and nixl-cu12 wheels (matching versions).",
  }),
  ttlS: opt(num({ min: 1 }), {
    env: "AIRM_KV_NIXL_TTL_S",
    default: 300,
    doc: "Seconds a published blob that no consumer read lives before its slot is given back to its producer (counted as expired).",
  }),
  crossHost: opt(flag(), {
    env: "AIRM_KV_NIXL_CROSS_HOST",
    default: false,
    doc: "1: copies between hosts. The sidecar announces each publication in the KV relay (AIRM_KV_TCP_ADDR), looks up there the blobs its consumers pull that were published on another host, and READs them from that host's agent (NIXL's progress thread then serves other hosts' READs). 0: copies between the arenas of this host only, no relay.",
  }),
  peerAddr: opt(hostPort(), {
    env: "AIRM_KV_NIXL_PEER_ADDR",
    defaultText: "the --listen address (then not a loopback one)",
    doc: "With AIRM_KV_NIXL_CROSS_HOST=1: the host:port at which the other hosts' sidecars reach this one (they fetch its NIXL metadata there and report the blobs they read).",
  }),
});

export const SIDECAR_COMMAND = defineCommand({
  name: "airm-kv-nixl-agent",
  summary: "the NIXL agent of one host for the nixl KV transport: workers register arenas, publish blobs and run bind / plan / submit / wait over gRPC",
  usage: ["airm-kv-nixl-agent [--listen HOST:PORT] [--python PATH]"],
  flags: {
    listen: flagOf(hostPort(), { default: DEFAULT_NIXL_ADDR, doc: "address of the gRPC control API" }),
    python: flagOf(text({ label: "path" }), { defaultText: "AIRM_NIXL_PYTHON", doc: "Python with the NIXL wheels" }),
  },
  env: [SIDECAR_CONFIG, RELAY_CLIENT_CONFIG, RM_CORE_CONFIG],
  notes: 'Prints "airm-kv-nixl-agent listening on HOST:PORT (agent NAME)" once ready; exits 1 if the NIXL agent process dies.',
});

/** The address other hosts reach this sidecar at: never a loopback or wildcard one. */
function peerAddress(addr: string): string {
  const host = addr.slice(0, addr.lastIndexOf(":")).replace(/^\[|\]$/g, "");
  if (/^(127\.|0\.0\.0\.0$|::1?$|localhost$)/.test(host)) {
    throw new ConfigError(
      "peerAddr",
      `AIRM_KV_NIXL_CROSS_HOST=1: other hosts cannot reach this sidecar at ${addr}; set AIRM_KV_NIXL_PEER_ADDR (or --listen) to an address of this host they reach`,
    );
  }
  return addr;
}

export async function main(argv = process.argv.slice(2), env: Record<string, string | undefined> = process.env): Promise<number> {
  let sidecar: Awaited<ReturnType<typeof startSidecar>>;
  try {
    const { values: f, help } = SIDECAR_COMMAND.parse(argv);
    if (help) {
      process.stdout.write(SIDECAR_COMMAND.help());
      return 0;
    }
    const c = SIDECAR_CONFIG.resolve({ env, options: { python: f.python } });
    const { internalToken, tlsDir, tlsReloadS } = RM_CORE_CONFIG.resolve({ env });
    const crossHost = c.crossHost
      ? { relay: RELAY_CLIENT_CONFIG.resolve({ env }).addr, peer: peerAddress(c.peerAddr ?? f.listen), tls: tlsMaterialOf(tlsDir, { reloadS: tlsReloadS }) }
      : undefined;
    sidecar = await startSidecar({
      crossHost,
      listen: f.listen,
      python: c.python ?? defaultNixlPython(),
      ttlS: c.ttlS,
      token: internalToken,
      env,
      log: (line) => console.error(`airm-kv-nixl-agent: ${line}`),
    });
  } catch (e) {
    console.error(`${isAirmError(e) || e instanceof Error ? (e as Error).message : String(e)}\n(airm-kv-nixl-agent --help lists the options)`);
    return isAirmError(e, "USAGE") || isAirmError(e, "CONFIG") ? 2 : 1;
  }
  console.log(`airm-kv-nixl-agent listening on ${sidecar.address} (agent ${sidecar.agent})`);
  const why = await Promise.race([untilStopSignal(env).then(() => null), sidecar.agentExited]);
  await sidecar.close();
  if (why !== null) {
    console.error(`airm-kv-nixl-agent: the NIXL agent process ended (${why}); exiting so that the supervisor restarts the sidecar`);
    return 1;
  }
  return 0;
}
