// `airm up --topology FILE`: checks the file and the placement before anything starts, then makes
// the rig (netns-rig.ts, as root), an agent in each host and the gateway's forwarder on this
// process's loopback (ns-bridge.ts), and gives the launcher a planner that runs each part in its
// host's namespace (topology.ts). close() stops the forwarders, the agents and the rig.

import { ConfigError } from "@airm/rm-core";
import type { ClusterShape } from "./cluster-plan.ts";
import { DEFAULT_PORTS } from "./defaults.ts";
import type { ClusterOptions } from "./local-cluster.ts";
import { NetnsRig } from "./netns-rig.ts";
import { NsBridge } from "./ns-bridge.ts";
import { placeCluster, planPlaced, readTopology, type PlacedCluster, type TopologyFile } from "./topology.ts";

export interface CheckedTopology {
  file: string;
  topology: TopologyFile;
  placed: PlacedCluster;
}

/** Reads and checks the topology file and places `shape`'s parts; throws TopologyError (and TransportAcrossHostsError) before anything starts. */
export function checkTopologyRun(file: string, shape: ClusterShape): CheckedTopology {
  const topology = readTopology(file);
  const placed = placeCluster(topology, shape);
  if (process.getuid?.() !== 0) {
    throw new ConfigError("--topology", "making the rig's network namespaces needs root (CAP_NET_ADMIN): run airm up as root, or without --topology");
  }
  return { file, topology, placed };
}

export interface TopologyRun {
  rig: NetnsRig;
  /** What startLocalCluster needs to run the parts in the rig. */
  options: Pick<ClusterOptions, "planner" | "reach">;
  /** One line per part: where it runs. */
  placement(parts: { name: string; spec: { host?: string; url: string } }[]): string;
  close(): Promise<void>;
}

/** Makes the rig, the agents and the gateway's forwarder on 127.0.0.1:`port` (0: a free one); `env`: what the parts inherit. */
export async function openTopologyRun(c: CheckedTopology, shape: ClusterShape, port: number, env: Record<string, string | undefined>): Promise<TopologyRun> {
  const rig = await NetnsRig.up(c.topology, { dieWithParent: true });
  let bridge: NsBridge | undefined;
  const close = async () => {
    await bridge?.close();
    await rig.down();
  };
  try {
    const addresses = new Map([...rig.hosts.values()].map((h) => [h.name, h.address]));
    bridge = await NsBridge.open(addresses, (host, cmd, args, opts) => rig.spawn(host, cmd, args, opts));
    const gatewayAddr = `${rig.host(c.placed.gateway).address}:${shape.port || DEFAULT_PORTS.gateway}`;
    try {
      await bridge.forward(port, gatewayAddr);
    } catch (e) {
      throw new ConfigError("--port", `127.0.0.1:${port} (the forwarder to the gateway on ${c.placed.gateway}): ${(e as Error).message}`);
    }
  } catch (e) {
    await close();
    throw e;
  }
  const view = { address: (h: string) => rig.host(h).address, argv: (h: string, argv: string[]) => rig.command(h, argv[0], argv.slice(1)) };
  const b = bridge;
  return {
    rig,
    options: {
      planner: async (s, pid) => planPlaced(s, c.placed, view, pid, env),
      reach: { http: (url) => b.http(url), connect: (addr) => b.connect(addr) },
    },
    placement: (parts) => parts.map((p) => `  ${p.name.padEnd(28)} on ${(p.spec.host ?? "this host").padEnd(14)} ${p.spec.url}`).join("\n"),
    close,
  };
}
