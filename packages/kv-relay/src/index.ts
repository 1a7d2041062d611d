// @airm/kv-relay: the KV relay server (`airm-kv-relay`), its client and frame codec. The tcp
// transport stores blobs in it; nixl-ucx publishes its descriptors in it. Not a plugin itself.
export { startRelay, Relay, type RelayServer, type RelayOptions } from "./relay-server.ts";
export type { RelayStats } from "./relay-metrics.ts";
export { RelayClient, DEFAULT_TIMEOUT_MS, type RelayClientOptions } from "./relay-client.ts";
export { RELAY_CONFIG, RELAY_CLIENT_CONFIG, DEFAULT_MAX_MB, DEFAULT_TTL_S } from "./relay-config.ts";
export { RELAY_COMMAND } from "./relay-cli.ts";
export { DEFAULT_ADDR, parseHostPort, formatHostPort, type HostPort } from "./address.ts";
export { spawnRelay, type RelayProcess } from "./relay-process.ts";
export * as frame from "./frame.ts";
