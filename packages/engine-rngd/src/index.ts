// @airm/engine-rngd: the FuriosaAI RNGD engine, registered as airm.workloads "rngd". Backends:
// `rngd` and `rngd-full` prefill the whole prompt in one call, `rngd-chunk` prefills in chunks
// against the live cache; all decode B streams per step on a resident cache. FuriosaAI documents
// no C ABI for its model runtime (furiosa-rt is Python/Rust; the C library furiosa-libsmi only
// manages devices, and is used, when AIRM_FURIOSA_SMI_LIB names it, to resolve device-plugin ids
// such as uuids), so the execution model always runs on the CPU reference and says so.

import type { EnginePlugin } from "@airm/rm-core";
import { findFuriosaSmiLibrary, furiosaDeviceIdMap, listFuriosaDevices, loadVendorEngine, type VendorEngineSpec } from "@airm/engine-kit";

export const RNGD_BACKENDS = ["rngd", "rngd-chunk", "rngd-full"] as const;

/** The vendor description loadVendorEngine works from. */
export const rngdSpec: VendorEngineSpec = {
  name: "rngd",
  vendor: "furiosa",
  defaultBackend: "rngd",
  backends: {
    rngd: { prefillMode: "whole", residence: "device" },
    "rngd-full": { prefillMode: "whole", residence: "device" },
    "rngd-chunk": { prefillMode: "chunked", residence: "device" },
  },
  deviceIdMap(env) {
    const lib = findFuriosaSmiLibrary(env);
    if (!lib) return null;
    const devices = listFuriosaDevices(lib);
    return { map: furiosaDeviceIdMap(devices), detail: `furiosa-smi (${lib}) lists ${devices.map((d) => `npu${d.index ?? "?"}`).join(", ") || "no card"}` };
  },
  probeNative(selection) {
    const seen = selection.card ? `card ${selection.card.name} (${selection.device}) is visible but not driven: ` : "";
    return { detail: `${seen}no native RNGD runtime is bound (FuriosaAI publishes no C ABI for model execution)` };
  },
};

/** airm.workloads "rngd". `load` resolves to an Engine (see @airm/engine-kit). */
export const rngdEngine: EnginePlugin = {
  kind: "engine",
  name: "rngd",
  load: (options) => loadVendorEngine(rngdSpec, options),
};
