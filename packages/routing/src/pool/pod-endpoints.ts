// Pure Kubernetes mapping: an InferencePool's spec to a label selector and target ports, and a
// pod to the endpoints it serves (one per target port) when it can take traffic. No API calls.

import type { Endpoint, Role } from "./endpoint.ts";

/** The pod label that says what a pod serves (llm-d's convention; absent means "both"). */
export const ROLE_LABEL = "llm-d.ai/role";

/** The InferencePool resource as the picker reads it (inference.networking.k8s.io/v1). */
export const INFERENCE_POOL = { group: "inference.networking.k8s.io", version: "v1", plural: "inferencepools", kind: "InferencePool" } as const;

/** The parts of a v1 Pod the mapping reads (structurally compatible with @kubernetes/client-node's V1Pod). */
export interface PodLike {
  metadata?: { name?: string; labels?: Record<string, string>; deletionTimestamp?: unknown };
  status?: { phase?: string; podIP?: string; conditions?: { type: string; status: string }[] };
}

/** The parts of an InferencePool the picker reads. */
export interface PoolSpec {
  selector: Record<string, string>;
  targetPorts: number[];
}

/** An InferencePool object (as the API returns it) to its selector and ports. Throws when it has neither. */
export function poolSpecOf(pool: unknown): PoolSpec {
  const spec = (pool as { spec?: { selector?: { matchLabels?: unknown }; targetPorts?: unknown } } | null)?.spec;
  const labels = spec?.selector?.matchLabels;
  if (!labels || typeof labels !== "object" || Object.keys(labels).length === 0) throw new Error("InferencePool has no spec.selector.matchLabels");
  const ports = Array.isArray(spec?.targetPorts) ? spec.targetPorts.map((p) => Number((p as { number?: unknown })?.number)) : [];
  if (ports.length === 0 || ports.some((p) => !Number.isInteger(p) || p < 1 || p > 65535)) throw new Error("InferencePool has no valid spec.targetPorts[].number");
  return { selector: { ...(labels as Record<string, string>) }, targetPorts: ports };
}

/** matchLabels as the API's labelSelector query text ("k=v,k2=v2", keys sorted). */
export function labelSelectorText(matchLabels: Record<string, string>): string {
  return Object.keys(matchLabels)
    .sort()
    .map((k) => `${k}=${matchLabels[k]}`)
    .join(",");
}

/** The pod's role from its llm-d.ai/role label: absent is "both"; an unknown value is null (not routed to). */
export function roleOfPod(pod: PodLike): Role | null {
  const v = pod.metadata?.labels?.[ROLE_LABEL];
  if (v === undefined || v === "") return "both";
  return v === "prefill" || v === "decode" || v === "both" ? v : null;
}

/** Running, with an IP, its Ready condition True, and not being deleted. */
export function podIsServing(pod: PodLike): boolean {
  const s = pod.status;
  if (s?.phase !== "Running" || !s.podIP) return false;
  if (pod.metadata?.deletionTimestamp) return false;
  return (s.conditions ?? []).some((c) => c.type === "Ready" && c.status === "True");
}

/** The endpoints a pod serves (one per target port), or none when it is not serving or has an unknown role. */
export function podEndpoints(pod: PodLike, targetPorts: number[]): Endpoint[] {
  const role = roleOfPod(pod);
  if (!role || !podIsServing(pod)) return [];
  const name = pod.metadata?.name ?? pod.status!.podIP!;
  return targetPorts.map((port, i) => ({ address: pod.status!.podIP!, port, role, name: targetPorts.length > 1 ? `${name}-rank-${i}` : name }));
}
