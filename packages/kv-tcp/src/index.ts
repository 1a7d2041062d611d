// @airm/kv-tcp: the `tcp` KV transport and its relay server (`airm-kv-relay`).
export { tcpTransport, createTcpTransport, TCP_SUPPORT, DEFAULT_TIMEOUT_MS, type TcpTransportOptions } from "./tcp-transport.ts";
export { startRelay, Relay, type RelayServer, type RelayOptions, type RelayStats } from "./relay-server.ts";
export { ENV_VARS, DEFAULT_ADDR, DEFAULT_MAX_MB, DEFAULT_TTL_S, parseHostPort } from "./tcp-config.ts";
export * as frame from "./frame.ts";
