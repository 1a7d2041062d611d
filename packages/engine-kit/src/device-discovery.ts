// Finds the NPU cards this process can see by their device nodes: FuriosaAI RNGD cards appear as
// /dev/rngd/npu<N>{mgmt,pe<k>,pe<a>-<b>,bar4...}, Rebellions ATOM cards as /dev/rbln<N> (/dev/rsd<N>
// is a system node, not a card). Knows nothing about which card a pod owns (chip-selection.ts).

import { readdirSync } from "node:fs";
import { join } from "node:path";

export type Vendor = "furiosa" | "rebellions";

/** One visible card: its kernel index (npu3 -> 3) and the device nodes that belong to it. */
export interface VisibleCard {
  /** Kernel index from the node name; not the ordinal (cards may be missing in between). */
  index: number;
  /** `npu3` (RNGD) or `rbln3` (ATOM). */
  name: string;
  /** Absolute node paths under the device root. */
  nodes: string[];
}

/** The address prefix the runtime uses for a card ordinal: `rngd:2`, `rbln:0`. */
export function devicePrefix(vendor: Vendor): string {
  return vendor === "furiosa" ? "rngd" : "rbln";
}

function listDir(dir: string): string[] {
  try {
    return readdirSync(dir);
  } catch {
    return []; // no such folder: no cards of this vendor
  }
}

/**
 * The cards of `vendor` visible under `root`, sorted by kernel index. The position of a card in
 * this list is its ordinal (what `--chip N` and the runtimes address). Never throws: an absent
 * or unreadable folder means no cards.
 */
export function discoverCards(vendor: Vendor, root: string): VisibleCard[] {
  const byIndex = new Map<number, VisibleCard>();
  const add = (index: number, name: string, node: string): void => {
    let card = byIndex.get(index);
    if (!card) byIndex.set(index, (card = { index, name, nodes: [] }));
    card.nodes.push(node);
  };
  if (vendor === "furiosa") {
    const dir = join(root, "rngd");
    for (const entry of listDir(dir)) {
      const m = /^npu(\d+)(?:mgmt|pe\d+(?:-\d+)?|bar\d+|ctrl|dma)?$/.exec(entry);
      if (m) add(Number(m[1]), `npu${m[1]}`, join(dir, entry));
    }
  } else {
    for (const entry of listDir(root)) {
      const m = /^rbln(\d+)$/.exec(entry);
      if (m) add(Number(m[1]), `rbln${m[1]}`, join(root, entry));
    }
  }
  const cards = [...byIndex.values()].sort((a, b) => a.index - b.index);
  for (const c of cards) c.nodes.sort();
  return cards;
}
