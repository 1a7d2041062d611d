// The seed's route table for the `nixl` transport, checked at plan(). It copies bytes between
// allocations and never converts them; a route it does not list is refused, never rerouted.

import { UnsupportedError } from "@airm/rm-core";

/** Where an allocation lives (see Allocation in proto/nixl_agent.proto). */
export type Tier = "dram" | "host" | "rngd" | "dmabuf" | "atom";
export const TIERS: readonly Tier[] = ["dram", "host", "rngd", "dmabuf", "atom"];

export interface Route {
  readonly name: string;
  /** The NIXL backend plugin that carries it. */
  readonly backend: "UCX" | "HETERO_NPU";
  readonly path: string;
}

/** The routes plan() accepts, by "src->dst". */
export const ROUTES: Readonly<Record<string, Route>> = {
  "dram->dram": { name: "dram->dram", backend: "UCX", path: "registered shared-memory arena to arena, a NIXL READ over UCX" },
  "rngd->dmabuf": { name: "rngd->dmabuf", backend: "HETERO_NPU", path: "RNGD device DRAM to an exported ATOM DMA-BUF, direct PCIe P2P" },
  "rngd->host": { name: "rngd->host", backend: "HETERO_NPU", path: "RNGD device DRAM to pinned host pages (staging leg)" },
  "host->rngd": { name: "host->rngd", backend: "HETERO_NPU", path: "pinned host pages to RNGD device DRAM (staging leg)" },
};

/** Why a route the table does not list is refused. */
function refusal(src: Tier, dst: Tier): string {
  if (src === "atom") return "ATOM memory is never a source";
  if (src === "rngd" && dst === "rngd") return "RNGD -> RNGD is two staging legs: plan rngd->host, then host->rngd";
  if (src === "host" && dst === "host") return "host -> host is not a NIXL route here (stage in registered arenas: dram->dram)";
  return `no route from ${src} to ${dst}`;
}

/**
 * The route for a copy from `src` to `dst`, given the backend plugins the agent has loaded.
 * Throws UnsupportedError naming the route and why it is refused.
 */
export function routeFor(src: string, dst: string, plugins: readonly string[]): Route {
  for (const t of [src, dst]) {
    if (!TIERS.includes(t as Tier)) throw new UnsupportedError(`nixl: unknown memory tier ${JSON.stringify(t)} (tiers: ${TIERS.join(", ")})`);
  }
  const route = ROUTES[`${src}->${dst}`];
  if (!route) throw new UnsupportedError(`nixl: route ${src} -> ${dst} refused: ${refusal(src as Tier, dst as Tier)}`);
  if (!plugins.includes(route.backend)) {
    const why =
      route.backend === "HETERO_NPU"
        ? "the HETERO_NPU backend plugin is not loaded (it comes with hetero-npu-p2p on NPU nodes)"
        : `the ${route.backend} backend plugin is not loaded`;
    throw new UnsupportedError(`nixl: route ${route.name} refused: ${why}; plugins here: ${plugins.join(", ") || "none"}`);
  }
  return route;
}
