// Loads the trimmed .proto files under proto/ (Envoy's ext_proc and the gRPC health service)
// once per process, for the server and for the test client that plays Envoy.

import { fileURLToPath } from "node:url";
import { loadPackageDefinition, type GrpcObject, type ServiceClientConstructor, type ServiceDefinition } from "@grpc/grpc-js";
import { loadSync } from "@grpc/proto-loader";

/** The folder of the trimmed protos (google/protobuf/struct.proto comes bundled with protobufjs). */
export const PROTO_DIR = fileURLToPath(new URL("../proto", import.meta.url));

export const EXT_PROC_SERVICE = "envoy.service.ext_proc.v3.ExternalProcessor";
export const HEALTH_SERVICE = "grpc.health.v1.Health";

export interface Protos {
  extProc: ServiceClientConstructor;
  health: ServiceClientConstructor;
}

let loaded: Protos | undefined;

/** The two services (definitions on `.service`, clients by `new`). Bytes are Buffers, enums numbers, oneofs named in a virtual field. */
export function protos(): Protos {
  if (loaded) return loaded;
  const def = loadSync(["envoy/service/ext_proc/v3/external_processor.proto", "grpc/health/v1/health.proto"], {
    includeDirs: [PROTO_DIR],
    keepCase: true,
    longs: String,
    enums: Number,
    defaults: false,
    oneofs: true,
  });
  const root = loadPackageDefinition(def);
  const at = (name: string) => name.split(".").reduce<GrpcObject>((o, k) => o[k] as GrpcObject, root) as unknown as ServiceClientConstructor;
  loaded = { extProc: at(EXT_PROC_SERVICE), health: at(HEALTH_SERVICE) };
  return loaded;
}

export type { ServiceDefinition };
