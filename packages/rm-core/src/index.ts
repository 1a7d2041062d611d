// @airm/rm-core: the contracts, the registry, the KV manifest and the conformance kit.
export * from "./contracts.ts";
export * from "./errors.ts";
export * from "./kv-key.ts";
export * from "./kv-manifest.ts";
export * from "./blob-spec.ts";
export * from "./range-allocator.ts";
export { Registry, registry, findPackageRoot, dependencyPackageJson, type PluginFor } from "./registry.ts";
export { selectTransport, transportName, DEFAULT_KV_TRANSPORT, type SelectTransportOptions } from "./select-transport.ts";
export { FencedTransport, DEFAULT_PULL_TIMEOUT_MS } from "./fenced-transport.ts";
export { kvTransportCases, patternBytes, type KVCaseContext, type ConformanceCase } from "./conformance/kv-transport-cases.ts";
export { kvTransportSuite, runKVTransportConformance, type CaseResult, type KVTransportSuiteOptions } from "./conformance/suite.ts";
export { untilStopSignal } from "./stop-signal.ts";
