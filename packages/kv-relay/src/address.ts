// "host:port" addresses of the relay: parsing (IPv6 in brackets) and formatting.

import { ConfigError } from "@airm/rm-core";

export const DEFAULT_ADDR = "127.0.0.1:7400";

export interface HostPort {
  host: string;
  port: number;
}

/** Parses "host:port" or "[v6]:port". Throws ConfigError naming `what`. */
export function parseHostPort(value: string, what: string): HostPort {
  const m = /^(?:\[([^\]]+)\]|([^:\s]+)):(\d{1,5})$/.exec(value.trim());
  const port = m ? Number(m[3]) : Number.NaN;
  if (!m || !(port >= 0 && port <= 65535)) {
    throw new ConfigError(what, `${JSON.stringify(value)} is not host:port (e.g. ${DEFAULT_ADDR}, or [::1]:7400)`);
  }
  return { host: m[1] ?? m[2], port };
}

export function formatHostPort(host: string, port: number): string {
  return host.includes(":") ? `[${host}]:${port}` : `${host}:${port}`;
}
