// The one launcher of local clusters (`airm up`, the end-to-end tests and the benches): plans the
// processes (cluster-plan.ts), gives them one internal token (and, with TLS, one TLS folder: a
// throwaway CA's or AIRM_TLS_DIR), checks their ports, creates the transport's cluster folder,
// starts every part through the supervisor (supervisor.ts: restart, stop everything, or leave
// alone when one dies), and waits until each is healthy. Stopping removes the cluster folder and
// a throwaway CA's TLS folder.

import { existsSync, mkdirSync, mkdtempSync, readdirSync, rmdirSync, rmSync } from "node:fs";
import { connect } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fetchVia } from "@airm/internal-api";
import { ConfigError, loadTlsDir, makeTlsDir, newInternalToken, RM_CORE_CONFIG, type TlsMaterial } from "@airm/rm-core";
import type { ChildPart } from "./child-part.ts";
import { planCluster, type ClusterPlan, type ClusterShape } from "./cluster-plan.ts";
import { RESTART_POLICY, Supervisor, type OnPartExit, type RestartPolicy } from "./supervisor.ts";

export interface ClusterOptions extends ClusterShape {
  /** How long to wait for every part to become healthy (ms, default 300000). */
  readyTimeoutMs?: number;
  /**
   * What a part's death does: restart it with backoff (airm up; the cluster stops once a part died
   * `restart.maxDeaths` times within `restart.windowMs`), stop the whole cluster (default), or nothing.
   */
  onPartExit?: OnPartExit;
  /** The restart policy of onPartExit "restart" (defaults: RESTART_POLICY). */
  restart?: Partial<RestartPolicy>;
  /** The environment parts inherit (default this process's). */
  baseEnv?: Record<string, string | undefined>;
  /** Lines of the launcher's own narration. */
  log?(line: string): void;
  /** Each output line of a part. */
  childLog?(part: string, line: string): void;
  /** Told each time a part's process is started, the first time and at each restart (airm up's state file counts them). */
  onPartStart?(part: string): void;
  /**
   * Aborting it while the cluster starts stops every part started so far, removes the cluster's
   * folder, and rejects with StartAbortedError (airm up's Ctrl-C before it is up).
   */
  abort?: AbortSignal;
  /**
   * Mutual TLS between the parts (airm up --tls): a throwaway CA issues one certificate for every
   * part into a folder of this launcher's (removed when the cluster stops) and AIRM_TLS_DIR names
   * it. An AIRM_TLS_DIR already set (in `env` or the inherited environment) is used instead, with
   * or without this.
   */
  tls?: boolean;
  /** Plans the processes instead of planCluster (airm up --topology: each part in a host of the rig). */
  planner?(shape: ClusterShape, launcherPid: number): Promise<ClusterPlan>;
  /**
   * How this process reaches parts that are not on its own loopback (airm up --topology): the
   * readiness probes, the gateway's health and the returned URLs go through it; the ports are
   * then not checked here (they are in other namespaces).
   */
  reach?: PartReach;
}

/** Reaches parts in other network namespaces (ns-bridge.ts). */
export interface PartReach {
  /** A URL of this process's loopback that reaches the part's `url`. */
  http(url: string): Promise<string>;
  /** Whether the part's `hostPort` accepts a TCP connection where it runs. */
  connect(hostPort: string): Promise<boolean>;
}

/** startLocalCluster was aborted (ClusterOptions.abort) before the cluster was up; everything it started is stopped. */
export class StartAbortedError extends Error {
  constructor(reason: string) {
    super(`the cluster was stopped while it started (${reason})`);
    this.name = "StartAbortedError";
  }
}

export interface RunningCluster {
  /** The gateway's URL ("" without a gateway). */
  url: string;
  metricsUrl: string | null;
  /** The transport's per-cluster folder (e.g. the shm root), if it declares one. */
  clusterDir: string | null;
  plan: ClusterPlan;
  /** The internal token every part was given (AIRM_INTERNAL_TOKEN): what a direct call of a worker's /internal/* route sends. */
  internalToken: string;
  /** The TLS material every part was given (AIRM_TLS_DIR), null without TLS: what a direct call of a worker presents. */
  tls: TlsMaterial | null;
  parts: ChildPart[];
  /** The part named `name` ("prefill", "decode-2", "gateway", "kv-relay"...). Throws when absent. */
  part(name: string): ChildPart;
  /** Resolves with the exit code once the cluster has stopped (stopped: 0, a part died: 1). */
  done: Promise<number>;
  stop(reason?: string): Promise<void>;
}

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

function tcpOpen(hostPort: string): Promise<boolean> {
  const i = hostPort.lastIndexOf(":");
  return new Promise((resolve) => {
    const s = connect(Number(hostPort.slice(i + 1)), hostPort.slice(0, i).replace(/^\[|\]$/g, ""));
    s.once("connect", () => {
      s.destroy();
      resolve(true);
    });
    s.once("error", () => resolve(false));
  });
}

/** The key a client of the gateway sends: the first of AIRM_API_KEY's comma-separated keys (undefined without one). */
export function firstApiKey(keys: string | undefined): string | undefined {
  return keys?.split(",")[0]?.trim() || undefined;
}

/** The headers a readiness probe of a part sends: the first of its API keys when it has some (AIRM_API_KEY). */
function probeHeaders(env: Record<string, string | undefined>): Record<string, string> {
  const key = firstApiKey(env.AIRM_API_KEY);
  return key ? { authorization: `Bearer ${key}` } : {};
}

/** Whether part `p` is ready; a worker serving TLS is asked over mutual TLS with `tls`. */
async function healthy(p: ChildPart, env: Record<string, string | undefined>, reach?: PartReach, tls?: TlsMaterial): Promise<boolean> {
  const r = p.spec.ready;
  if (r === "connect") return reach ? reach.connect(p.url) : tcpOpen(p.url);
  const url = /^https?:\/\//.test(p.url) ? p.url : `http://${p.url}`;
  const base = reach ? await reach.http(url) : url;
  const via = url.startsWith("https:") ? fetchVia(tls) : {};
  try {
    return (await fetch(`${base}${r.http}`, { signal: AbortSignal.timeout(2000), headers: probeHeaders({ ...env, ...p.spec.env }), ...via })).status === 200;
  } catch {
    return false;
  }
}

/** A launcher's TLS folders are under `<tmp>/<prefix><pid>`, one per cluster. */
export const TLS_DIR_PREFIX = "airm-tls-";

/** The cluster's TLS folder and material, and how it goes when the cluster stops (a throwaway CA's is removed). */
interface ClusterTls {
  dir: string;
  material: TlsMaterial;
  remove(): void;
}

/**
 * The TLS of a cluster: AIRM_TLS_DIR when it is set (checked now: a missing file stops the start
 * with its name), else with `o.tls` a throwaway CA's folder made now, else none.
 */
function clusterTls(o: ClusterOptions, inherited: Record<string, string | undefined>, log: (line: string) => void): ClusterTls | null {
  const given = o.env?.AIRM_TLS_DIR || inherited.AIRM_TLS_DIR;
  if (given) {
    const material = loadTlsDir(given);
    log(`airm up: the parts talk mutual TLS with the certificates in ${given} (AIRM_TLS_DIR)`);
    // the launcher's probes follow renewed files as the parts do (AIRM_TLS_RELOAD_S)
    const reloadS = RM_CORE_CONFIG.resolve({ env: { ...inherited, ...o.env } }).tlsReloadS;
    const stop = reloadS > 0 ? material.watch(reloadS * 1000, (e) => log(`airm up: ${e.message}; the certificates loaded before stay in force`)) : () => {};
    return { dir: given, material, remove: stop };
  }
  if (!o.tls) return null;
  for (const d of sweepStaleClusterDirs(tmpdir(), TLS_DIR_PREFIX)) log(`airm up: removed ${d}, left by an earlier launcher that was killed`);
  const parent = join(tmpdir(), `${TLS_DIR_PREFIX}${process.pid}`);
  mkdirSync(parent, { recursive: true, mode: 0o700 });
  const dir = makeTlsDir(mkdtempSync(join(parent, "cluster-")), { hosts: o.host ? [o.host] : [] });
  log(`airm up: the parts talk mutual TLS: a throwaway CA issued their certificate in ${dir} (removed when the cluster stops)`);
  const remove = () => {
    rmSync(dir, { recursive: true, force: true });
    try {
      rmdirSync(parent); // the last cluster of this launcher
    } catch {
      // another cluster of this process still has its folder there
    }
  };
  try {
    return { dir, material: loadTlsDir(dir), remove };
  } catch (e) {
    remove();
    throw e;
  }
}

/**
 * Makes the folder of the workers' KV event sockets, a cluster's own, after sweeping what killed
 * launchers left; `remove` takes it away (and its launcher's folder once empty) when the cluster stops.
 */
function openEventsDir(events: ClusterPlan["eventsDir"]): { remove(): void } {
  if (!events) return { remove() {} };
  sweepStaleClusterDirs(events.under, events.prefix);
  sweepLooseSockets(events.under, events.prefix);
  mkdirSync(events.path, { recursive: true, mode: 0o700 });
  return {
    remove() {
      rmSync(events.path, { recursive: true, force: true });
      removeIfEmpty(events.launcherDir);
    },
  };
}

/**
 * Removes the KV event sockets that launchers before this layout left loose in `under`
 * (`<prefix><pid>-<part>-<pub|replay>.sock`, never removed) once their launcher is gone.
 */
function sweepLooseSockets(under: string, prefix: string): void {
  let names: string[] = [];
  try {
    names = readdirSync(under);
  } catch {
    return;
  }
  for (const name of names) {
    const pid = name.startsWith(prefix) && name.endsWith(".sock") ? /^(\d+)-/.exec(name.slice(prefix.length))?.[1] : undefined;
    if (pid === undefined || isAlive(Number(pid))) continue;
    rmSync(join(under, name), { force: true });
  }
}

/** Whether process `pid` runs (one of another user counts as running). */
function isAlive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch (e) {
    return (e as NodeJS.ErrnoException).code !== "ESRCH";
  }
}

/** Removes `dir` when nothing is left in it (another cluster of the same launcher may still use it). */
function removeIfEmpty(dir: string): void {
  try {
    rmdirSync(dir);
  } catch {
    // not empty, or gone already
  }
}

/** Removes `<under>/<prefix><pid>` folders whose launcher process is gone (killed without cleaning up). */
export function sweepStaleClusterDirs(under: string, prefix: string): string[] {
  const removed: string[] = [];
  let names: string[] = [];
  try {
    names = readdirSync(under);
  } catch {
    return removed;
  }
  for (const name of names) {
    if (!name.startsWith(prefix) || !/^\d+$/.test(name.slice(prefix.length))) continue;
    try {
      process.kill(Number(name.slice(prefix.length)), 0);
      continue; // still running
    } catch (e) {
      if ((e as NodeJS.ErrnoException).code !== "ESRCH") continue; // alive but not ours
    }
    rmSync(join(under, name), { recursive: true, force: true });
    removed.push(join(under, name));
  }
  return removed;
}

/** Waits until the gateway's /health reports every worker healthy (it probes them on its own period). */
/** Waits until the gateway reports every worker healthy; returns early (false) once `abort` fires. */
async function gatewaySeesAll(url: string, deadline: number, headers: Record<string, string>, abort?: AbortSignal): Promise<boolean> {
  for (;;) {
    if (abort?.aborted) return false;
    try {
      const signal = abort ? AbortSignal.any([abort, AbortSignal.timeout(2000)]) : AbortSignal.timeout(2000);
      const h = (await (await fetch(`${url}/health`, { signal, headers })).json()) as { roles?: { endpoints: { healthy: boolean }[] }[] };
      if (h.roles?.every((r) => r.endpoints.every((e) => e.healthy))) return true;
    } catch {
      // not answering yet
    }
    if (Date.now() > deadline) throw new Error(`the gateway at ${url} did not see every worker healthy in time`);
    await sleep(50);
  }
}

async function checkPorts(plan: ClusterPlan): Promise<void> {
  for (const { what, port } of plan.ports) {
    if (await tcpOpen(`127.0.0.1:${port}`)) throw new ConfigError(what, `127.0.0.1:${port} is already in use; stop what listens there or pick another port`);
  }
}

/** Starts the cluster; resolves once every part is healthy (or rejects with the reason). */
export async function startLocalCluster(o: ClusterOptions): Promise<RunningCluster> {
  const log = o.log ?? (() => {});
  const inherited = o.baseEnv ?? process.env;
  // The parts share one internal token (AIRM_INTERNAL_TOKEN): the one given, else a fresh one, so
  // nothing else on the host can call the workers' internal routes or the relay.
  const internalToken = o.env?.AIRM_INTERNAL_TOKEN || inherited.AIRM_INTERNAL_TOKEN || newInternalToken();
  const tls = clusterTls(o, inherited, log);
  const tlsEnv: Record<string, string> = tls ? { AIRM_TLS_DIR: tls.dir } : {};
  let plan: ClusterPlan;
  try {
    plan = await (o.planner ?? planCluster)({ ...o, env: { ...o.env, AIRM_INTERNAL_TOKEN: internalToken, ...tlsEnv } }, process.pid);
    if (!o.reach) await checkPorts(plan);
  } catch (e) {
    tls?.remove();
    throw e;
  }
  const dir = plan.clusterDir;
  if (dir) {
    for (const d of sweepStaleClusterDirs(dir.under, dir.prefix)) log(`airm up: removed ${d}, left by an earlier launcher that was killed`);
    mkdirSync(dir.path, { recursive: true });
  }
  const board = plan.coreBoard;
  if (board) sweepStaleClusterDirs(board.under, board.prefix);
  const events = openEventsDir(plan.eventsDir);
  // every part stops by itself if this process dies without stopping it (e.g. SIGKILL)
  const baseEnv = { ...inherited, AIRM_PARENT_PID: String(process.pid) };
  const sup = new Supervisor({
    specs: plan.parts,
    env: baseEnv,
    onPartExit: o.onPartExit ?? "stop-all",
    policy: { ...RESTART_POLICY, ...o.restart },
    log,
    childLog: o.childLog ?? (() => {}),
    probe: (p) => healthy(p, baseEnv, o.reach, tls?.material),
    onLaunch: o.onPartStart,
    afterStop: () => {
      if (dir && existsSync(dir.path)) rmSync(dir.path, { recursive: true, force: true });
      if (board) rmSync(board.path, { force: true });
      events.remove();
      tls?.remove();
    },
  });
  const parts = sup.parts;
  const stop = (reason?: string) => sup.stop(reason);
  const aborted = async (): Promise<never> => {
    await stop();
    throw new StartAbortedError(String(o.abort?.reason ?? "aborted"));
  };

  const deadline = Date.now() + (o.readyTimeoutMs ?? 300_000);
  const pending = new Set(parts);
  while (pending.size > 0) {
    if (o.abort?.aborted) await aborted();
    const dead = [...pending].find((p) => !p.alive);
    // A part stopped by SIGINT / SIGTERM while starting: the signal went to the whole process
    // group (Ctrl-C, a supervisor, a container runtime), and it is on its way to this process too.
    if (dead?.stoppedBySignal && !sup.isStopping) {
      await stop();
      throw new StartAbortedError(`the ${dead.name} ${dead.howItEnded} while starting (a signal to the process group)`);
    }
    if (sup.isStopping || dead) {
      await stop();
      const why = dead ? `the ${dead.name} ${dead.howItEnded} before it was healthy:\n${dead.logs(40)}` : "see the output above";
      throw new Error(`the cluster did not come up: ${why}`);
    }
    if (Date.now() > deadline) {
      const names = [...pending].map((p) => p.name).join(", ");
      await stop();
      throw new Error(`not healthy within ${o.readyTimeoutMs ?? 300_000} ms: ${names}`);
    }
    for (const p of [...pending]) {
      if (o.abort?.aborted) break;
      if (await healthy(p, baseEnv, o.reach, tls?.material)) {
        pending.delete(p);
        log(`airm up: ${p.name} is healthy`);
      }
    }
    if (pending.size) await sleep(100);
  }
  if (plan.gatewayUrl) {
    try {
      const gw = parts.find((x) => x.spec.url === plan.gatewayUrl || x.name === "gateway");
      const url = o.reach ? await o.reach.http(plan.gatewayUrl) : plan.gatewayUrl;
      await gatewaySeesAll(url, deadline, probeHeaders({ ...baseEnv, ...gw?.spec.env }), o.abort);
    } catch (e) {
      await stop();
      throw e;
    }
  }
  if (o.abort?.aborted) await aborted();
  sup.markUp();
  // A part that died between its health check and now: its exit was left to the start-up loop.
  const dead = parts.find((p) => !p.alive);
  if (dead) {
    await stop();
    throw new Error(`the cluster did not come up: the ${dead.name} ${dead.howItEnded}:\n${dead.logs(40)}`);
  }
  const reached = async (url: string | null) => (url && o.reach ? o.reach.http(url) : url);
  return {
    url: (await reached(plan.gatewayUrl)) ?? "",
    metricsUrl: await reached(plan.metricsUrl),
    clusterDir: dir?.path ?? null,
    plan,
    internalToken,
    tls: tls?.material ?? null,
    parts,
    part(name) {
      const p = parts.find((x) => x.name === name);
      if (!p) throw new Error(`no part named ${name}; the cluster has ${parts.map((x) => x.name).join(", ")}`);
      return p;
    },
    done: sup.done,
    stop: (reason) => sup.stop(reason),
  };
}
