// What configures an endpoint picker (airm-epp): where its endpoints come from, its ports, how
// often it scrapes them, and what it does when it fails. Declared once; the command line's flags
// and --help are printed from these rows. Only the pool's namespace has an environment variable
// (POD_NAMESPACE, which a pod gets from the downward API); the Kubernetes client reads KUBECONFIG
// itself.

import { defineConfig, int, oneOf, opt, text } from "@airm/rm-core";
import { DISAGGREGATION_MODES, PICKER_ROUTINGS } from "./picker.ts";
import { FAILURE_MODES } from "./request-router.ts";

export const EPP_CONFIG = defineConfig("@airm/epp", {
  grpcPort: opt(int({ min: 0, max: 65535 }), { default: 9002, doc: "Port of the ext_proc gRPC server Envoy calls (also serves grpc.health.v1); 0 picks a free one." }),
  host: opt(text({ label: "address" }), {
    default: "127.0.0.1",
    doc: "Address every port binds. The loopback unless told: a pod passes 0.0.0.0 so Envoy can reach it.",
  }),
  poolName: opt(text({ label: "name" }), { doc: "Kubernetes mode: the InferencePool (inference.networking.k8s.io/v1) whose pods are the endpoints." }),
  poolNamespace: opt(text({ label: "namespace" }), { env: "POD_NAMESPACE", default: "default", doc: "Namespace of the InferencePool and its pods." }),
  poolPollMs: opt(int({ min: 100 }), { default: 1000, doc: "Kubernetes mode: how often the pool and its pods are listed, in ms." }),
  endpointsFile: opt(text({ label: "path" }), {
    doc: "Static mode: a JSON or YAML list of endpoints [{address, port, role, name}], re-read when it changes.",
  }),
  metricsPort: opt(int({ min: 0, max: 65535 }), { default: 9090, doc: "Port of the picker's own GET /metrics (Prometheus) and GET /health; 0 picks a free one." }),
  healthPort: opt(int({ min: 0, max: 65535 }), { default: 9003, doc: "A second gRPC port serving only grpc.health.v1 (GIE's 9003); 0 picks a free one." }),
  scrapeIntervalMs: opt(int({ min: 1 }), { default: 50, doc: "How often each endpoint's /metrics is scraped, in ms." }),
  staleAfterMs: opt(int({ min: 1 }), { default: 2000, doc: "An endpoint whose last good scrape is older than this (ms) is not picked; all stale answers 503." }),
  disaggregation: opt(oneOf(DISAGGREGATION_MODES), {
    default: "auto",
    doc:
      "Whether a request to a decode pod gets a prefill pod (its KV ships) or is prefilled by the decode pod itself (its gateway and worker run with --local-prefill). " +
      "auto: for decode pods that prefill locally (airm_worker_local_prefill 1), ship only when max(the prefill pod's prefill time, KV bytes / the decode pod's KV bandwidth) is under the decode pod's own prefill time, all from the pods' airm_* estimate gauges (docs/decisions.md); " +
      "always: every request gets a prefill pod; never: none does (the decode pods prefill every request: run them with --local-prefill); prompt-length: --local-prefill-max-tokens decides. " +
      "The names are shared with the gateway's --disaggregation; its header mode is the gateway's alone.",
  }),
  routing: opt(oneOf(PICKER_ROUTINGS), {
    default: "approx-prefix",
    doc: "How a pod is chosen among those of a role (names shared with the gateway's AIRM_ROUTING): approx-prefix scores load and the prompt text's first 8 blocks of 256 characters that the pod took last; prefix scores load and the prompt's KV blocks the pod's worker holds, from its KV events (--kv-events-port; the prompt tokenized by a decode pod's /tokenize, its blocks named from the pod's airm_prefix_cache_info); load scores load alone; random takes any unsaturated pod.",
  }),
  kvEventsPort: opt(int({ min: 1, max: 65535 }), {
    default: 5557,
    doc: "With --routing prefix: the port of a pod's KV events (its worker's --kv-events-config endpoint tcp://*:PORT, vLLM's default 5557), for endpoints that name none (kvEvents in an endpoints file).",
  }),
  kvReplayPort: opt(int({ min: 0, max: 65535 }), {
    default: 5558,
    doc: "With --routing prefix: the port of a pod's KV event replay socket (its replay_endpoint); 0: none (a picker that restarts then starts with an empty index).",
  }),
  localPrefillMaxTokens: opt(int({ min: 0 }), {
    default: 0,
    doc: "With --disaggregation prompt-length: prompts of at most this many tokens (estimated as characters / 4) are not disaggregated. 0: every request to a decode pod gets a prefill pod. Refused with another mode.",
  }),
  failureMode: opt(oneOf(FAILURE_MODES), {
    default: "FailClose",
    doc: "When the picker itself fails: FailOpen routes to any endpoint in turn, FailClose answers 500.",
  }),
  logLevel: opt(oneOf(["debug", "info", "warn", "error", "silent"] as const), { default: "info", doc: "Log level of the JSON logs on stderr (debug logs every pick)." }),
});
