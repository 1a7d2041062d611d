import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, describe, expect, it } from "vitest";
import { isAirmError } from "@airm/rm-core";
import { DEVICE_CONFIG, type DeviceSelectionError, discoverCards, parseKubeletCheckpoint, selectChip, type DeviceErrorReason } from "../src/index.ts";

const root = mkdtempSync(join(tmpdir(), "airm-chip-"));
afterAll(() => rmSync(root, { recursive: true, force: true }));

/** A device root holding the given node names (files stand in for character devices). */
function devRoot(name: string, nodes: string[]): string {
  const dir = join(root, name, "dev");
  for (const n of nodes) {
    mkdirSync(join(dir, n, ".."), { recursive: true });
    writeFileSync(join(dir, n), "");
  }
  mkdirSync(dir, { recursive: true });
  return dir;
}

function rngdNodes(indices: number[]): string[] {
  return indices.flatMap((i) => [`rngd/npu${i}mgmt`, `rngd/npu${i}pe0`, `rngd/npu${i}pe1`, `rngd/npu${i}pe0-1`, `rngd/npu${i}pe0-3`, `rngd/npu${i}bar4`]);
}

function checkpointFile(name: string, text: string): string {
  const f = join(root, `${name}.json`);
  writeFileSync(f, text);
  return f;
}

/** The kubelet's own shape (1.20+): DeviceIDs keyed by NUMA node, AllocResp base64, a checksum. */
function kubeletCheckpoint(entries: { uid: string; resource: string; ids: unknown }[]): string {
  return JSON.stringify({
    Data: {
      PodDeviceEntries: entries.map((e) => ({
        PodUID: e.uid,
        ContainerName: "worker",
        ResourceName: e.resource,
        DeviceIDs: e.ids,
        AllocResp: Buffer.from("opaque allocate response").toString("base64"),
      })),
      RegisteredDevices: { "furiosa.ai/rngd": ["npu0", "npu1", "npu3"], "rebellions.ai/ATOM": ["rbln0"] },
    },
    Checksum: 1234567890,
  });
}

function reasonOf(fn: () => unknown): DeviceErrorReason | string {
  try {
    fn();
  } catch (e) {
    expect(isAirmError(e, "DEVICE")).toBe(true);
    return (e as DeviceSelectionError).reason;
  }
  return "no error";
}

const rngd3 = devRoot("rngd3", rngdNodes([0, 1, 3]));
const rngd1 = devRoot("rngd1", rngdNodes([2]));
const empty = devRoot("empty", ["null", "zero"]);
const atom = devRoot("atom", ["rbln0", "rbln2", "rsd0", "rbln_ctl"]);

const device = (env: Record<string, string | undefined>) => DEVICE_CONFIG.resolve({ env });

describe("device discovery", () => {
  it("groups RNGD nodes per card, sorted by kernel index, skipping a missing npu2", () => {
    const cards = discoverCards("furiosa", rngd3);
    expect(cards.map((c) => c.name)).toEqual(["npu0", "npu1", "npu3"]);
    expect(cards[2].nodes.map((n) => n.split("/").pop())).toEqual(["npu3bar4", "npu3mgmt", "npu3pe0", "npu3pe0-1", "npu3pe0-3", "npu3pe1"]);
  });
  it("finds ATOM cards as rbln<N> and ignores the rsd system node", () => {
    expect(discoverCards("rebellions", atom).map((c) => c.name)).toEqual(["rbln0", "rbln2"]);
  });
  it("sees nothing under a root without vendor nodes", () => {
    expect(discoverCards("furiosa", empty)).toEqual([]);
    expect(discoverCards("rebellions", join(root, "does-not-exist"))).toEqual([]);
  });
});

describe("--chip N", () => {
  it("is the ordinal among visible cards: rngd:2 is npu3 when npu2 is absent", () => {
    const s = selectChip({ vendor: "furiosa", chip: 2, config: device({ AIRM_DEV_ROOT: rngd3 }) });
    expect(s.card?.name).toBe("npu3");
    expect(s.device).toBe("rngd:2");
    expect(s.source).toBe("flag");
  });
  it("refuses an ordinal past the visible cards, listing them", () => {
    expect(reasonOf(() => selectChip({ vendor: "furiosa", chip: 3, config: device({ AIRM_DEV_ROOT: rngd3 }) }))).toBe("NO_SUCH_ORDINAL");
    try {
      selectChip({ vendor: "furiosa", chip: 3, config: device({ AIRM_DEV_ROOT: rngd3 }) });
    } catch (e) {
      expect((e as Error).message).toContain("npu3 (rngd:2)");
    }
  });
  it("rejects chips that are not integers >= -1", () => {
    expect(reasonOf(() => selectChip({ vendor: "furiosa", chip: -2, config: device({ AIRM_DEV_ROOT: rngd3 }) }))).toBe("BAD_CHIP");
    expect(reasonOf(() => selectChip({ vendor: "furiosa", chip: 1.5, config: device({ AIRM_DEV_ROOT: rngd3 }) }))).toBe("BAD_CHIP");
  });
  it("with no card visible selects nothing and says so (CPU reference)", () => {
    const s = selectChip({ vendor: "furiosa", chip: 0, config: device({ AIRM_DEV_ROOT: empty }) });
    expect(s.card).toBeNull();
    expect(s.device).toBeNull();
    expect(s.detail).toContain("no furiosa card visible");
  });
  it("addresses ATOM cards by ordinal too (rbln:1 is rbln2)", () => {
    const s = selectChip({ vendor: "rebellions", chip: 1, config: device({ AIRM_DEV_ROOT: atom }) });
    expect([s.card?.name, s.device]).toEqual(["rbln2", "rbln:1"]);
  });
});

describe("--chip -1 (kubelet device-plugin checkpoint)", () => {
  const uid = "3f1c8a52-2b7e-4f0e-9d4c-6a1b2c3d4e5f";
  const numa = checkpointFile(
    "numa",
    kubeletCheckpoint([
      { uid: "another-pod", resource: "furiosa.ai/rngd", ids: { "0": ["npu0"] } },
      { uid, resource: "furiosa.ai/rngd", ids: { "1": ["npu3"] } },
      { uid, resource: "example.com/nic", ids: { "0": ["eth9"] } },
    ]),
  );
  const list = checkpointFile("list", kubeletCheckpoint([{ uid, resource: "furiosa.ai/rngd", ids: ["/dev/rngd/npu1"] }]));

  it("takes this pod's card from a NUMA-keyed record and addresses it by ordinal", () => {
    const s = selectChip({ vendor: "furiosa", chip: -1, config: device({ AIRM_DEV_ROOT: rngd3, POD_UID: uid, AIRM_KUBELET_CHECKPOINT: numa }) });
    expect([s.card?.name, s.device, s.source]).toEqual(["npu3", "rngd:2", "checkpoint"]);
  });
  it("reads the older list form of DeviceIDs and device-path ids", () => {
    const s = selectChip({ vendor: "furiosa", chip: -1, config: device({ AIRM_DEV_ROOT: rngd3, POD_UID: uid, AIRM_KUBELET_CHECKPOINT: list }) });
    expect([s.card?.name, s.device]).toEqual(["npu1", "rngd:1"]);
  });
  it("refuses to guess with several cards and no record for this pod", () => {
    const env = { AIRM_DEV_ROOT: rngd3, POD_UID: "nobody", AIRM_KUBELET_CHECKPOINT: numa };
    expect(reasonOf(() => selectChip({ vendor: "furiosa", chip: -1, config: device(env) }))).toBe("AMBIGUOUS");
    expect(reasonOf(() => selectChip({ vendor: "furiosa", chip: -1, config: device({ AIRM_DEV_ROOT: rngd3 }) }))).toBe("AMBIGUOUS");
    expect(reasonOf(() => selectChip({ vendor: "furiosa", chip: -1, config: device({ AIRM_DEV_ROOT: rngd3, POD_UID: uid, AIRM_KUBELET_CHECKPOINT: join(root, "absent") }) }))).toBe(
      "AMBIGUOUS",
    );
  });
  it("uses the only visible card when there is no record", () => {
    const s = selectChip({ vendor: "furiosa", chip: -1, config: device({ AIRM_DEV_ROOT: rngd1, POD_UID: "nobody", AIRM_KUBELET_CHECKPOINT: numa }) });
    expect([s.card?.name, s.device, s.source]).toEqual(["npu2", "rngd:0", "only-card"]);
  });
  it("refuses a record naming a card this process cannot see", () => {
    const f = checkpointFile("invisible", kubeletCheckpoint([{ uid, resource: "furiosa.ai/rngd", ids: { "0": ["npu2"] } }]));
    expect(reasonOf(() => selectChip({ vendor: "furiosa", chip: -1, config: device({ AIRM_DEV_ROOT: rngd3, POD_UID: uid, AIRM_KUBELET_CHECKPOINT: f }) }))).toBe(
      "ALLOCATION_NOT_VISIBLE",
    );
  });
  it("maps opaque device-plugin ids through AIRM_DEVICE_ID_MAP, and refuses them without it", () => {
    const f = checkpointFile("uuid", kubeletCheckpoint([{ uid, resource: "furiosa.ai/rngd", ids: { "0": ["A76AAD68-6855-40B1-9E86-D080852D1C80"] } }]));
    const env = { AIRM_DEV_ROOT: rngd3, POD_UID: uid, AIRM_KUBELET_CHECKPOINT: f };
    expect(reasonOf(() => selectChip({ vendor: "furiosa", chip: -1, config: device(env) }))).toBe("UNKNOWN_DEVICE_ID");
    const s = selectChip({ vendor: "furiosa", chip: -1, config: device({ ...env, AIRM_DEVICE_ID_MAP: JSON.stringify({ "A76AAD68-6855-40B1-9E86-D080852D1C80": "npu1" }) }) });
    expect(s.device).toBe("rngd:1");
  });
  it("reads ATOM allocations under rebellions.ai/", () => {
    const f = checkpointFile("atom", kubeletCheckpoint([{ uid, resource: "rebellions.ai/ATOM", ids: { "0": ["rbln2"] } }]));
    const s = selectChip({ vendor: "rebellions", chip: -1, config: device({ AIRM_DEV_ROOT: atom, POD_UID: uid, AIRM_KUBELET_CHECKPOINT: f }) });
    expect([s.card?.name, s.device]).toEqual(["rbln2", "rbln:1"]);
  });

  const malformed: [string, string][] = [
    ["not JSON", '{"Data": {"PodDeviceEntries": ['],
    ["a list at the top", "[]"],
    ["Data is a list", JSON.stringify({ Data: [] })],
    ["entries not a list", JSON.stringify({ Data: { PodDeviceEntries: { a: 1 } } })],
    ["entry without PodUID", JSON.stringify({ Data: { PodDeviceEntries: [{ ResourceName: "furiosa.ai/rngd", DeviceIDs: ["npu0"] }] } })],
    ["DeviceIDs a number", JSON.stringify({ Data: { PodDeviceEntries: [{ PodUID: uid, ResourceName: "furiosa.ai/rngd", DeviceIDs: 3 }] } })],
    ["NUMA entry not a list", JSON.stringify({ Data: { PodDeviceEntries: [{ PodUID: uid, ResourceName: "furiosa.ai/rngd", DeviceIDs: { "0": "npu0" } }] } })],
    ["id not a string", JSON.stringify({ Data: { PodDeviceEntries: [{ PodUID: uid, ResourceName: "furiosa.ai/rngd", DeviceIDs: [0] }] } })],
  ];
  for (const [what, text] of malformed) {
    it(`stops on a malformed checkpoint: ${what}`, () => {
      const f = checkpointFile(`bad-${what.replace(/\W+/g, "-")}`, text);
      expect(reasonOf(() => selectChip({ vendor: "furiosa", chip: -1, config: device({ AIRM_DEV_ROOT: rngd1, POD_UID: uid, AIRM_KUBELET_CHECKPOINT: f }) }))).toBe(
        "CHECKPOINT_MALFORMED",
      );
    });
  }
  it("stops on a checkpoint it cannot read", () => {
    const dirAsFile = join(root, "a-directory");
    mkdirSync(dirAsFile, { recursive: true });
    expect(reasonOf(() => selectChip({ vendor: "furiosa", chip: -1, config: device({ AIRM_DEV_ROOT: rngd1, POD_UID: uid, AIRM_KUBELET_CHECKPOINT: dirAsFile }) }))).toBe(
      "CHECKPOINT_UNREADABLE",
    );
  });
  it("treats a null entry list (kubelet with no allocations) as no record", () => {
    expect(parseKubeletCheckpoint(JSON.stringify({ Data: { PodDeviceEntries: null, RegisteredDevices: {} }, Checksum: 1 }))).toEqual([]);
  });
});
