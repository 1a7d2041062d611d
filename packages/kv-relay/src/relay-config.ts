// What configures a relay process (airm-kv-relay): its byte cap, blob lifetime, CRC checking,
// audit logging, metrics port, and two switches kept for measurements. The variables keep the
// seed's AIRM_KV_TCP_* names because the relay serves the tcp transport first.

import { ConfigSpec, defineConfig, flag, hostPort, int, num, opt, RM_CORE_CONFIG } from "@airm/rm-core";

export const DEFAULT_MAX_MB = 1024;
export const DEFAULT_TTL_S = 300;

export const RELAY_CONFIG = defineConfig("@airm/kv-relay", {
  maxMb: opt(num({ positive: true }), {
    env: "AIRM_KV_TCP_MAX_MB",
    default: DEFAULT_MAX_MB,
    doc: "Relay byte cap in MiB. A push beyond it waits for space, then fails with TRANSPORT_NO_SPACE.",
  }),
  ttlS: opt(num({ min: 0 }), {
    env: "AIRM_KV_TCP_TTL_S",
    default: DEFAULT_TTL_S,
    doc: "Seconds an unreleased blob lives in the relay (nixl-ucx: an unread pushed slot) before it is dropped and counted.",
  }),
  crc: opt(flag(), {
    env: "AIRM_KV_TCP_CRC",
    default: true,
    doc: "0 skips the per-blob CRC-32 (computed by the pusher, checked by the relay and the receiver).",
  }),
  log: opt(flag(), {
    env: "AIRM_KV_TCP_LOG",
    default: false,
    doc: "1 logs size and SHA-256 of every blob pushed, stored or pulled (costly: audits only).",
  }),
  metricsPort: opt(int({ min: 0, max: 65535 }), {
    env: "AIRM_METRICS_PORT",
    defaultText: "none",
    doc: "Port of the relay's /metrics and /health HTTP server (also the gateway's airm_* metrics port).",
  }),
  reusePool: opt(flag(), {
    env: "AIRM_KV_TCP_POOL",
    default: true,
    internal: true,
    doc: "0 makes the relay allocate every blob buffer afresh instead of reusing pre-touched ones.",
  }),
  directReads: opt(flag(), {
    env: "AIRM_KV_TCP_DIRECT_READS",
    default: true,
    internal: true,
    doc: "0 makes the relay copy each received chunk into place instead of reading straight into the blob buffer.",
  }),
});

/**
 * What a relay user (the tcp transport, nixl-ucx's descriptor directory) needs: where the relay is,
 * the deployment's token to present to it and its TLS folder (rm-core's AIRM_INTERNAL_TOKEN and
 * AIRM_TLS_DIR, declared there, so a transport resolves them from the same environment as its
 * other options).
 */
export const RELAY_CLIENT_CONFIG = defineConfig("@airm/kv-relay", {
  addr: opt(hostPort(), {
    env: "AIRM_KV_TCP_ADDR",
    default: "127.0.0.1:7400",
    doc: "The relay's host:port the workers connect to (the chart's kvRelay Service; `airm up` sets it when it starts a relay).",
  }),
}).with(
  new ConfigSpec("@airm/rm-core", { internalToken: RM_CORE_CONFIG.options.internalToken, tlsDir: RM_CORE_CONFIG.options.tlsDir, tlsReloadS: RM_CORE_CONFIG.options.tlsReloadS }),
);
