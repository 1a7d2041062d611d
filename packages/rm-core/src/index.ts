// @airm/rm-core: the contracts, the registry, the config layer, the KV layout and manifest, the
// text helpers every host shares, and the conformance kit.
export * from "./contracts.ts";
export * from "./errors.ts";
export * from "./kv-key.ts";
export * from "./kv-layout.ts";
export * from "./kv-manifest.ts";
export * from "./block-hash.ts";
export * from "./blob-spec.ts";
export * from "./range-allocator.ts";
export * from "./config/value-types.ts";
export { ConfigSpec, defineConfig, opt, configMarkdown, configText, type ConfigRow, type ConfigValues, type Opt, type OptionMap, type ResolveInput } from "./config/config-spec.ts";
export { Command, defineCommand, flagOf, switchOf, type CommandSpec, type Flag, type FlagMap, type FlagValues, type ParsedCommand } from "./config/command-line.ts";
export { RM_CORE_CONFIG } from "./rm-core-config.ts";
export { INTERNAL_TOKEN_HEADER, newInternalToken, sameSecret } from "./internal-token.ts";
export {
  TLS_FILES,
  DEFAULT_TLS_RELOAD_S,
  LiveTlsMaterial,
  loadTlsDir,
  tlsMaterialOf,
  serverTlsOptions,
  serveReloads,
  clientTlsOptions,
  isTlsError,
  refusalReason,
  type TlsMaterial,
  type TlsReload,
} from "./tls-files.ts";
export { createCa, issueLeaf, makeTlsDir, makeTlsTestDirs, writeSecretVolume, DEFAULT_TLS_HOSTS, type CaFiles, type LeafOptions, type TlsTestDirs } from "./tls-certs.ts";
export { Registry, registry, findPackageRoot, dependencyPackageJson, type PluginFor, type PluginEntry } from "./registry.ts";
export { selectTransport, transportName, DEFAULT_KV_TRANSPORT, type SelectTransportOptions } from "./select-transport.ts";
export { FencedTransport, DEFAULT_PULL_TIMEOUT_MS } from "./fenced-transport.ts";
export { kvTransportCases, patternBytes, type KVCaseContext, type ConformanceCase } from "./conformance/kv-transport-cases.ts";
export { kvTransportSuite, runKVTransportConformance, type CaseResult, type KVTransportSuiteOptions } from "./conformance/suite.ts";
export { untilStopSignal } from "./stop-signal.ts";
export { DRAINING_GAUGE } from "./draining.ts";
export { IncrementalDetokenizer, type IncrementalDetokenizerOptions } from "./text/incremental-detokenizer.ts";
export { StopStringMatcher, type StopResult } from "./text/stop-strings.ts";
export { openEngine } from "./open-engine.ts";
export {
  SamplingSchema,
  SamplingDefaultsSchema,
  SAMPLING_DEFAULT_FIELDS,
  MAX_TOP_LOGPROBS,
  choiceSeed,
  describeSamplingDefaults,
  type SamplingDefaults,
  type SamplingParams,
  type TokenHistory,
  type TokenLogprobs,
  type TopLogprob,
} from "./sampling.ts";
export { declaredBackends, engineForBackend, transportNeeds, type TransportNeeds } from "./plugin-meta.ts";
export {
  CHARS_PER_TOKEN,
  DISAGGREGATION_REASONS,
  ESTIMATE_GAUGES,
  Ewma,
  PrefillFit,
  decideDisaggregation,
  estimateTokens,
  prefillMs,
  unionMs,
  type DisaggregationDecision,
  type DisaggregationInputs,
  type DisaggregationReason,
  type PrefillModel,
} from "./disaggregation.ts";
