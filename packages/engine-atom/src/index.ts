// @airm/engine-atom: the Rebellions ATOM engine, registered as airm.workloads "atom". Prefill runs
// the whole prompt; decode passes each stream's whole cache as a host input every step and writes
// back the new position, as the ATOM decode graph does. The native path (librbln_runtime.so via
// koffi, bound in rbln-runtime.ts; the decode graph in rbln-decode-graph.ts) is taken only when the
// library, an ATOM card and the compiled decode graphs are all present; it reaches engine-kit as
// the NativeHostDecode that probeNative returns. Otherwise the same execution model runs on the
// CPU reference and says so.

import { existsSync } from "node:fs";
import { ConfigError, defineConfig, opt, text, type EnginePlugin } from "@airm/rm-core";
import { loadVendorEngine, vendorEngineConfig, type VendorEngineSpec } from "@airm/engine-kit";
import { RblnDecodeGraph, decodeGraphFile } from "./rbln-decode-graph.ts";
import { RblnRuntimeLibrary, findRblnLibrary } from "./rbln-runtime.ts";

export { RblnRuntimeLibrary, RblnGraphSession, findRblnLibrary, DEFAULT_RBLN_LIBRARY, RBLN_SUCCESS } from "./rbln-runtime.ts";
export { RblnDecodeGraph, decodeGraphFile, decodeGraphIO } from "./rbln-decode-graph.ts";

/** What only the ATOM engine reads. */
export const ATOM_VENDOR_CONFIG = defineConfig("@airm/engine-atom", {
  rblnLib: opt(text({ label: "path" }), {
    env: "AIRM_RBLN_LIB",
    defaultText: "/usr/local/lib/librbln_runtime.so when present",
    doc: "The Rebellions runtime library (librbln_runtime.so) of the native decode path.",
  }),
  rblnGraphs: opt(text({ label: "path" }), {
    env: "AIRM_RBLN_GRAPHS",
    defaultText: "unset",
    doc: "Folder of compiled decode graphs (decode-B<b>xS<s>.rbln), compiled on the host beforehand; needed for the native path.",
  }),
});

/** The vendor description loadVendorEngine works from. */
export const atomSpec: VendorEngineSpec<typeof ATOM_VENDOR_CONFIG.options> = {
  name: "atom",
  vendor: "rebellions",
  defaultBackend: "atom",
  config: ATOM_VENDOR_CONFIG,
  backends: { atom: { prefillMode: "whole", residence: "host" } },
  probeNative(selection, config) {
    const lib = findRblnLibrary(config.rblnLib);
    if (!lib) return { detail: "librbln_runtime.so not found (install rbln-sdk or set AIRM_RBLN_LIB)" };
    if (!existsSync(lib)) throw new ConfigError("AIRM_RBLN_LIB", `${lib} does not exist; unset it or point it at librbln_runtime.so`);
    if (!selection.card || selection.ordinal === null) return { detail: `${lib} found but no ATOM card is visible` };
    const graphs = config.rblnGraphs;
    if (!graphs || !existsSync(graphs)) {
      throw new ConfigError(
        "AIRM_RBLN_GRAPHS",
        `${lib} and ${selection.card.name} are present but no compiled decode graphs are (set AIRM_RBLN_GRAPHS to the folder of decode-B<b>xS<s>.rbln files; compile them on the host first)`,
      );
    }
    const library = RblnRuntimeLibrary.open(lib);
    const deviceId = selection.ordinal;
    return {
      device: selection.device ?? undefined,
      detail: `native RBLN runtime ${lib}, decode graphs from ${graphs}`,
      hostDecode: { open: (variant, shape) => new RblnDecodeGraph(library, decodeGraphFile(graphs, variant), deviceId, shape, variant) },
    };
  },
};

export const ATOM_CONFIG = vendorEngineConfig(atomSpec);

/** airm.workloads "atom". `load` resolves to an Engine (see @airm/engine-kit). */
export const atomEngine: EnginePlugin<typeof ATOM_CONFIG.options> = {
  kind: "engine",
  name: "atom",
  config: ATOM_CONFIG,
  load: (options, config) => loadVendorEngine(atomSpec, options, config),
};
