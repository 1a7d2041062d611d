// @airm/engine-rngd: the FuriosaAI RNGD engine, registered as airm.workloads "rngd". Backends:
// `rngd` and `rngd-full` prefill the whole prompt in one call, `rngd-chunk` prefills in chunks
// against the live cache; all decode B streams per step on a resident cache. FuriosaAI documents
// no C ABI for its model runtime (furiosa-rt is Python/Rust; the C library furiosa-libsmi only
// manages devices, and is used, when AIRM_FURIOSA_SMI_LIB names it, to resolve device-plugin ids
// such as uuids: bound in furiosa-smi.ts and handed to engine-kit as the spec's deviceIdMap), so
// the execution model always runs on the CPU reference and says so.

import { defineConfig, opt, text, type EnginePlugin } from "@airm/rm-core";
import { loadVendorEngine, vendorEngineConfig, type VendorEngineSpec } from "@airm/engine-kit";
import { furiosaDeviceIdMap, listFuriosaDevices } from "./furiosa-smi.ts";

export { listFuriosaDevices, furiosaDeviceIdMap, type FuriosaSmiDevice } from "./furiosa-smi.ts";

export const RNGD_BACKENDS = ["rngd", "rngd-chunk", "rngd-full"] as const;

/** What only the RNGD engine reads. */
export const RNGD_VENDOR_CONFIG = defineConfig("@airm/engine-rngd", {
  furiosaSmiLib: opt(text({ label: "path" }), {
    env: "AIRM_FURIOSA_SMI_LIB",
    defaultText: "unset (device nodes under AIRM_DEV_ROOT suffice)",
    doc: "furiosa-libsmi to resolve device-plugin ids (uuid, serial, bdf) to cards.",
  }),
});

/** The vendor description loadVendorEngine works from. */
export const rngdSpec: VendorEngineSpec<typeof RNGD_VENDOR_CONFIG.options> = {
  name: "rngd",
  vendor: "furiosa",
  defaultBackend: "rngd",
  config: RNGD_VENDOR_CONFIG,
  backends: {
    rngd: { prefillMode: "whole", residence: "device" },
    "rngd-full": { prefillMode: "whole", residence: "device" },
    "rngd-chunk": { prefillMode: "chunked", residence: "device" },
  },
  deviceIdMap(config) {
    const lib = config.furiosaSmiLib;
    if (!lib) return null;
    const devices = listFuriosaDevices(lib);
    return { map: furiosaDeviceIdMap(devices), detail: `furiosa-smi (${lib}) lists ${devices.map((d) => `npu${d.index ?? "?"}`).join(", ") || "no card"}` };
  },
  probeNative(selection) {
    const seen = selection.card ? `card ${selection.card.name} (${selection.device}) is visible but not driven: ` : "";
    return { detail: `${seen}no native RNGD runtime is bound (FuriosaAI publishes no C ABI for model execution)` };
  },
};

export const RNGD_CONFIG = vendorEngineConfig(rngdSpec);

/** airm.workloads "rngd". `load` resolves to an Engine (see @airm/engine-kit). */
export const rngdEngine: EnginePlugin<typeof RNGD_CONFIG.options> = {
  kind: "engine",
  name: "rngd",
  config: RNGD_CONFIG,
  load: (options, config) => loadVendorEngine(rngdSpec, options, config),
};
