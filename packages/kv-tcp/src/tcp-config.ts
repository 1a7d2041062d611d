// The tcp transport's settings from AIRM_KV_TCP_* variables, and "host:port" parsing. Each bad
// value is a ConfigError naming the variable; the relay and the client decide what to do with them.

import { ConfigError } from "@airm/rm-core";

export const DEFAULT_ADDR = "127.0.0.1:7400";
export const DEFAULT_MAX_MB = 1024;
export const DEFAULT_TTL_S = 300;

/** The variables this package reads, with what they mean (used by --help and the README). */
export const ENV_VARS: Record<string, string> = {
  AIRM_KV_TCP_ADDR: `relay address host:port the clients connect to (default ${DEFAULT_ADDR})`,
  AIRM_KV_TCP_MAX_MB: `relay byte cap in MiB (default ${DEFAULT_MAX_MB}); a push beyond it waits for space, then fails with TRANSPORT_NO_SPACE`,
  AIRM_KV_TCP_TTL_S: `seconds an unreleased blob lives in the relay (default ${DEFAULT_TTL_S})`,
  AIRM_KV_TCP_CRC: "0 skips the per-blob CRC-32 (computed by the pusher, checked by the relay and the receiver); default 1",
  AIRM_KV_TCP_LOG: "1 logs size and SHA-256 of every blob pushed or pulled (costly: audits only)",
  AIRM_KV_TCP_POOL: "0 makes the relay allocate every blob buffer afresh instead of reusing pre-touched ones (measurements only)",
  AIRM_KV_TCP_DIRECT_READS: "0 makes the relay copy each received chunk into place instead of reading straight into the blob buffer (measurements only)",
  AIRM_METRICS_PORT: "relay metrics/health HTTP port when --metrics-port is not given (unset: no metrics server)",
};

export interface HostPort {
  host: string;
  port: number;
}

/** Parses "host:port" or "[v6]:port". Throws ConfigError naming `what`. */
export function parseHostPort(value: string, what: string): HostPort {
  const m = /^(?:\[([^\]]+)\]|([^:\s]+)):(\d{1,5})$/.exec(value.trim());
  const port = m ? Number(m[3]) : NaN;
  if (!m || !(port >= 0 && port <= 65535)) {
    throw new ConfigError(what, `${JSON.stringify(value)} is not host:port (e.g. ${DEFAULT_ADDR}, or [::1]:7400)`);
  }
  return { host: m[1] ?? m[2], port };
}

export function formatHostPort(host: string, port: number): string {
  return host.includes(":") ? `[${host}]:${port}` : `${host}:${port}`;
}

/** A non-negative number from the environment, or `fallback` when unset/empty. */
export function envNumber(name: string, fallback: number, env: NodeJS.ProcessEnv = process.env): number {
  const raw = env[name];
  if (raw === undefined || raw.trim() === "") return fallback;
  const v = Number(raw);
  if (!Number.isFinite(v) || v < 0) throw new ConfigError(name, `${JSON.stringify(raw)} is not a non-negative number`);
  return v;
}

/** A 0/1 switch from the environment. */
export function envFlag(name: string, fallback: boolean, env: NodeJS.ProcessEnv = process.env): boolean {
  const raw = env[name];
  if (raw === undefined || raw.trim() === "") return fallback;
  const v = raw.trim().toLowerCase();
  if (["1", "true", "yes", "on"].includes(v)) return true;
  if (["0", "false", "no", "off"].includes(v)) return false;
  throw new ConfigError(name, `${JSON.stringify(raw)} is not 0 or 1`);
}
