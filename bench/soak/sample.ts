// What the soak and overload benches watch in each part of a local cluster: resident memory and
// open file descriptors (from /proc), lease gauges (each worker's /health) and KV blob links under
// the shm cluster folder. Plus the cluster they run against: `airm up`'s own options on free ports.

import { existsSync, readdirSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { startUpCluster, type ClusterOptions, type RunningCluster } from "../../packages/workload-runner/src/index.ts";

export interface PartSample {
  rssKb: number;
  fds: number;
}

export interface Sample {
  t: number;
  parts: Record<string, PartSample>;
  /** KV blob links under the shm cluster folder. */
  blobs: number;
  /** Open KV leases over every worker. */
  leases: number;
}

function procSample(pid: number): PartSample {
  try {
    const rss = Number(/VmRSS:\s+(\d+)/.exec(readFileSync(`/proc/${pid}/status`, "utf8"))?.[1] ?? 0);
    return { rssKb: rss, fds: readdirSync(`/proc/${pid}/fd`).length };
  } catch {
    return { rssKb: 0, fds: 0 };
  }
}

function blobLinks(dir: string | null): number {
  const keys = dir ? join(dir, "keys") : null;
  if (!keys || !existsSync(keys)) return 0;
  let n = 0;
  for (const rid of readdirSync(keys)) {
    try {
      n += readdirSync(join(keys, rid)).length;
    } catch {
      // released meanwhile
    }
  }
  return n;
}

/** One sample of every part of `c`. */
export async function sample(c: RunningCluster, t0: number): Promise<Sample> {
  const parts: Record<string, PartSample> = {};
  for (const p of c.parts) if (p.child.pid) parts[p.name] = procSample(p.child.pid);
  let leases = 0;
  for (const p of c.parts.filter((x) => /^(prefill|decode)/.test(x.name))) {
    try {
      leases += ((await (await fetch(`${p.url}/health`, { signal: AbortSignal.timeout(5000) })).json()) as { leases: { outstanding: number } }).leases.outstanding;
    } catch {
      // a busy worker; counted at the next sample
    }
  }
  return { t: (performance.now() - t0) / 1000, parts, blobs: blobLinks(c.clusterDir), leases };
}

/**
 * `airm up` with its defaults (plus `extra` flags) on free ports, started in this process;
 * `adjust` changes the launcher's options last (a restart policy, a sidecar's variables).
 */
export function upDefaults(
  extra: string[],
  gatewayEnv: Record<string, string> = {},
  adjust?: (c: ClusterOptions) => ClusterOptions,
): Promise<{ cluster: RunningCluster; modelNote: string }> {
  return startUpCluster(extra, { env: process.env, gatewayEnv, adjust });
}

/** start / max / end of a series. */
export function span(xs: number[]): { start: number; max: number; end: number } {
  return { start: xs[0] ?? 0, max: Math.max(0, ...xs), end: xs.at(-1) ?? 0 };
}
