// Which processes a local cluster is made of, with their command lines, environment and ports:
// the sidecar the KV transport declares (if any), the workers of each role, and the gateway. The
// transport's needs come from its package.json declaration (rm-core transportNeeds); nothing here
// names a transport or an engine except as a default.

import { readFileSync } from "node:fs";
import { createServer } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { transportNeeds, type TransportNeeds } from "@airm/rm-core";
import type { PartSpec } from "./child-part.ts";
import { DEFAULT_BACKENDS, DEFAULT_KV_TRANSPORT, DEFAULT_PORTS } from "./defaults.ts";
import { binFrom, pluginRegistry } from "./package-bins.ts";
import { gatewayArgv, workerArgv } from "./rngd-pd-workload.ts";

export interface WorkerSpec {
  /** Engine backend (default: the role's, see DEFAULT_BACKENDS). */
  backend?: string;
  /** Port (default: the role's base port + 2 per replica; 0 picks a free one). */
  port?: number;
  /** Batch width (--B): the widest decode batch; compiled buckets 1, 4, 8, 16 up to it. */
  batch?: number;
  /** CPU threads of the reference backend (--threads, 1 or 2). */
  threads?: number;
  /** With 2 threads: `when-idle` runs the second only while no other part on the cluster's core board has work (AIRM_SECOND_THREAD). */
  secondThread?: "always" | "when-idle";
  /** Scheduling niceness of the process (default: the launcher's). */
  nice?: number;
  /** Another model than the cluster's (tests of mismatches). */
  model?: string;
  env?: Record<string, string>;
}

export interface ClusterShape {
  model: string;
  /** pd (default): prefill + decode workers and KV through the transport; solo: workers that do both. */
  mode?: "pd" | "solo";
  /** An installed airm.kv_transports name (default shm). */
  kvTransport?: string;
  prefill?: WorkerSpec[];
  decode?: WorkerSpec[];
  solo?: WorkerSpec[];
  /** Start the gateway (default true). */
  gateway?: boolean;
  /**
   * PD: the decode workers prefill every request themselves (gateway and decode workers with
   * --local-prefill, no KV crosses): the "re-prefill on the decode side" baseline of a comparison.
   */
  localPrefill?: boolean;
  /** Gateway port (default 8000; 0 picks a free one). */
  port?: number;
  /** Gateway airm_* metrics port (default none; 0 picks a free one). */
  metricsPort?: number;
  /** Port of the transport's sidecar (default the one it declares; 0 picks a free one). */
  sidecarPort?: number;
  /** The longest request served (--max-model-len; default: the model's context). */
  maxModelLen?: number;
  /**
   * The workers say in one file (the core board, AIRM_CORE_BOARD) whether they have work, so that
   * a worker with secondThread when-idle takes the second core only while the others are idle.
   */
  coreBoard?: boolean;
  host?: string;
  /** Extra variables for every part, for the gateway only, and for the transport's sidecar only. */
  env?: Record<string, string>;
  gatewayEnv?: Record<string, string>;
  sidecarEnv?: Record<string, string>;
}

export interface ClusterPlan {
  parts: PartSpec[];
  transport: TransportNeeds | null;
  /** The per-cluster folder the transport keeps its data in, and the variable naming it. */
  clusterDir: { env: string; path: string; under: string; prefix: string } | null;
  /** The core board's file (removed when the cluster stops), else null. */
  coreBoard: { path: string; under: string; prefix: string } | null;
  /** The folder of the workers' KV event sockets (kvEventsDir); null when they publish none. */
  eventsDir: ReturnType<typeof kvEventsDir> | null;
  gatewayUrl: string | null;
  metricsUrl: string | null;
  /** Every port the plan binds, with what binds it (checked free before starting). */
  ports: { what: string; port: number }[];
}

/**
 * A worker's KV events (its prefix cache's stored / removed / cleared blocks, which the gateway's
 * prefix-aware routing follows) on Unix sockets of its own, private to the machine: no port to
 * choose, nothing reachable from elsewhere.
 */
export function kvEventsConfig(dir: string, name: string): string {
  const at = (what: string) => `ipc://${join(dir, `${name}-${what}.sock`)}`;
  return JSON.stringify({ enable_kv_cache_events: true, publisher: "zmq", endpoint: at("pub"), replay_endpoint: at("replay"), topic: `kv@${name}` });
}

/** Linux's range of ephemeral ports (the local ports of outgoing connections and of listen(0)). */
function ephemeralRange(): [number, number] {
  try {
    const [lo, hi] = readFileSync("/proc/sys/net/ipv4/ip_local_port_range", "utf8").trim().split(/\s+/).map(Number);
    if (Number.isInteger(lo) && Number.isInteger(hi) && lo <= hi) return [lo, hi];
  } catch {
    // not Linux: the IANA range
  }
  return [49152, 65535];
}

/** Whether `port` on `host` can be bound right now (bound and released). */
function bindable(port: number, host: string): Promise<boolean> {
  return new Promise((resolve) => {
    const s = createServer();
    s.once("error", () => resolve(false));
    s.listen(port, host, () => s.close(() => resolve(true)));
  });
}

/**
 * A free TCP port on `host` (bound and released), chosen at random below the ephemeral range: a
 * part binds it only after it has loaded its model, and an ephemeral port may meanwhile become
 * the local end of an outgoing connection (a health probe, a UCX wire-up) and make that bind fail
 * with EADDRINUSE. Falls back to a port from listen(0) when none of those is free.
 */
export async function freePort(host = "127.0.0.1"): Promise<number> {
  const [lo] = ephemeralRange();
  const first = 10_000;
  if (lo - first >= 1000) {
    for (let i = 0; i < 64; i++) {
      const port = first + Math.floor(Math.random() * (lo - first));
      if (await bindable(port, host)) return port;
    }
  }
  return new Promise((resolve, reject) => {
    const s = createServer();
    s.once("error", reject);
    s.listen(0, host, () => {
      const { port } = s.address() as { port: number };
      s.close(() => resolve(port));
    });
  });
}

/** The core board's file name in the temp folder, before the launcher's pid. */
export const CORE_BOARD_PREFIX = "airm-cores-";

/**
 * Where a cluster's KV event sockets go: `<tmp>/airm-kvev-<launcher pid>/<n>`, the n-th cluster
 * this launcher planned. The cluster's folder goes when it stops (its launcher's when empty); a
 * killed launcher's is swept by the next.
 */
export const KV_EVENTS_PREFIX = "airm-kvev-";
let clustersPlanned = 0;
export function kvEventsDir(launcherPid: number, n = ++clustersPlanned): { path: string; launcherDir: string; under: string; prefix: string } {
  const launcherDir = join(tmpdir(), `${KV_EVENTS_PREFIX}${launcherPid}`);
  return { under: tmpdir(), prefix: KV_EVENTS_PREFIX, launcherDir, path: join(launcherDir, String(n)) };
}

/** The scheme of the workers' URLs: https when the parts are given a TLS folder (AIRM_TLS_DIR in the cluster's env), else http. */
export function workerScheme(env: Record<string, string | undefined> | undefined): "https" | "http" {
  return env?.AIRM_TLS_DIR ? "https" : "http";
}

const fill = (template: string, vars: Record<string, string>) => template.replace(/\{(host|port|addr)\}/g, (_, k: string) => vars[k]);

/**
 * Plans the cluster's processes. `launcherPid` names the cluster folder. Throws UnknownPluginError
 * for a transport that is not installed, ConfigError for a bad declaration or backend.
 */
export async function planCluster(o: ClusterShape, launcherPid: number): Promise<ClusterPlan> {
  const host = o.host ?? "127.0.0.1";
  const mode = o.mode ?? "pd";
  const portOf = async (p: number | undefined, dflt: number) => (p === 0 ? freePort(host) : (p ?? dflt));
  const env: Record<string, string> = { ...o.env };
  const parts: PartSpec[] = [];
  const ports: ClusterPlan["ports"] = [];
  let transport: TransportNeeds | null = null;
  let clusterDir: ClusterPlan["clusterDir"] = null;
  const kvName = o.kvTransport ?? DEFAULT_KV_TRANSPORT;
  if (mode === "pd") {
    transport = transportNeeds(kvName, pluginRegistry());
    env.AIRM_KV_TRANSPORT = kvName;
    if (transport.clusterDir) {
      const d = transport.clusterDir;
      clusterDir = { env: d.env, under: d.under, prefix: d.prefix, path: `${d.under}/${d.prefix}${launcherPid}` };
      env[d.env] = clusterDir.path;
    }
    const s = transport.sidecar;
    if (s) {
      const port = await portOf(o.sidecarPort, s.port);
      const vars = { host, port: String(port), addr: `${host}:${port}` };
      for (const [k, v] of Object.entries(s.env)) env[k] = fill(v, vars);
      const bin = binFrom(transport.dir!, s.package ?? ".", s.bin);
      parts.push({
        name: s.name,
        argv: [process.execPath, bin, ...s.args.map((a) => fill(a, vars))],
        env: { ...o.sidecarEnv },
        url: vars.addr,
        ready: s.ready === "connect" ? "connect" : { http: s.ready.http },
      });
      ports.push({ what: `${s.name} port`, port });
    }
  }
  const eventsDir = kvEventsDir(launcherPid);
  const coreBoard = o.coreBoard ? { under: tmpdir(), prefix: CORE_BOARD_PREFIX, path: join(tmpdir(), `${CORE_BOARD_PREFIX}${launcherPid}`) } : null;
  let slot = 0;
  const workerUrls: Record<string, string[]> = { prefill: [], decode: [], solo: [] };
  const roles = mode === "pd" ? (["prefill", "decode"] as const) : (["solo"] as const);
  for (const role of roles) {
    const specs = o[role] ?? [{}];
    for (const [i, w] of specs.entries()) {
      const port = await portOf(w.port, DEFAULT_PORTS[role] + 2 * i);
      const name = i === 0 ? role : `${role}-${i + 1}`;
      const localPrefill = role === "decode" && o.localPrefill === true;
      const argv = workerArgv({ role, backend: w.backend ?? DEFAULT_BACKENDS[role], host, port, maxModelLen: o.maxModelLen, batch: w.batch, threads: w.threads, localPrefill });
      const url = `${workerScheme(env)}://${host}:${port}`;
      const cores: Record<string, string> = coreBoard ? { AIRM_CORE_BOARD: `${coreBoard.path}:${slot++}` } : {};
      if (w.secondThread) cores.AIRM_SECOND_THREAD = w.secondThread;
      parts.push({
        name,
        argv,
        env: { MODEL: w.model ?? o.model, ...cores, AIRM_KV_EVENTS_CONFIG: kvEventsConfig(eventsDir.path, name), ...w.env },
        url,
        ready: { http: "/health" },
        drains: "worker",
        ...(w.nice === undefined ? {} : { nice: w.nice }),
      });
      ports.push({ what: `${name} port`, port });
      workerUrls[role].push(url);
    }
  }
  let gatewayUrl: string | null = null;
  let metricsUrl: string | null = null;
  if (o.gateway ?? true) {
    const port = await portOf(o.port, DEFAULT_PORTS.gateway);
    const metricsPort = o.metricsPort === undefined ? undefined : await portOf(o.metricsPort, 0);
    const argv = gatewayArgv({ host, port, prefill: workerUrls.prefill, decode: workerUrls.decode, solo: workerUrls.solo, localPrefill: mode === "pd" && o.localPrefill === true });
    gatewayUrl = `http://${host}:${port}`;
    const genv: Record<string, string> = { ...o.gatewayEnv };
    if (metricsPort !== undefined) {
      genv.AIRM_METRICS_PORT = String(metricsPort);
      metricsUrl = `http://${host}:${metricsPort}/metrics`;
      ports.push({ what: "--metrics-port", port: metricsPort });
    }
    parts.push({ name: "gateway", argv, env: genv, url: gatewayUrl, ready: { http: "/health" }, drains: "front" });
    ports.push({ what: "--port", port });
  }
  for (const p of parts) p.env = { ...env, ...p.env };
  return { parts, transport, clusterDir, coreBoard, eventsDir, gatewayUrl, metricsUrl, ports };
}
