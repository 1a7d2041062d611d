// What a picker routes to: a model-server endpoint (address, port, role, name, where its worker's
// KV events are). Where endpoints come from is an EndpointSource's business (endpoint-source.ts).

/** What an endpoint serves: the prefill half, the decode half, or whole requests. */
export type Role = "prefill" | "decode" | "both";

export const ROLES: readonly Role[] = ["prefill", "decode", "both"];

export interface Endpoint {
  /** IP address (or host name) Envoy connects to. */
  address: string;
  port: number;
  role: Role;
  /** A name for logs and metrics (the pod name in Kubernetes). */
  name: string;
  /** Where its worker publishes KV events (tcp://host:port or ipc://path), for --routing prefix; else the --kv-events-port convention. */
  kvEvents?: string;
  /** Its replay endpoint (null: none); else the --kv-replay-port convention. */
  kvReplay?: string | null;
}

/** "address:port" ("[v6]:port" for IPv6 addresses), the endpoint's identity everywhere. */
export function hostPortOf(e: { address: string; port: number }): string {
  return e.address.includes(":") ? `[${e.address}]:${e.port}` : `${e.address}:${e.port}`;
}

/** True when an endpoint of `role` can be a request's destination (it decodes). */
export function decodes(role: Role): boolean {
  return role === "decode" || role === "both";
}
