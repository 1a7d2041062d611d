// Exercises the koffi binding of furiosa_smi.h (device listing) against a fake libfuriosa_smi.so
// built here from test/fixtures/fake-furiosa-smi.c with gcc, and its use by engine-kit's chip selection.
import { execFileSync } from "node:child_process";
import { mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { DEVICE_CONFIG, selectChip } from "@airm/engine-kit";
import { furiosaDeviceIdMap, listFuriosaDevices } from "../src/furiosa-smi.ts";

const source = fileURLToPath(new URL("./fixtures/fake-furiosa-smi.c", import.meta.url));
const dir = mkdtempSync(join(tmpdir(), "airm-smi-"));
const lib = join(dir, "libfuriosa_smi.so");
const oldLib = join(dir, "libfuriosa_smi_old.so");
const brokenLib = join(dir, "libfuriosa_smi_broken.so");

beforeAll(() => {
  execFileSync("gcc", ["-shared", "-fPIC", "-O1", "-Wall", "-Werror", "-o", lib, source]);
  const text = readFileSync(source, "utf8");
  // An older release without furiosa_smi_init, and one lacking furiosa_smi_get_device_files.
  writeFileSync(join(dir, "old.c"), text.replace("FuriosaSmiReturnCode furiosa_smi_init(void) {", "static __attribute__((unused)) FuriosaSmiReturnCode old_init(void) {"));
  execFileSync("gcc", ["-shared", "-fPIC", "-O1", "-w", "-o", oldLib, join(dir, "old.c")]);
  writeFileSync(join(dir, "broken.c"), text.replace("FuriosaSmiReturnCode furiosa_smi_get_device_files(", "static __attribute__((unused)) FuriosaSmiReturnCode no_files("));
  execFileSync("gcc", ["-shared", "-fPIC", "-O1", "-w", "-o", brokenLib, join(dir, "broken.c")]);
  process.env.FAKE_FURIOSA_DEVICES = "0,1,3";
});
afterAll(() => {
  delete process.env.FAKE_FURIOSA_DEVICES;
  rmSync(dir, { recursive: true, force: true });
});

describe("furiosa-smi binding (fake library)", () => {
  it("lists cards with their ids and device files, through the header's struct layouts", () => {
    const devices = listFuriosaDevices(lib);
    expect(devices.map((d) => [d.index, d.uuid, d.serial, d.bdf, d.numaNode])).toEqual([
      [0, "FAKE-UUID-0", "RNGD-0", "0000:10:00.0", 0],
      [1, "FAKE-UUID-1", "RNGD-1", "0000:11:00.0", 1],
      [3, "FAKE-UUID-3", "RNGD-3", "0000:13:00.0", 1],
    ]);
    expect(devices[2].files).toEqual([
      { path: "/dev/rngd/npu3pe0", coreStart: 0, coreEnd: 0 },
      { path: "/dev/rngd/npu3pe1", coreStart: 1, coreEnd: 1 },
      { path: "/dev/rngd/npu3pe0-1", coreStart: 0, coreEnd: 1 },
      { path: "/dev/rngd/npu3pe0-3", coreStart: 0, coreEnd: 3 },
    ]);
    expect(listFuriosaDevices(oldLib).map((d) => d.index)).toEqual([0, 1, 3]);
  });

  it("names a missing library or symbol", () => {
    expect(() => listFuriosaDevices(join(dir, "nope.so"))).toThrow(/cannot load/);
    expect(() => listFuriosaDevices(brokenLib)).toThrow(/lacks furiosa_smi_get_device_files/);
  });

  it("resolves a device-plugin uuid to the card's ordinal for --chip -1", () => {
    const dev = join(dir, "dev");
    mkdirSync(join(dev, "rngd"), { recursive: true });
    for (const i of [0, 1, 3]) writeFileSync(join(dev, "rngd", `npu${i}pe0`), "");
    const ckpt = join(dir, "checkpoint.json");
    writeFileSync(
      ckpt,
      JSON.stringify({ Data: { PodDeviceEntries: [{ PodUID: "p1", ContainerName: "w", ResourceName: "furiosa.ai/rngd", DeviceIDs: { "1": ["FAKE-UUID-3"] } }] }, Checksum: 1 }),
    );
    const config = DEVICE_CONFIG.resolve({ env: { AIRM_DEV_ROOT: dev, POD_UID: "p1", AIRM_KUBELET_CHECKPOINT: ckpt } });
    expect(() => selectChip({ vendor: "furiosa", chip: -1, config })).toThrow(/does not name a furiosa card/);
    const s = selectChip({ vendor: "furiosa", chip: -1, config, deviceIds: furiosaDeviceIdMap(listFuriosaDevices(lib)) });
    expect([s.card?.name, s.device]).toEqual(["npu3", "rngd:2"]);
  });
});
