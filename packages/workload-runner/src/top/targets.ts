// Where `airm top` looks: the parts of a cluster (the gateway, the workers, the KV relay) with the
// URLs of their /health and /metrics, where their log lines are, and how many times each was
// restarted when the launcher or Kubernetes says. Three sources: `airm up`'s state file (the
// default), a gateway's URL (its /health lists its workers), and a Kubernetes namespace
// (k8s-source.ts). Every source says plainly what it cannot know.

import type { TlsMaterial } from "@airm/rm-core";
import { type FoundState, tailLog, type UpState } from "./up-state.ts";

export type PartKind = "gateway" | "worker" | "relay";

/** A part's recent log lines, wherever they are kept. */
export interface LogSource {
  /** Where they come from, for the log view's title. */
  where: string;
  read(lines: number): Promise<string[]>;
}

export interface Target {
  /** Unique in the view: prefill, decode-2, gateway, kv-relay; on Kubernetes pod/container. */
  name: string;
  kind: PartKind;
  /** What it was declared as (prefill, decode, solo; gateway; relay), before its /health says. */
  role: string;
  /** The URL its /health and /metrics are under (a worker's and gateway's serving URL; a relay's metrics port); null when unknown. */
  url: string | null;
  /** What a drain call goes to (a worker's serving URL), null for other parts. */
  drainUrl: string | null;
  logs: LogSource | null;
  /** Restarts as the launcher or Kubernetes counts them; null: count the ones seen (process_start_time_seconds). */
  restarts: number | null;
}

/** The parts found, and what could not be found. */
export interface Discovery {
  targets: Target[];
  notes: string[];
}

export interface Source {
  kind: "airm-up" | "gateway" | "k8s";
  /** One line: what this watches. */
  label: string;
  /** What a drain call sends (x-airm-internal-token), when known. */
  internalToken: string | undefined;
  /** The gateway's API key (AIRM_API_KEY's first), sent to gateways. */
  apiKey: string | undefined;
  /** TLS material for workers that serve mutual TLS. */
  tls: TlsMaterial | undefined;
  discover(): Promise<Discovery>;
}

/** GETs JSON (status and body; body null when it is not JSON); throws on a network error or the timeout. */
export type GetJson = (url: string, o?: { headers?: Record<string, string>; timeoutMs?: number }) => Promise<{ status: number; body: unknown }>;

/** The role of a worker the gateway lists in `roles[].role`. */
const gatewayRoles = new Set(["prefill", "decode", "solo"]);

/** A log file of airm up's (state file). */
function fileLogs(file: string): LogSource {
  return { where: file, read: async (n) => tailLog(file, n) };
}

/** The targets of an airm up state file. */
export function stateTargets(s: UpState): Target[] {
  return s.parts.map((p): Target => {
    const restarts = Math.max(0, p.starts - 1);
    const logs = fileLogs(p.log);
    if (p.role === "gateway") return { name: p.name, kind: "gateway", role: "gateway", url: p.url, drainUrl: null, logs, restarts };
    if (p.role === "sidecar") return { name: p.name, kind: "relay", role: "relay", url: p.metrics ? p.metrics.replace(/\/metrics$/, "") : null, drainUrl: null, logs, restarts };
    return { name: p.name, kind: "worker", role: p.role, url: p.url, drainUrl: p.url, logs, restarts };
  });
}

/** A source that re-reads airm up's state file (restart counts change) and lists its parts. */
export function upSource(found: FoundState, read: () => UpState | null, o: { apiKey?: string; tls?: TlsMaterial }): Source {
  const s = found.state;
  return {
    kind: "airm-up",
    label: `airm up ${s.gateway.replace(/^https?:\/\//, "")} (pid ${s.pid})`,
    internalToken: s.internalToken,
    apiKey: o.apiKey,
    tls: o.tls,
    async discover() {
      const now = read() ?? s;
      const notes = now.parts.some((p) => p.role === "sidecar" && !p.metrics) ? ["the sidecar serves no metrics page: its row shows its log only"] : [];
      return { targets: stateTargets(now), notes };
    },
  };
}

/** The workers a gateway's /health lists, named as airm up names them (prefill, decode, decode-2...). */
export function gatewayWorkers(health: unknown): Target[] {
  const roles = (health as { roles?: { role: string; endpoints: { url: string }[] }[] } | null)?.roles ?? [];
  return roles
    .filter((r) => gatewayRoles.has(r.role))
    .flatMap((r) =>
      r.endpoints.map((e, i): Target => ({ name: i === 0 ? r.role : `${r.role}-${i + 1}`, kind: "worker", role: r.role, url: e.url, drainUrl: e.url, logs: null, restarts: null })),
    );
}

/** A source of one gateway's URL: the gateway and the workers its /health lists; no logs, no relay. */
export function gatewaySource(url: string, get: GetJson, o: { apiKey?: string; internalToken?: string; tls?: TlsMaterial }): Source {
  const base = url.replace(/\/+$/, "");
  const headers: Record<string, string> = o.apiKey ? { authorization: `Bearer ${o.apiKey}` } : {};
  const gateway: Target = { name: "gateway", kind: "gateway", role: "gateway", url: base, drainUrl: null, logs: null, restarts: null };
  return {
    kind: "gateway",
    label: `gateway ${base.replace(/^https?:\/\//, "")}`,
    internalToken: o.internalToken,
    apiKey: o.apiKey,
    tls: o.tls,
    async discover() {
      const notes = ["no log lines and no KV relay from a gateway's URL alone (airm top attaches to airm up's state by default, or --k8s)"];
      try {
        const h = await get(`${base}/health`, { headers, timeoutMs: 2000 });
        return { targets: [gateway, ...gatewayWorkers(h.body)], notes };
      } catch (e) {
        return { targets: [gateway], notes: [`cannot reach the gateway at ${base}: ${(e as Error).message}`, ...notes] };
      }
    },
  };
}
