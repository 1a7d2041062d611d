// The placement and plan of `airm up --topology`: where each transport's sidecars go, what each
// part is pointed at, and what is refused, without a rig (a fake view of its hosts).
import { describe, expect, test } from "vitest";
import { placeCluster, planPlaced, TopologyError, TransportAcrossHostsError, type TopologyFile } from "./topology.ts";

const HOSTS = ["gw", "p1", "p2", "d1", "r1"];
const view = { address: (h: string) => `10.77.0.${HOSTS.indexOf(h) + 1}`, argv: (h: string, argv: string[]) => ["nsenter", h, ...argv] };
const topo = (place: TopologyFile["place"]): TopologyFile => ({ hosts: HOSTS, place });
const shape = (kvTransport: string) => ({ model: "/m", kvTransport, prefill: [{}], decode: [{}], port: 0 });
const plan = (t: TopologyFile, kv: string, env: Record<string, string> = {}) => planPlaced(shape(kv), placeCluster(t, shape(kv)), view, 42, env);
const byName = (p: ReturnType<typeof plan>) => Object.fromEntries(p.parts.map((x) => [x.name, x]));

describe("airm up --topology placement", () => {
  test("tcp: the relay on place.relay; every part bound to its host's address and pointed at the others", () => {
    const p = byName(plan(topo({ gateway: "gw", prefill: ["p1", "p2"], decode: "d1", relay: "r1" }), "tcp"));
    expect(Object.keys(p)).toEqual(["kv-relay", "prefill", "prefill-2", "decode", "gateway"]);
    expect(p["kv-relay"].argv.slice(0, 2)).toEqual(["nsenter", "r1"]);
    expect(p["kv-relay"].argv.slice(-2)).toEqual(["--listen", "10.77.0.5:7400"]);
    expect(p.prefill.env.AIRM_KV_TCP_ADDR).toBe("10.77.0.5:7400");
    expect(p["prefill-2"].url).toBe("http://10.77.0.3:8103");
    expect(p.gateway.argv).toEqual(
      expect.arrayContaining(["--host", "10.77.0.1", "--prefill", "http://10.77.0.2:8101,http://10.77.0.3:8103", "--decode", "http://10.77.0.4:8102"]),
    );
    expect(p.decode.env.UCX_TLS).toBe("tcp");
    expect(p.decode.env.UCX_NET_DEVICES).toBe("eth0");
    expect(plan(topo({ gateway: "gw", prefill: "p1", decode: "d1", relay: "r1" }), "tcp", { UCX_TLS: "rc" }).parts[1].env.UCX_TLS).toBeUndefined();
  });

  test("nixl: an agent beside the workers of each host, cross-host variables and the relay when they are several", () => {
    const p = byName(plan(topo({ gateway: "gw", prefill: "p1", decode: "d1", relay: "r1" }), "nixl"));
    expect(Object.keys(p)).toEqual(["kv-relay", "kv-nixl-agent-p1", "kv-nixl-agent-d1", "prefill", "decode", "gateway"]);
    expect(p.prefill.env.AIRM_KV_NIXL_ADDR).toBe("10.77.0.2:7500");
    expect(p.decode.env.AIRM_KV_NIXL_ADDR).toBe("10.77.0.4:7500");
    expect(p["kv-nixl-agent-d1"].env).toMatchObject({ AIRM_KV_NIXL_CROSS_HOST: "1", AIRM_KV_NIXL_PEER_ADDR: "10.77.0.4:7500", AIRM_KV_TCP_ADDR: "10.77.0.5:7400" });
    // one host: one agent, no relay, no cross-host variables
    const one = byName(plan(topo({ gateway: "gw", prefill: "p1", decode: "p1" }), "nixl"));
    expect(Object.keys(one)).toEqual(["kv-nixl-agent", "prefill", "decode", "gateway"]);
    expect(one["kv-nixl-agent"].env.AIRM_KV_NIXL_CROSS_HOST).toBeUndefined();
  });

  test("shm is refused across hosts, and allowed on one; a relay the transport needs must be placed", () => {
    expect(() => placeCluster(topo({ gateway: "gw", prefill: "p1", decode: "d1" }), shape("shm"))).toThrow(TransportAcrossHostsError);
    expect(() => placeCluster(topo({ gateway: "gw", prefill: "p1", decode: "d1" }), shape("shm"))).toThrow(/shm needs one \/dev\/shm: put prefill and decode on one host/);
    const p = plan(topo({ gateway: "gw", prefill: "p1", decode: "p1" }), "shm");
    expect(p.clusterDir?.path).toBe("/dev/shm/airm-up-42");
    expect(() => placeCluster(topo({ gateway: "gw", prefill: "p1", decode: "d1" }), shape("nixl-ucx"))).toThrow(TopologyError);
    // two parts on one port of one host
    expect(() => plan(topo({ gateway: "p1", prefill: "p1", decode: "d1", relay: "r1" }), "tcp").parts).not.toThrow();
    expect(() => planPlaced({ ...shape("tcp"), port: 8101 }, placeCluster(topo({ gateway: "p1", prefill: "p1", decode: "d1", relay: "r1" }), shape("tcp")), view, 1, {})).toThrow(
      /prefill and the gateway both listen on port 8101 of p1/,
    );
  });
});
