// @airm/engine-atom: the Rebellions ATOM engine, registered as airm.workloads "atom". Prefill runs
// the whole prompt; decode passes each stream's whole cache as a host input every step and writes
// back the new position, as the ATOM decode graph does. The native path (librbln_runtime.so via
// koffi) is taken only when the library, an ATOM card and the compiled decode graphs are all
// present; otherwise the same execution model runs on the CPU reference and says so.

import { existsSync } from "node:fs";
import { ConfigError } from "@airm/rm-core";
import type { EnginePlugin } from "@airm/rm-core";
import {
  RblnDecodeGraph,
  RblnRuntimeLibrary,
  decodeGraphFile,
  findRblnLibrary,
  loadVendorEngine,
  type VendorEngineSpec,
} from "@airm/engine-kit";

/** The vendor description loadVendorEngine works from. */
export const atomSpec: VendorEngineSpec = {
  name: "atom",
  vendor: "rebellions",
  defaultBackend: "atom",
  backends: { atom: { prefillMode: "whole", residence: "host" } },
  probeNative(selection, env) {
    const lib = findRblnLibrary(env);
    if (!lib) return { detail: "librbln_runtime.so not found (install rbln-sdk or set AIRM_RBLN_LIB)" };
    if (!existsSync(lib)) throw new ConfigError("AIRM_RBLN_LIB", `${lib} does not exist; unset it or point it at librbln_runtime.so`);
    if (!selection.card || selection.ordinal === null) return { detail: `${lib} found but no ATOM card is visible` };
    const graphs = env.AIRM_RBLN_GRAPHS;
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

/** airm.workloads "atom". `load` resolves to an Engine (see @airm/engine-kit). */
export const atomEngine: EnginePlugin = {
  kind: "engine",
  name: "atom",
  load: (options) => loadVendorEngine(atomSpec, options),
};
