// `airm up --topology FILE`: the rig's topology (netns-rig.ts: hosts as network namespaces on one
// switch, links shaped) and where each part of the cluster runs in it. This file reads and checks
// the topology file, places the parts (the transport's sidecars where its package.json declares
// them), refuses what cannot work across hosts, and plans each part's process inside its host's
// namespace, bound to that host's address. up-command.ts starts the plan with the launcher.
//
// A transport's sidecar is placed by its declaration: one per cluster (the KV relay) on
// `place.relay`'s host; with `"hosts": "each"`, one per host that runs workers, beside them; when
// those hosts are more than one, its `crossHost` declaration adds variables to each of them and a
// cluster-wide sidecar of its own (e.g. the relay the NIXL agents meet in) on `place.relay`.
// A transport with a per-cluster folder (a clusterDir, such as a /dev/shm root) needs every
// worker on one host.

import { readFileSync } from "node:fs";
import { ConfigError, transportNeeds, type SidecarSpec, type TransportNeeds } from "@airm/rm-core";
import { parse as parseYaml } from "yaml";
import type { PartSpec } from "./child-part.ts";
import { workerScheme, type ClusterPlan, type ClusterShape, type WorkerSpec } from "./cluster-plan.ts";
import { DEFAULT_BACKENDS, DEFAULT_KV_TRANSPORT, DEFAULT_PORTS } from "./defaults.ts";
import { resolveTopology, type Topology } from "./netns-rig.ts";
import { binFrom, pluginRegistry } from "./package-bins.ts";
import { gatewayArgv, workerArgv } from "./rngd-pd-workload.ts";

/** The host of each part. A list places one worker on each entry (a host may repeat). */
export interface Placement {
  gateway: string;
  prefill: string | string[];
  decode: string | string[];
  /** The host of the cluster-wide sidecar (the KV relay), when the transport runs one. */
  relay?: string;
}

export interface TopologyFile extends Topology {
  place: Placement;
}

/** A topology file that is wrong; `key` names the field ("topology.place.prefill[1]"). */
export class TopologyError extends ConfigError {
  constructor(field: string, message: string) {
    super(field, message);
    this.name = "TopologyError";
  }
}

/** The transport keeps KV in a folder of one machine (a clusterDir such as /dev/shm) but the workers are on several hosts. */
export class TransportAcrossHostsError extends TopologyError {
  constructor(
    readonly transport: string,
    readonly under: string,
    hosts: string[],
    others: string[],
  ) {
    const or = others.length > 1 ? `${others.slice(0, -1).join(", ")} or ${others.at(-1)}` : (others[0] ?? "a transport without one");
    super("topology.place", `${transport} needs one ${under}: put prefill and decode on one host, or use ${or} (the workers are on ${hosts.join(", ")})`);
    this.name = "TransportAcrossHostsError";
  }
}

const TOP_KEYS = ["hosts", "link", "subnet", "place"];
const LINK_KEYS = ["rate", "burst", "latency", "mtu"];
const PLACE_KEYS = ["gateway", "prefill", "decode", "relay"];
const isObject = (v: unknown): v is Record<string, unknown> => typeof v === "object" && v !== null && !Array.isArray(v);

function checkKeys(v: Record<string, unknown>, known: string[], field: string): void {
  for (const k of Object.keys(v)) if (!known.includes(k)) throw new TopologyError(`${field}.${k}`, `unknown field (known: ${known.join(", ")})`);
}

function checkLink(v: unknown, field: string): void {
  if (!isObject(v)) throw new TopologyError(field, "must be a mapping of rate, burst, latency, mtu");
  checkKeys(v, field.endsWith("]") ? ["name", ...LINK_KEYS] : LINK_KEYS, field);
  for (const k of ["rate", "burst", "latency"])
    if (v[k] !== undefined && typeof v[k] !== "string") throw new TopologyError(`${field}.${k}`, `must be a string such as 1gbit, 256kb or 50ms`);
  if (v.mtu !== undefined && typeof v.mtu !== "number") throw new TopologyError(`${field}.mtu`, "must be a number");
}

/** Checks `place` against the hosts; throws TopologyError naming the field. */
function checkPlace(v: unknown, hosts: string[]): Placement {
  if (v === undefined) throw new TopologyError("topology.place", "missing: name the host of gateway, prefill, decode (and relay)");
  if (!isObject(v)) throw new TopologyError("topology.place", "must be a mapping of part to host");
  checkKeys(v, PLACE_KEYS, "topology.place");
  const host = (h: unknown, field: string) => {
    if (typeof h !== "string") throw new TopologyError(field, `must be a host name, got ${JSON.stringify(h)}`);
    if (!hosts.includes(h)) throw new TopologyError(field, `no host ${JSON.stringify(h)} in topology.hosts (${hosts.join(", ")})`);
    return h;
  };
  for (const part of ["gateway", "prefill", "decode"]) if (v[part] === undefined) throw new TopologyError(`topology.place.${part}`, "missing: name the host it runs on");
  for (const part of ["gateway", "relay"]) {
    if (Array.isArray(v[part])) throw new TopologyError(`topology.place.${part}`, `one host only: the cluster has one ${part}, got ${JSON.stringify(v[part])}`);
  }
  const many = (part: "prefill" | "decode") => {
    const x = v[part];
    if (!Array.isArray(x)) return host(x, `topology.place.${part}`);
    if (x.length === 0) throw new TopologyError(`topology.place.${part}`, "an empty list: name at least one host");
    return x.map((h, i) => host(h, `topology.place.${part}[${i}]`));
  };
  return {
    gateway: host(v.gateway, "topology.place.gateway"),
    prefill: many("prefill"),
    decode: many("decode"),
    ...(v.relay === undefined ? {} : { relay: host(v.relay, "topology.place.relay") }),
  };
}

/** Checks a parsed topology file strictly (unknown fields, hosts, links, placement); throws TopologyError. */
export function checkTopology(raw: unknown): TopologyFile {
  if (!isObject(raw)) throw new TopologyError("topology", "must be a mapping with hosts and place");
  checkKeys(raw, TOP_KEYS, "topology");
  if (!Array.isArray(raw.hosts)) throw new TopologyError("topology.hosts", "must be a list of host names or { name, rate, burst, latency, mtu }");
  raw.hosts.forEach((h, i) => {
    if (typeof h !== "string") checkLink(h, `topology.hosts[${i}]`);
  });
  if (raw.link !== undefined) checkLink(raw.link, "topology.link");
  if (raw.subnet !== undefined && typeof raw.subnet !== "string") throw new TopologyError("topology.subnet", "must be a string such as 10.77.0");
  const t = raw as unknown as Topology;
  try {
    resolveTopology(t);
  } catch (e) {
    const m = /^(topology[^:]*): (.*)$/s.exec((e as Error).message);
    throw m ? new TopologyError(m[1], m[2]) : new TopologyError("topology", (e as Error).message);
  }
  const names = t.hosts.map((h) => (typeof h === "string" ? h : h.name));
  return { ...t, place: checkPlace(raw.place, names) };
}

/** Reads a topology file (YAML or JSON) and checks it; throws TopologyError. */
export function readTopology(path: string): TopologyFile {
  let text: string;
  try {
    text = readFileSync(path, "utf8");
  } catch (e) {
    throw new TopologyError("--topology", `cannot read ${path}: ${(e as Error).message}`);
  }
  let raw: unknown;
  try {
    raw = parseYaml(text);
  } catch (e) {
    throw new TopologyError("--topology", `${path} is neither YAML nor JSON: ${(e as Error).message}`);
  }
  return checkTopology(raw);
}

/** What a sidecar declaration may add for a topology (see the head of this file). */
interface PlacedSidecarSpec extends SidecarSpec {
  hosts?: "each";
  crossHost?: { env?: Record<string, string>; relay?: SidecarSpec };
}

/** Where every part of the cluster runs. */
export interface PlacedCluster {
  transport: TransportNeeds;
  gateway: string;
  prefill: string[];
  decode: string[];
  /** The cluster-wide sidecar (the transport's, or its cross-host relay) and its host. */
  relay: { host: string; spec: SidecarSpec; declared: boolean } | null;
  /** The transport's per-host sidecar, the hosts it runs on, and its cross-host variables. */
  perHost: { spec: SidecarSpec; hosts: string[]; env: Record<string, string> } | null;
}

const distinct = (xs: string[]) => [...new Set(xs)];

/**
 * Places the parts of a PD cluster of `o` (its transport, its replicas) by `t.place`. Throws
 * TransportAcrossHostsError, TopologyError (a relay needed but not placed) or the registry's
 * UnknownPluginError. Nothing is started: airm up calls this before it makes the rig.
 */
export function placeCluster(t: TopologyFile, o: ClusterShape): PlacedCluster {
  const kvName = o.kvTransport ?? DEFAULT_KV_TRANSPORT;
  const transport = transportNeeds(kvName, pluginRegistry());
  const spread = (p: string | string[], n: number) => (Array.isArray(p) ? p : Array.from({ length: n }, () => p));
  const prefill = spread(t.place.prefill, o.prefill?.length ?? 1);
  const decode = spread(t.place.decode, o.decode?.length ?? 1);
  const workerHosts = distinct([...prefill, ...decode]);
  if (transport.clusterDir && workerHosts.length > 1) {
    const others = pluginRegistry()
      .list("airm.kv_transports")
      .filter((n) => n !== kvName && !transportNeeds(n, pluginRegistry()).clusterDir);
    throw new TransportAcrossHostsError(kvName, transport.clusterDir.under, workerHosts, others);
  }
  const s = transport.sidecar as PlacedSidecarSpec | null;
  const needRelay = (spec: SidecarSpec, declared: boolean) => {
    if (!t.place.relay) throw new TopologyError("topology.place.relay", `missing: the ${kvName} transport runs the ${spec.name}; name the host it runs on`);
    return { host: t.place.relay, spec, declared };
  };
  let relay: PlacedCluster["relay"] = null;
  let perHost: PlacedCluster["perHost"] = null;
  if (s && s.hosts === "each") {
    const cross = workerHosts.length > 1 ? s.crossHost : undefined;
    perHost = { spec: s, hosts: workerHosts, env: { ...cross?.env } };
    if (cross?.relay) relay = needRelay(cross.relay, false);
  } else if (s) relay = needRelay(s, true);
  return { transport, gateway: t.place.gateway, prefill, decode, relay, perHost };
}

/** The rig as the planner needs it: each host's address, and a command line run in its namespace. */
export interface RigView {
  address(host: string): string;
  argv(host: string, argv: string[]): string[];
}

/** UCX's own settings in the rig (UCX's tcp transport over the hosts' eth0), unless the environment sets them. */
export const RIG_UCX_ENV: Record<string, string> = Object.fromEntries("UCX_TLS=tcp UCX_NET_DEVICES=eth0".split(" ").map((kv) => kv.split("=")));

const fill = (template: string, vars: Record<string, string>) => template.replace(/\{(host|port|addr)\}/g, (_, k: string) => vars[k]);
const portOr = (p: number | undefined, dflt: number) => (p === undefined || p === 0 ? dflt : p);

/** A sidecar part from its declaration, on `host` at `addr`. */
function sidecarPart(spec: SidecarSpec, from: string, name: string, host: string, addr: string, env: Record<string, string>, rig: RigView): PartSpec {
  const [h, port] = [addr.slice(0, addr.lastIndexOf(":")), addr.slice(addr.lastIndexOf(":") + 1)];
  const bin = binFrom(from, spec.package ?? ".", spec.bin);
  const argv = rig.argv(host, [process.execPath, bin, ...spec.args.map((a) => fill(a, { host: h, port, addr }))]);
  return { name, argv, env, url: addr, host, ready: spec.ready === "connect" ? "connect" : { http: spec.ready.http } };
}

const filled = (env: Record<string, string>, addr: string) => {
  const i = addr.lastIndexOf(":");
  const vars = { host: addr.slice(0, i), port: addr.slice(i + 1), addr };
  return Object.fromEntries(Object.entries(env).map(([k, v]) => [k, fill(v, vars)]));
};

/**
 * Plans the placed cluster's processes, each inside its host's namespace and bound to its address.
 * In-host ports are the flags' (0: the default port, every host's namespace being empty).
 * `inherited`: the environment the parts inherit (UCX_TLS / UCX_NET_DEVICES are set only when it has none).
 */
export function planPlaced(o: ClusterShape, p: PlacedCluster, rig: RigView, launcherPid: number, inherited: Record<string, string | undefined>): ClusterPlan {
  const ip = (h: string) => rig.address(h);
  const kvName = o.kvTransport ?? DEFAULT_KV_TRANSPORT;
  // The hosts share this machine's memory: left alone UCX would move bytes through shared memory
  // between them instead of the link, which a real second host has no path for.
  const env: Record<string, string> = { ...o.env, AIRM_KV_TRANSPORT: kvName };
  for (const [k, v] of Object.entries(RIG_UCX_ENV)) if (inherited[k] === undefined) env[k] = v;
  const parts: PartSpec[] = [];
  const ports: ClusterPlan["ports"] = [];
  const bound = new Map<string, string>();
  const bind = (what: string, host: string, port: number) => {
    const key = `${host}:${port}`;
    if (bound.has(key)) throw new TopologyError("topology.place", `the ${bound.get(key)} and the ${what} both listen on port ${port} of ${host}; pick other ports`);
    bound.set(key, what);
    ports.push({ what: `${what} port on ${host}`, port });
  };
  let clusterDir: ClusterPlan["clusterDir"] = null;
  const d = p.transport.clusterDir;
  if (d) {
    clusterDir = { env: d.env, under: d.under, prefix: d.prefix, path: `${d.under}/${d.prefix}${launcherPid}` };
    env[d.env] = clusterDir.path;
  }
  if (p.relay) {
    const port = p.relay.declared ? portOr(o.sidecarPort, p.relay.spec.port) : p.relay.spec.port;
    const addr = `${ip(p.relay.host)}:${port}`;
    Object.assign(env, filled(p.relay.spec.env, addr));
    parts.push(sidecarPart(p.relay.spec, p.transport.dir!, p.relay.spec.name, p.relay.host, addr, p.relay.declared ? { ...o.sidecarEnv } : {}, rig));
    bind(p.relay.spec.name, p.relay.host, port);
  }
  const hostEnv = new Map<string, Record<string, string>>();
  if (p.perHost) {
    const { spec, hosts } = p.perHost;
    const port = portOr(o.sidecarPort, spec.port);
    for (const h of hosts) {
      const addr = `${ip(h)}:${port}`;
      const own = filled(spec.env, addr);
      hostEnv.set(h, own);
      const name = hosts.length === 1 ? spec.name : `${spec.name}-${h}`;
      parts.push(sidecarPart(spec, p.transport.dir!, name, h, addr, { ...own, ...filled(p.perHost.env, addr), ...o.sidecarEnv }, rig));
      bind(name, h, port);
    }
  }
  const urls = { prefill: [] as string[], decode: [] as string[] };
  for (const role of ["prefill", "decode"] as const) {
    const base: WorkerSpec = o[role]?.[0] ?? {};
    for (const [i, h] of p[role].entries()) {
      const w: WorkerSpec = o[role]?.[i] ?? base;
      const port = portOr(base.port, DEFAULT_PORTS[role]) + 2 * i;
      const name = i === 0 ? role : `${role}-${i + 1}`;
      const argv = rig.argv(
        h,
        workerArgv({ role, backend: w.backend ?? DEFAULT_BACKENDS[role], host: ip(h), port, maxModelLen: o.maxModelLen, batch: w.batch, threads: w.threads }),
      );
      const url = `${workerScheme(env)}://${ip(h)}:${port}`;
      const nice = w.nice === undefined ? {} : { nice: w.nice };
      parts.push({ name, argv, env: { MODEL: w.model ?? o.model, ...hostEnv.get(h), ...w.env }, url, host: h, ready: { http: "/health" }, drains: "worker", ...nice });
      bind(name, h, port);
      urls[role].push(url);
    }
  }
  const gw = p.gateway;
  const gwPort = portOr(o.port, DEFAULT_PORTS.gateway);
  const gatewayUrl = `http://${ip(gw)}:${gwPort}`;
  const genv: Record<string, string> = { ...o.gatewayEnv };
  let metricsUrl: string | null = null;
  if (o.metricsPort !== undefined) {
    const mp = portOr(o.metricsPort, 9090);
    genv.AIRM_METRICS_PORT = String(mp);
    metricsUrl = `http://${ip(gw)}:${mp}/metrics`;
    bind("gateway's metrics", gw, mp);
  }
  const argv = rig.argv(gw, gatewayArgv({ host: ip(gw), port: gwPort, prefill: urls.prefill, decode: urls.decode }));
  parts.push({ name: "gateway", argv, env: genv, url: gatewayUrl, host: gw, ready: { http: "/health" }, drains: "front" });
  bind("gateway", gw, gwPort);
  for (const part of parts) part.env = { ...env, ...part.env };
  return { parts, transport: p.transport, clusterDir, coreBoard: null, eventsDir: null, gatewayUrl, metricsUrl, ports };
}
