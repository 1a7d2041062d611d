// @airm/engine-kit: what the vendor engines share. Device discovery and chip selection, compiled
// variants, the artifact cache, delta plans, the engine config, the engine mechanics on the CPU
// reference backend, and the contract a native host-input decode step implements. The vendor
// runtime bindings live in their engine packages (engine-rngd, engine-atom), which pass them in
// through VendorEngineSpec. (The KV layout is rm-core's.)
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
export { denseLayerBytes, writeBlockColumn, type DecodeGraphShape, type DenseKV, type HostDecodeResult } from "./host-decode.ts";
export { engineTokens, referenceTokens } from "./reference-run.ts";
export { CoreBoard, parseCoreBoard, CORE_BOARD_SLOTS, type CoreBoardSpec } from "./core-board.ts";
export { PrefixCache, type PrefixHit, type BlockHolder, type BlockEvent } from "./prefix-cache.ts";
export { PassLoop, type PassPolicy, type DecodeWork, type PrefillWork } from "./pass-loop.ts";
