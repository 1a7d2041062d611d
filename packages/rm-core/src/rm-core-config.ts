// What configures rm-core itself: which KV transport a host opens by default, where the registry
// looks for plugins, the deployment's shared secret and TLS folder, and the supervisor whose death
// stops a part. Hosts resolve it from their environment; docs/configuration.md lists it with every
// other package's.

import { defineConfig, opt } from "./config/config-spec.ts";
import { int, list, num, text } from "./config/value-types.ts";

/** The transport a host opens when none is named. */
export const DEFAULT_KV_TRANSPORT = "shm";

export const RM_CORE_CONFIG = defineConfig("@airm/rm-core", {
  kvTransport: opt(text({ label: "name", pattern: /^[a-z0-9][a-z0-9-]*$/, hint: "a transport name such as shm, tcp or nixl-ucx" }), {
    env: "AIRM_KV_TRANSPORT",
    default: DEFAULT_KV_TRANSPORT,
    doc: "The KV transport (airm.kv_transports plugin) the workers open; the chart's airm.kvTransport. Never falls back to another.",
  }),
  hostRoot: opt(text({ label: "path" }), {
    env: "AIRM_HOST_ROOT",
    defaultText: "the package around the working directory",
    doc: "The host package whose dependencies the plugin registry scans when the process names none (the airm-conformance CLI).",
  }),
  plugins: opt(list(text({ label: "path" }), /[,:]/), {
    env: "AIRM_PLUGINS",
    defaultText: "none",
    doc: "Extra plugin package folders, separated by ':' or ',', scanned like a host's dependencies (a plugin installed outside the workspace).",
  }),
  internalToken: opt(text({ label: "secret", pattern: /^[\x21-\x7e]{16,256}$/, hint: "16 to 256 printable ASCII characters, e.g. `openssl rand -hex 24`" }), {
    env: "AIRM_INTERNAL_TOKEN",
    defaultText: "none: internal routes and the relay accept any caller (airm up generates one for its parts)",
    doc: "Shared secret of one deployment's parts: every worker /internal/* route asks it in the x-airm-internal-token header and the KV relay in each connection's HELLO frame; the gateway and the transports send it. Refused callers get 401 (workers) or an UNAUTHORIZED frame (relay), and are counted.",
  }),
  tlsDir: opt(text({ label: "path" }), {
    env: "AIRM_TLS_DIR",
    defaultText: "none: the parts talk plain HTTP and TCP to each other",
    doc: "A folder holding tls.crt, tls.key and ca.crt (the keys cert-manager writes into a Secret mounted as a volume). When set, every worker and the KV relay serve TLS and refuse, at the handshake, a caller without a certificate issued by ca.crt (none, another CA's, an expired one); the gateway, the KV transports' relay clients and `airm up`'s probes present tls.crt and verify the server's certificate against ca.crt. The endpoint picker scrapes over mutual TLS and serves its ext_proc port over TLS; an https:// OTLP export verifies the collector with ca.crt and presents tls.crt when asked (the OTEL_EXPORTER_OTLP_* certificate variables win). Only the chain is checked, not host names: any certificate of that CA is a part of the deployment, so give the deployment a CA of its own. AIRM_INTERNAL_TOKEN is still asked. The gateway's client port, the metrics ports (a worker's --metrics-port), KV events and the UCX / NIXL / shm data paths stay plain (docs/tls.md). A missing or unreadable file stops the part at start. `airm up --tls` makes a throwaway CA and sets it.",
  }),
  tlsReloadS: opt(num({ min: 0 }), {
    env: "AIRM_TLS_RELOAD_S",
    default: 60,
    doc: "How often (seconds) a part reads AIRM_TLS_DIR again. New files that pass the start checks (in force, the key of the certificate, issued by ca.crt) are used for every handshake after: servers present the new certificate and check callers against the new ca.crt, clients open new connections with it; connections already open go on. New files that fail a check are logged and the old stay in force. cert-manager renews a Certificate before it expires and the kubelet updates the mounted Secret in place, so parts need no restart. 0 reads the folder at start only.",
  }),
  drainS: opt(num({ min: 0 }), {
    env: "AIRM_DRAIN_S",
    default: 10,
    doc: "On SIGTERM or SIGINT a worker or a gateway drains. A worker admits nothing new and reports not ready (/health 503, status draining, so gateways and endpoint pickers stop routing to it), lets its requests finish for up to this many seconds, then hands the rest back (an error event worker_draining, which a gateway migrates to another worker at the next token) and exits. A gateway reports not ready the same way, answers new requests 503 gateway_draining with Retry-After, lets the streams it holds finish for up to this many seconds, ends what is left with an error event gateway_draining, and exits. 0 ends at once. `airm up` stops its gateway first (its streams end while the workers still serve them), then its workers, waiting this long plus 5 s for each; the chart sets terminationGracePeriodSeconds to it plus 10 (plus the gateway's preStop pause).",
  }),
  parentPid: opt(int({ min: 1 }), {
    env: "AIRM_PARENT_PID",
    defaultText: "none",
    doc: "Set by `airm up` for its parts: a part stops by itself once this process is no longer its parent.",
  }),
});
