// @airm/engine-kit: what the vendor engines share. Device discovery and chip selection, compiled
// variants, the artifact cache, delta plans, the engine config, the engine mechanics on the CPU
// reference backend, and the native vendor runtime bindings. (The KV layout is rm-core's.)
export * from "./device-errors.ts";
export * from "./device-discovery.ts";
export * from "./kubelet-checkpoint.ts";
export * from "./chip-selection.ts";
export * from "./variants.ts";
export * from "./artifact-cache.ts";
export * from "./delta-plan.ts";
export * from "./engine-config.ts";
export * from "./cpu-model.ts";
export * from "./tensor-hash-manifest.ts";
export { CpuBackedEngine, loadWeights, type CpuEngineSpec, type NativeHostDecode } from "./cpu-engine.ts";
export { kvBudgetBlocks, parseKvCacheMemory, contextBuckets, DEFAULT_KV_SHARE, type KvCacheMemory } from "./kv-budget.ts";
export { loadVendorEngine, vendorEngineConfig, type VendorEngineSpec, type BackendMode, type NativeProbe } from "./vendor-engine.ts";
export { RblnRuntimeLibrary, RblnGraphSession, findRblnLibrary, DEFAULT_RBLN_LIBRARY, RBLN_SUCCESS } from "./native/rbln-runtime.ts";
export {
  RblnDecodeGraph,
  decodeGraphFile,
  decodeGraphIO,
  denseLayerBytes,
  writeBlockColumn,
  type DecodeGraphShape,
  type DenseKV,
  type HostDecodeResult,
} from "./native/rbln-decode-graph.ts";
export { engineTokens, referenceTokens } from "./reference-run.ts";
export { CoreBoard, parseCoreBoard, CORE_BOARD_SLOTS, type CoreBoardSpec } from "./core-board.ts";
export { PrefixCache, type PrefixHit, type BlockHolder, type BlockEvent } from "./prefix-cache.ts";
export { PassLoop, type PassPolicy, type DecodeWork, type PrefillWork } from "./pass-loop.ts";
export { listFuriosaDevices, furiosaDeviceIdMap, type FuriosaSmiDevice } from "./native/furiosa-smi.ts";
