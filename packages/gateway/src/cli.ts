// `airm-gateway`: the command line (rm-core's defineCommand) and environment (GATEWAY_CONFIG),
// starts the gateway and stops it on SIGINT/SIGTERM, after draining (drain.ts, AIRM_DRAIN_S), or at
// once when the `airm up` that started it is gone.

import { defineCommand, flagOf, switchOf, int, isAirmError, list, oneOf, RM_CORE_CONFIG, text, tlsMaterialOf, untilStopSignal } from "@airm/rm-core";
import { startTracing, TELEMETRY_CONFIG, type Tracing } from "@airm/telemetry";
import { GATEWAY_CONFIG } from "./gateway-config.ts";
import { startGateway } from "./gateway-server.ts";
import { DISAGGREGATION_MODES } from "./orchestrator/index.ts";

const urls = list(text({ label: "URL" }));

export const GATEWAY_COMMAND = defineCommand({
  name: "airm-gateway",
  summary: "the OpenAI-compatible front door of rngd-pd",
  usage: [
    "airm-gateway [--port 8000] --prefill URL[,URL...] --decode URL[,URL...]",
    "airm-gateway [--port 8000] --prefill-pool NAME --decode URL",
    "airm-gateway [--port 8000] --solo URL[,URL...]",
  ],
  flags: {
    port: flagOf(int({ min: 0, max: 65535 }), { default: 8000, doc: "port of the OpenAI API (0 picks a free port)" }),
    host: flagOf(text({ label: "address" }), { default: "127.0.0.1", doc: "address to listen on" }),
    prefill: flagOf(urls, { metavar: "URLS", doc: "prefill workers, comma-separated (e.g. http://127.0.0.1:8101)" }),
    decode: flagOf(urls, { metavar: "URLS", doc: "decode workers, comma-separated (e.g. http://127.0.0.1:8102)" }),
    solo: flagOf(urls, { metavar: "URLS", doc: "solo workers instead of a prefill/decode pair" }),
    prefillPool: flagOf(text({ label: "name" }), {
      metavar: "NAME",
      doc: "take prefill workers from this Kubernetes InferencePool (its pods labelled llm-d.ai/role=prefill, at its target port; KUBECONFIG or the pod's service account): llm-d's topology, where this gateway is a decode pod's sidecar",
    }),
    poolNamespace: flagOf(text({ label: "namespace" }), { defaultText: "POD_NAMESPACE, else default", doc: "namespace of --prefill-pool" }),
    localPrefill: switchOf({
      doc: "the --decode workers also prefill whole requests (they were started with --local-prefill): a request may run there instead of shipping its KV from a prefill worker; --disaggregation says when",
    }),
    disaggregation: flagOf(oneOf(DISAGGREGATION_MODES), {
      default: "auto",
      doc: "with --local-prefill, where a request runs: auto = an endpoint picker's x-prefiller-host-port ships its KV, else ship only when max(prefill worker's prefill time, KV bytes / the decode worker's KV bandwidth) is under the decode worker's own prefill time (both measured by the workers; see docs/decisions.md); header = llm-d's sidecar rule (the header ships, no header runs locally); always = ship every request; never = run every request on the decode worker",
    }),
    metricsPort: flagOf(int({ min: 0, max: 65535 }), { defaultText: "AIRM_METRICS_PORT, else none", doc: "serve airm_* metrics on this port" }),
    maxBodyBytes: flagOf(int({ min: 1024 }), { default: 1 << 20, doc: "largest request body" }),
    migrationLimit: flagOf(int({ min: 0, max: 100 }), {
      defaultText: "AIRM_MIGRATION_LIMIT, else 3",
      doc: "times a stream may move to another worker when its worker dies or drains, resuming at the next token with the same tokens (0: never)",
    }),
    toolCallParser: flagOf(oneOf(["hermes", "llama3_json", "none"] as const), {
      defaultText: "AIRM_TOOL_CALL_PARSER, else hermes",
      doc: 'how tool calls are read from answers to tool_choice "auto" (none: auto is refused)',
    }),
    otlpTracesEndpoint: flagOf(text({ label: "URL" }), {
      defaultText: "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT, else none",
      doc: "export spans to this OTLP receiver URL (vLLM's flag; the OTEL_* variables set the rest: protocol, sampler, service name)",
    }),
    apiKey: flagOf(list(text({ label: "key" })), {
      metavar: "KEYS",
      defaultText: "AIRM_API_KEY, else none",
      doc: "API keys, comma-separated: requests need `Authorization: Bearer <key>` (prefer AIRM_API_KEY: a flag shows in the process list)",
    }),
  },
  env: [GATEWAY_CONFIG, RM_CORE_CONFIG, TELEMETRY_CONFIG],
  notes:
    "Routes: POST /v1/completions, POST /v1/chat/completions, GET /v1/models, GET /health, GET /metrics (airm_* and the vllm:* gauges an endpoint picker reads). A request with x-prefiller-host-port runs its prefill on that prefill worker when it is one of --prefill (else 403).",
});

/** Runs the CLI; resolves with an exit code once the gateway has stopped (or failed to start). */
export async function main(argv = process.argv.slice(2), env: Record<string, string | undefined> = process.env): Promise<number> {
  let gw: Awaited<ReturnType<typeof startGateway>>;
  let tracing: Tracing;
  let drainS: number;
  try {
    const { values: f, help } = GATEWAY_COMMAND.parse(argv);
    if (help) {
      process.stdout.write(GATEWAY_COMMAND.help());
      return 0;
    }
    const cfg = GATEWAY_CONFIG.resolve({
      env,
      options: { metricsPort: f.metricsPort, maxBodyBytes: f.maxBodyBytes, apiKeys: f.apiKey, toolCallParser: f.toolCallParser, migrationLimit: f.migrationLimit },
    });
    const prefillPool = f.prefillPool ? { name: f.prefillPool, namespace: f.poolNamespace ?? cfg.podNamespace } : undefined;
    const core = RM_CORE_CONFIG.resolve({ env });
    const { internalToken } = core;
    const tls = tlsMaterialOf(core.tlsDir, { reloadS: core.tlsReloadS });
    drainS = core.drainS;
    tracing = await startTracing({ service: "airm-gateway", env, attributes: { "airm.role": "gateway" }, options: { tracesEndpoint: f.otlpTracesEndpoint } });
    gw = await startGateway({
      ...cfg,
      internalToken,
      tls,
      port: f.port,
      host: f.host,
      prefill: f.prefill,
      decode: f.decode,
      solo: f.solo,
      prefillPool,
      localPrefill: f.localPrefill,
      disaggregation: f.disaggregation,
    });
  } catch (err) {
    console.error(`airm-gateway: ${(isAirmError(err) ? err.message : (err as Error).message).replace(/^airm-gateway: /, "")}`);
    return 2;
  }
  console.log(JSON.stringify({ msg: "airm-gateway listening", url: gw.url, metrics_port: gw.metricsPort, traces: tracing.description }));
  const why = await untilStopSignal(env);
  // A signal drains first: the streams it holds end whole; a launcher that is gone leaves nobody to serve.
  if (why !== "parent exited") await gw.drain(drainS * 1000);
  await gw.close();
  await tracing.shutdown().catch(() => {});
  return 0;
}
