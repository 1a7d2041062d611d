// The llm-d data path's stock parts on the rig: the Gateway API Inference Extension's endpoint
// picker (GIE EPP v1.5.0, built by build-llmd.sh) and Envoy 1.40.0 with the ext_proc filter and an
// ORIGINAL_DST cluster keyed on the picker's x-gateway-destination-endpoint header, as an llm-d
// Gateway configures them. The stock EPP binds every interface (it has no address flag): run it
// only inside a network namespace of the test's own (test.sh does). Each process dies with the
// process that started it, and is SIGKILLed when a signal stops that one (../rig-cleanup.ts).
import { type ChildProcess, execFileSync, spawn } from "node:child_process";
import { readdirSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { diesWithParent, killOnInterrupt } from "../rig-cleanup.ts";
import { type PodAt, type Release, tcpOpen } from "./release.ts";
import type { Rig } from "./rig.ts";

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

/** The folder build-llmd.sh built into (builds it when missing: ~3 min cold). */
export function llmdBinaries(): string {
  return execFileSync("bash", [join(import.meta.dirname, "build-llmd.sh")], { encoding: "utf8", stdio: ["ignore", "pipe", "inherit"] }).trim();
}

/** Applies the InferencePool CRD (and the other GIE CRDs) and waits for them to be served. */
export function applyGieCrds(rig: Rig, bin: string): void {
  for (const f of readdirSync(join(bin, "crd")).filter((x) => x.endsWith(".yaml"))) rig.kubectl(["apply", "--server-side", "-f", join(bin, "crd", f)]);
  rig.kubectl(["wait", "--for=condition=Established", "crd", "--all", "--timeout=60s"]);
}

export interface Proc {
  child: ChildProcess;
  log: string[];
  stop(): Promise<void>;
}

function run(exe: string, args: string[], env: Record<string, string>, cwd: string): Proc {
  const child = killOnInterrupt(spawn(...diesWithParent([exe, ...args]), { cwd, stdio: ["ignore", "pipe", "pipe"], env: { ...process.env, ...env } }));
  const log: string[] = [];
  const keep = (b: Buffer) => {
    log.push(b.toString());
    if (log.length > 400) log.splice(0, log.length - 400);
  };
  child.stdout!.on("data", keep);
  child.stderr!.on("data", keep);
  return {
    child,
    log,
    async stop() {
      if (child.exitCode !== null || child.signalCode !== null) return;
      const gone = new Promise((r) => child.once("exit", r));
      child.kill("SIGTERM");
      await Promise.race([gone, sleep(5000)]);
      if (child.exitCode === null && child.signalCode === null) child.kill("SIGKILL");
    },
  };
}

/** The plugins of the epplib chart's default config: queue, KV usage and prefix scorers over scraped vLLM metrics. */
const DEFAULT_PLUGINS = `apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: queue-scorer
- type: kv-cache-utilization-scorer
- type: prefix-cache-scorer
- type: lora-affinity-scorer
- type: metrics-data-source
  parameters:
    scheme: "http"
    path: "/metrics"
    insecureSkipVerify: true
- type: core-metrics-extractor
`;

/**
 * Starts the stock GIE EPP for InferencePool `pool` in `namespace` with its default plugins:
 * ext_proc on :`ports.grpc` (9002), gRPC health on :`ports.health` (9003), metrics on
 * :`ports.metrics` (9090), all interfaces (other ports when one of the pool's pods, e.g. our own
 * picker, holds those on its address). Resolves once its ext_proc port accepts connections.
 */
export async function startStockEpp(rig: Rig, bin: string, pool: string, namespace: string, ports = { grpc: 9002, health: 9003, metrics: 9090 }): Promise<Proc> {
  const config = join(rig.dir, "epp-plugins.yaml");
  writeFileSync(config, DEFAULT_PLUGINS);
  const p = run(
    join(bin, "bin", "epp"),
    [
      "--pool-name",
      pool,
      "--pool-namespace",
      namespace,
      "--config-file",
      config,
      "--grpc-port",
      String(ports.grpc),
      "--grpc-health-port",
      String(ports.health),
      "--metrics-port",
      String(ports.metrics),
      "--secure-serving=false",
      "--tracing=false",
      "--metrics-endpoint-auth=false",
      "--zap-encoder",
      "json",
      "-v",
      "2",
    ],
    { KUBECONFIG: rig.kubeconfig },
    rig.dir,
  );
  await untilListening(ports.grpc, p, "the stock EPP");
  return p;
}

async function untilListening(port: number, p: Proc, what: string, host = "127.0.0.1"): Promise<void> {
  const end = Date.now() + 60_000;
  for (;;) {
    if (await tcpOpen(host, port)) return;
    if (p.child.exitCode !== null) throw new Error(`${what} exited ${p.child.exitCode}: ${p.log.join("").slice(-3000)}`);
    if (Date.now() > end) throw new Error(`${what} did not listen on ${host}:${port} within 60 s: ${p.log.join("").slice(-3000)}`);
    await sleep(200);
  }
}

/** Envoy's bootstrap: a listener whose requests pass the ext_proc filter, then go where the picker said. */
/** Envoy's TLS to the picker's ext_proc port: the picker's certificate chain checked against `ca` (a PEM file); no client certificate, as llm-d's gateways connect. */
function pickerTls(ca: string): object {
  return {
    name: "envoy.transport_sockets.tls",
    typed_config: {
      "@type": "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext",
      common_tls_context: { alpn_protocols: ["h2"], validation_context: { trusted_ca: { filename: ca } } },
    },
  };
}

type EnvoyOptions = { port: number; adminPort: number; extProc: { host: string; port: number; tlsCa?: string } };

export function envoyConfig(o: EnvoyOptions): string {
  return JSON.stringify({
    admin: { address: { socket_address: { address: "127.0.0.1", port_value: o.adminPort } } },
    static_resources: {
      listeners: [
        {
          name: "inference",
          address: { socket_address: { address: "127.0.0.1", port_value: o.port } },
          filter_chains: [
            {
              filters: [
                {
                  name: "envoy.filters.network.http_connection_manager",
                  typed_config: {
                    "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
                    stat_prefix: "inference",
                    route_config: {
                      virtual_hosts: [{ name: "all", domains: ["*"], routes: [{ match: { prefix: "/" }, route: { cluster: "pods", timeout: "0s", idle_timeout: "300s" } }] }],
                    },
                    http_filters: [
                      {
                        name: "envoy.filters.http.ext_proc",
                        typed_config: {
                          "@type": "type.googleapis.com/envoy.extensions.filters.http.ext_proc.v3.ExternalProcessor",
                          grpc_service: { envoy_grpc: { cluster_name: "ext_proc" }, timeout: "10s" },
                          processing_mode: {
                            request_header_mode: "SEND",
                            response_header_mode: "SEND",
                            request_body_mode: "FULL_DUPLEX_STREAMED",
                            response_body_mode: "FULL_DUPLEX_STREAMED",
                            request_trailer_mode: "SEND",
                            response_trailer_mode: "SEND",
                          },
                          message_timeout: "1000s",
                          failure_mode_allow: false,
                          allow_mode_override: true,
                        },
                      },
                      { name: "envoy.filters.http.router", typed_config: { "@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router" } },
                    ],
                  },
                },
              ],
            },
          ],
        },
      ],
      clusters: [
        {
          name: "ext_proc",
          type: "STATIC",
          connect_timeout: "5s",
          typed_extension_protocol_options: {
            "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
              "@type": "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
              explicit_http_config: { http2_protocol_options: {} },
            },
          },
          ...(o.extProc.tlsCa ? { transport_socket: pickerTls(o.extProc.tlsCa) } : {}),
          load_assignment: {
            cluster_name: "ext_proc",
            endpoints: [{ lb_endpoints: [{ endpoint: { address: { socket_address: { address: o.extProc.host, port_value: o.extProc.port } } } }] }],
          },
        },
        {
          name: "pods",
          type: "ORIGINAL_DST",
          lb_policy: "CLUSTER_PROVIDED",
          connect_timeout: "5s",
          original_dst_lb_config: { use_http_header: true, http_header_name: "x-gateway-destination-endpoint" },
        },
      ],
    },
  });
}

/** Starts Envoy on 127.0.0.1:`port` in front of the ext_proc server at `extProc`. */
export async function startEnvoy(dir: string, bin: string, o: EnvoyOptions): Promise<Proc> {
  const config = join(dir, `envoy-${o.port}.json`);
  writeFileSync(config, envoyConfig(o));
  const p = run(join(bin, "bin", "envoy"), ["-c", config, "--disable-hot-restart", "-l", "warning", "--base-id", String(o.port)], {}, dir);
  await untilListening(o.port, p, "envoy");
  return p;
}

/**
 * Starts our picker (packages/epp's airm-epp) as a process on the loopback for InferencePool
 * `pool` in `namespace`, on its own ports (beside a stock EPP on 9002/9003/9090). Resolves once its
 * gRPC port accepts connections.
 */
export async function startOurEpp(rig: Rig, repo: string, pool: string, namespace: string, ports: { grpc: number; health: number; metrics: number }): Promise<Proc> {
  const args = ["--pool-name", pool, "--pool-namespace", namespace, "--grpc-port", ports.grpc, "--health-port", ports.health, "--metrics-port", ports.metrics].map(String);
  const p = run(process.execPath, [join(repo, "packages", "epp", "bin", "airm-epp.mjs"), ...args], { KUBECONFIG: rig.kubeconfig }, rig.dir);
  await untilListening(ports.grpc, p, "airm-epp");
  return p;
}

/**
 * Envoy on `port` in front of the release's own picker pod (epp.enabled; a new pod after each
 * upgrade), once `ready(front)` says a request passes through it. Returns Envoy, its URL and the
 * picker pod.
 */
export async function envoyToPicker(
  release: Release,
  bin: string,
  o: { port: number; adminPort: number; ready: (front: string) => Promise<boolean>; tlsCa?: string },
): Promise<{ envoy: Proc; front: string; epp: PodAt }> {
  const [epp] = await release.listening("epp", 1, 9002);
  const envoy = await startEnvoy(release.rig.dir, bin, { port: o.port, adminPort: o.adminPort, extProc: { host: epp!.ip, port: 9002, tlsCa: o.tlsCa } });
  const front = `http://127.0.0.1:${o.port}`;
  await release.until(`a request through Envoy at ${front} and the picker at ${epp!.ip}`, () => o.ready(front).catch(() => false), 60_000);
  return { envoy, front, epp: epp! };
}
