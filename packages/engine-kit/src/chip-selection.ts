// Decides which card a worker owns from `--chip N|-1`, the visible device nodes and the kubelet
// device-plugin checkpoint. N is an ordinal among the visible cards (rngd:2 is npu3 when npu2 is
// absent); -1 takes this pod's allocation and refuses to guess between several cards.

import { DeviceSelectionError } from "./device-errors.ts";
import { devicePrefix, discoverCards, type Vendor, type VisibleCard } from "./device-discovery.ts";
import type { DeviceConfig } from "./engine-config.ts";
import { readPodAllocations } from "./kubelet-checkpoint.ts";

/** Resource names the vendors' device plugins register. */
export const RESOURCE_PREFIXES: Record<Vendor, string[]> = {
  furiosa: ["furiosa.ai/"],
  rebellions: ["rebellions.ai/"],
};

export interface ChipSelectionOptions {
  vendor: Vendor;
  /** `--chip`: an ordinal >= 0, or -1 for "the card the device plugin gave this pod". */
  chip: number;
  /** Where cards are and how the pod's allocation is found (DEVICE_CONFIG, resolved). */
  config: DeviceConfig;
  /** Device-plugin ids the vendor library resolved (uuid/serial/bdf -> kernel index). */
  deviceIds?: Map<string, number>;
}

export interface ChipSelection {
  vendor: Vendor;
  /** Every card visible to the process, in ordinal order. */
  visible: VisibleCard[];
  /** The selected card, or null when no card of the vendor is visible. */
  card: VisibleCard | null;
  /** The selected card's position among `visible`. */
  ordinal: number | null;
  /** The runtime address, e.g. `rngd:2`, or null. */
  device: string | null;
  source: "flag" | "checkpoint" | "only-card" | "none";
  /** One line saying how the choice was made (logged at start-up, shown in /health). */
  detail: string;
}

function describe(vendor: Vendor, cards: VisibleCard[]): string {
  if (cards.length === 0) return "none";
  return cards.map((c, i) => `${c.name} (${devicePrefix(vendor)}:${i})`).join(", ");
}

/**
 * The kernel index a device-plugin id names: `npu3`, `/dev/rngd/npu3pe0-3`, `rbln3`, `3`, an id
 * the vendor library resolved, or an entry of AIRM_DEVICE_ID_MAP.
 */
function indexOfDeviceId(vendor: Vendor, id: string, mapText: string | undefined, known?: Map<string, number>): number {
  const pattern = vendor === "furiosa" ? /(?:^|\/)npu(\d+)(?:pe[\d-]+)?$/ : /(?:^|\/)rbln(\d+)$/;
  const m = pattern.exec(id) ?? /^(\d+)$/.exec(id);
  if (m) return Number(m[1]);
  const resolved = known?.get(id);
  if (resolved !== undefined) return resolved;
  if (mapText) {
    let map: unknown;
    try {
      map = JSON.parse(mapText);
    } catch {
      throw new DeviceSelectionError("UNKNOWN_DEVICE_ID", `AIRM_DEVICE_ID_MAP is not JSON; expected {"<device-plugin id>": "<npuN|rblnN|N>"}.`);
    }
    const target = (map as Record<string, unknown>)?.[id];
    if (typeof target === "string" || typeof target === "number") return indexOfDeviceId(vendor, String(target), undefined);
  }
  throw new DeviceSelectionError(
    "UNKNOWN_DEVICE_ID",
    `device-plugin id "${id}" does not name a ${vendor} card (expected ${vendor === "furiosa" ? "npuN" : "rblnN"}, a device path or an index); ` +
      `map it with AIRM_DEVICE_ID_MAP='{"${id}": "${vendor === "furiosa" ? "npu0" : "rbln0"}"}' or pass --chip N.`,
  );
}

/**
 * Picks the card for `--chip`. Throws DeviceSelectionError: BAD_CHIP (not an integer >= -1),
 * NO_SUCH_ORDINAL (N beyond the visible cards), AMBIGUOUS (-1, no allocation record, several cards),
 * ALLOCATION_NOT_VISIBLE (the record names a card this process cannot see), UNKNOWN_DEVICE_ID,
 * CHECKPOINT_UNREADABLE / CHECKPOINT_MALFORMED. With no card visible it returns `card: null`
 * (the CPU reference path) and says so in `detail`.
 */
export function selectChip(options: ChipSelectionOptions): ChipSelection {
  const { vendor, chip } = options;
  const cfg = options.config;
  if (!Number.isInteger(chip) || chip < -1) {
    throw new DeviceSelectionError("BAD_CHIP", `--chip must be an integer >= -1 (an ordinal, or -1 for the pod's allocation), got ${chip}.`);
  }
  const root = cfg.devRoot;
  const visible = discoverCards(vendor, root);
  const prefix = devicePrefix(vendor);
  const pick = (ordinal: number, source: ChipSelection["source"], detail: string): ChipSelection => ({
    vendor,
    visible,
    card: visible[ordinal],
    ordinal,
    device: `${prefix}:${ordinal}`,
    source,
    detail,
  });
  const none = (why: string): ChipSelection => ({ vendor, visible, card: null, ordinal: null, device: null, source: "none", detail: why });

  if (chip >= 0) {
    if (visible.length === 0) return none(`no ${vendor} card visible under ${root}; --chip ${chip} addresses nothing`);
    if (chip >= visible.length) {
      throw new DeviceSelectionError(
        "NO_SUCH_ORDINAL",
        `--chip ${chip} is beyond the ${visible.length} visible ${vendor} card(s): ${describe(vendor, visible)}. ` +
          `--chip takes the ordinal among visible cards, not the kernel index.`,
      );
    }
    return pick(chip, "flag", `--chip ${chip} -> ${visible[chip].name} (${prefix}:${chip})`);
  }

  // chip === -1: the pod's allocation from the kubelet checkpoint.
  const podUid = cfg.podUid;
  const file = cfg.kubeletCheckpoint;
  const allocations = podUid ? readPodAllocations(file, podUid, RESOURCE_PREFIXES[vendor]) : null;
  const ids = allocations?.flatMap((a) => a.deviceIds) ?? [];
  if (ids.length > 0) {
    const indices = [...new Set(ids.map((id) => indexOfDeviceId(vendor, id, cfg.deviceIdMap, options.deviceIds)))].sort((a, b) => a - b);
    const ordinals = indices.map((ix) => visible.findIndex((c) => c.index === ix));
    const missing = indices.filter((_, i) => ordinals[i] < 0);
    if (missing.length > 0) {
      throw new DeviceSelectionError(
        "ALLOCATION_NOT_VISIBLE",
        `the kubelet allocated ${missing.map((ix) => (vendor === "furiosa" ? `npu${ix}` : `rbln${ix}`)).join(", ")} to pod ${podUid}, ` +
          `but this process sees only: ${describe(vendor, visible)} under ${root}. Check the pod's device mounts.`,
      );
    }
    const ordinal = ordinals[0];
    const extra = indices.length > 1 ? ` (${indices.length} cards allocated; using the first)` : "";
    return pick(ordinal, "checkpoint", `--chip -1 -> ${visible[ordinal].name} (${prefix}:${ordinal}) from ${file} for pod ${podUid}${extra}`);
  }
  const why = !podUid ? "POD_UID is not set" : allocations === null ? `${file} does not exist` : `${file} has no ${vendor} record for pod ${podUid}`;
  if (visible.length === 0) return none(`--chip -1: ${why}, and no ${vendor} card is visible under ${root}`);
  if (visible.length === 1) return pick(0, "only-card", `--chip -1: ${why}; the only visible card is ${visible[0].name} (${prefix}:0)`);
  throw new DeviceSelectionError(
    "AMBIGUOUS",
    `--chip -1: ${why}, and ${visible.length} ${vendor} cards are visible (${describe(vendor, visible)}); refusing to guess. ` +
      `Mount the kubelet checkpoint and set POD_UID (the chart does both), or pass --chip N.`,
  );
}
