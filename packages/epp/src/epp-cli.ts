// airm-epp: the command line around startEpp(). Exactly one endpoint source: --pool-name
// (Kubernetes) or --endpoints-file (static). Prints one "listening" line on stdout once every port
// listens, logs JSON on stderr, and stops on SIGINT/SIGTERM. Bad flags exit 2 naming the flag.

import { defineCommand, flagOf, isAirmError, RM_CORE_CONFIG, tlsMaterialOf, UsageError, untilStopSignal, type Opt } from "@airm/rm-core";
import { EPP_CONFIG } from "./epp-config.ts";
import type { Epp } from "./epp-server.ts";
import { stderrLog } from "./log.ts";

type Options = typeof EPP_CONFIG.options;

/** A flag declared from its config row: same type and meaning, default shown from the config. */
function flagFor<K extends keyof Options>(key: K, show: { defaultText?: string; metavar?: string } = {}) {
  const o = EPP_CONFIG.options[key] as Opt<unknown>;
  const defaultText = show.defaultText ?? (o.default !== undefined ? `default ${o.type.show(o.default)}` : undefined);
  return flagOf(o.type, { defaultText, doc: o.doc, metavar: show.metavar });
}

export const EPP_COMMAND = defineCommand({
  name: "airm-epp",
  summary: "endpoint picker for Envoy (ext_proc, as the Gateway API Inference Extension's EPP speaks it): picks a decode pod and, for PD, a prefill pod per request",
  usage: ["airm-epp --endpoints-file FILE [options]", "airm-epp --pool-name NAME [--pool-namespace NS] [options]"],
  flags: {
    grpcPort: flagFor("grpcPort", { metavar: "PORT" }),
    host: flagFor("host"),
    poolName: flagFor("poolName", { defaultText: "none: static mode" }),
    poolNamespace: flagFor("poolNamespace", { defaultText: "POD_NAMESPACE, else default" }),
    poolPollMs: flagFor("poolPollMs", { metavar: "MS" }),
    endpointsFile: flagFor("endpointsFile", { defaultText: "none: Kubernetes mode" }),
    metricsPort: flagFor("metricsPort", { metavar: "PORT" }),
    healthPort: flagFor("healthPort", { metavar: "PORT" }),
    scrapeIntervalMs: flagFor("scrapeIntervalMs", { metavar: "MS" }),
    staleAfterMs: flagFor("staleAfterMs", { metavar: "MS" }),
    localPrefillMaxTokens: flagFor("localPrefillMaxTokens", { metavar: "TOKENS" }),
    disaggregation: flagFor("disaggregation"),
    routing: flagFor("routing"),
    kvEventsPort: flagFor("kvEventsPort"),
    kvReplayPort: flagFor("kvReplayPort"),
    failureMode: flagFor("failureMode", { metavar: "FailOpen|FailClose" }),
    logLevel: flagFor("logLevel", { metavar: "LEVEL" }),
  },
  env: [EPP_CONFIG],
  notes: [
    'Prints "airm-epp listening on HOST:PORT ..." once ready. Kubernetes mode reads KUBECONFIG, ~/.kube/config or the',
    "in-cluster service account, and needs get on inferencepools and list on pods in the pool's namespace.",
    "AIRM_TLS_DIR (tls.crt, tls.key, ca.crt): scrape the endpoints' /metrics over mutual TLS (plain HTTP where an endpoint answers",
    "in plain HTTP) and serve the ext_proc port over TLS (no client certificate asked); the health port stays plain (docs/tls.md).",
  ].join("\n"),
});

/** Runs the picker until SIGINT/SIGTERM; returns the exit code (2 for bad arguments, 1 when it cannot start). */
export async function main(argv: string[], env: Record<string, string | undefined>): Promise<number> {
  let c: ReturnType<typeof EPP_CONFIG.resolve>;
  try {
    const { values: f, help } = EPP_COMMAND.parse(argv);
    if (help) {
      process.stdout.write(EPP_COMMAND.help());
      return 0;
    }
    c = EPP_CONFIG.resolve({ env, options: f });
    if (c.localPrefillMaxTokens > 0 && c.disaggregation !== "prompt-length") {
      throw new UsageError(`airm-epp: --local-prefill-max-tokens ${c.localPrefillMaxTokens} is the prompt-length rule: add --disaggregation prompt-length, or leave it 0`);
    }
    if ((c.poolName === undefined) === (c.endpointsFile === undefined)) {
      throw new UsageError("airm-epp: give exactly one of --pool-name (Kubernetes) or --endpoints-file (static)");
    }
  } catch (e) {
    console.error(`${isAirmError(e) || e instanceof Error ? (e as Error).message : String(e)}\n(airm-epp --help lists the options)`);
    return 2;
  }
  const log = stderrLog(c.logLevel);
  let epp: Epp;
  try {
    // Loaded after the arguments are checked: --help and usage errors answer without loading gRPC.
    const [{ startEpp }, { InferencePoolMembers }, { StaticEndpoints }] = await Promise.all([import("./epp-server.ts"), import("@airm/routing"), import("./static-endpoints.ts")]);
    const source = c.poolName
      ? new InferencePoolMembers({ poolName: c.poolName, namespace: c.poolNamespace, pollMs: c.poolPollMs, log })
      : new StaticEndpoints(c.endpointsFile!, { log });
    const core = RM_CORE_CONFIG.resolve({ env });
    epp = await startEpp({
      source,
      host: c.host,
      grpcPort: c.grpcPort,
      healthPort: c.healthPort,
      metricsPort: c.metricsPort,
      scrapeIntervalMs: c.scrapeIntervalMs,
      staleAfterMs: c.staleAfterMs,
      picker: { localPrefillMaxTokens: c.localPrefillMaxTokens, disaggregation: c.disaggregation, routing: c.routing },
      kvEvents: { port: c.kvEventsPort, replayPort: c.kvReplayPort },
      failureMode: c.failureMode,
      tls: tlsMaterialOf(core.tlsDir, { reloadS: core.tlsReloadS }),
      log,
    });
  } catch (e) {
    console.error(`airm-epp: cannot start: ${(e as Error).message}`);
    return 1;
  }
  const from = c.poolName ? `InferencePool ${c.poolNamespace}/${c.poolName}` : c.endpointsFile;
  console.log(
    `airm-epp listening on ${epp.address} (ext_proc + health${epp.tls ? " over TLS" : ""}; health on port ${epp.healthPort}, metrics on port ${epp.metricsPort}; endpoints from ${from})`,
  );
  await untilStopSignal(env);
  await epp.close();
  return 0;
}
