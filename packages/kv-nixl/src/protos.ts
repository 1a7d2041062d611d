// Loads proto/nixl_agent.proto once per process, for the sidecar's server and the transport's client.

import { fileURLToPath } from "node:url";
import { loadPackageDefinition, type GrpcObject, type ServiceClientConstructor } from "@grpc/grpc-js";
import { loadSync } from "@grpc/proto-loader";

export const PROTO_FILE = fileURLToPath(new URL("../proto/nixl_agent.proto", import.meta.url));
export const SERVICE = "airm.kvnixl.v1.NixlAgent";

let loaded: ServiceClientConstructor | undefined;

/** The NixlAgent service: its definition on `.service`, a client by `new`. uint64 fields are strings. */
export function nixlAgentService(): ServiceClientConstructor {
  if (loaded) return loaded;
  const def = loadSync(PROTO_FILE, { keepCase: true, longs: String, enums: String, defaults: true });
  const root = loadPackageDefinition(def);
  loaded = SERVICE.split(".").reduce<GrpcObject>((o, k) => o[k] as GrpcObject, root) as unknown as ServiceClientConstructor;
  return loaded;
}

/** An Allocation message (offsets and lengths as strings on the wire: uint64). */
export interface AllocationMsg {
  tier: string;
  agent: string;
  arena: number;
  offset: string | number;
  length: string | number;
}
