// Reads the kubelet device-manager checkpoint (/var/lib/kubelet/device-plugins/
// kubelet_internal_checkpoint): {"Data": {"PodDeviceEntries": [{PodUID, ContainerName,
// ResourceName, DeviceIDs, AllocResp}], "RegisteredDevices": {...}}, "Checksum": n}. DeviceIDs is
// a map NUMA node -> ids in kubelets >= 1.20 and a plain list before. Knows nothing about cards.

import { readFileSync } from "node:fs";
import { DeviceSelectionError } from "./device-errors.ts";

export const DEFAULT_KUBELET_CHECKPOINT = "/var/lib/kubelet/device-plugins/kubelet_internal_checkpoint";

/** One container's allocation of one resource. */
export interface DeviceAllocation {
  podUid: string;
  containerName: string;
  resourceName: string;
  /** Device ids in NUMA-node order (then as listed). */
  deviceIds: string[];
}

function malformed(file: string, detail: string): never {
  throw new DeviceSelectionError(
    "CHECKPOINT_MALFORMED",
    `kubelet checkpoint ${file} is malformed: ${detail}. The worker does not guess a card from a damaged record; ` +
      `fix the mount (the chart mounts the kubelet's device-plugins folder read-only) or pass --chip N.`,
  );
}

function idsOf(file: string, at: string, raw: unknown): string[] {
  if (Array.isArray(raw)) {
    if (!raw.every((x) => typeof x === "string")) malformed(file, `${at}.DeviceIDs holds a non-string id`);
    return raw as string[];
  }
  if (raw && typeof raw === "object") {
    const out: string[] = [];
    const numa = Object.keys(raw).sort((a, b) => Number(a) - Number(b));
    for (const node of numa) {
      const list = (raw as Record<string, unknown>)[node];
      if (!Array.isArray(list) || !list.every((x) => typeof x === "string")) {
        malformed(file, `${at}.DeviceIDs["${node}"] is not a list of string ids`);
      }
      out.push(...(list as string[]));
    }
    return out;
  }
  if (raw === null || raw === undefined) return [];
  return malformed(file, `${at}.DeviceIDs is ${typeof raw}, expected a list or a NUMA-node map`);
}

/**
 * Every allocation recorded in the checkpoint text (`file` only names it in errors).
 * Throws DeviceSelectionError CHECKPOINT_MALFORMED for anything that is not the kubelet's shape.
 */
export function parseKubeletCheckpoint(text: string, file = "(checkpoint)"): DeviceAllocation[] {
  let doc: unknown;
  try {
    doc = JSON.parse(text);
  } catch (e) {
    return malformed(file, `not JSON (${(e as Error).message})`);
  }
  if (!doc || typeof doc !== "object" || Array.isArray(doc)) malformed(file, "top level is not an object");
  const top = doc as Record<string, unknown>;
  // Current kubelets wrap the data in "Data"; accept the bare form too.
  const data = "Data" in top ? top.Data : top;
  if (!data || typeof data !== "object" || Array.isArray(data)) malformed(file, `"Data" is not an object`);
  const entries = (data as Record<string, unknown>).PodDeviceEntries;
  if (entries === null || entries === undefined) return [];
  if (!Array.isArray(entries)) malformed(file, `"PodDeviceEntries" is not a list`);
  return (entries as unknown[]).map((raw, i) => {
    const at = `PodDeviceEntries[${i}]`;
    if (!raw || typeof raw !== "object") malformed(file, `${at} is not an object`);
    const e = raw as Record<string, unknown>;
    if (typeof e.PodUID !== "string" || e.PodUID.length === 0) malformed(file, `${at}.PodUID is missing`);
    if (typeof e.ResourceName !== "string" || e.ResourceName.length === 0) malformed(file, `${at}.ResourceName is missing`);
    return {
      podUid: e.PodUID as string,
      containerName: typeof e.ContainerName === "string" ? e.ContainerName : "",
      resourceName: e.ResourceName as string,
      deviceIds: idsOf(file, at, e.DeviceIDs),
    };
  });
}

/**
 * The allocations of pod `podUid` whose resource name starts with one of `resourcePrefixes`
 * (e.g. `furiosa.ai/`), read from `file`. Returns null when the file does not exist (no record).
 * Throws DeviceSelectionError CHECKPOINT_UNREADABLE or CHECKPOINT_MALFORMED.
 */
export function readPodAllocations(file: string, podUid: string, resourcePrefixes: string[]): DeviceAllocation[] | null {
  let text: string;
  try {
    text = readFileSync(file, "utf8");
  } catch (e) {
    const code = (e as NodeJS.ErrnoException).code;
    if (code === "ENOENT") return null;
    throw new DeviceSelectionError(
      "CHECKPOINT_UNREADABLE",
      `cannot read kubelet checkpoint ${file} (${code ?? (e as Error).message}); mount it read-only into the pod or pass --chip N.`,
      { cause: e },
    );
  }
  return parseKubeletCheckpoint(text, file).filter((a) => a.podUid === podUid && resourcePrefixes.some((p) => a.resourceName.startsWith(p)));
}
