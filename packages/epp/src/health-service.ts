// grpc.health.v1.Health for the picker: SERVING once its endpoint source has loaded and until it
// stops, for the whole server ("") and for the ext_proc service by name; Check answers once,
// Watch streams each change. An unknown service name is NOT_FOUND (Check) or SERVICE_UNKNOWN
// (Watch), as the health protocol says.

import { status as grpcStatus, type ServerUnaryCall, type ServerWritableStream, type sendUnaryData, type UntypedServiceImplementation } from "@grpc/grpc-js";
import { EXT_PROC_SERVICE } from "./protos.ts";

/** grpc.health.v1.HealthCheckResponse.ServingStatus */
export const SERVING_STATUS = { UNKNOWN: 0, SERVING: 1, NOT_SERVING: 2, SERVICE_UNKNOWN: 3 } as const;

const SERVICES = new Set(["", EXT_PROC_SERVICE]);

export class HealthService {
  private serving = false;
  private readonly watchers = new Set<ServerWritableStream<{ service?: string }, { status: number }>>();

  /** Sets the status of every known service and tells the watchers. */
  setServing(serving: boolean): void {
    if (serving === this.serving) return;
    this.serving = serving;
    for (const w of this.watchers) w.write({ status: this.status() });
  }

  /** Ends every Watch stream (at shutdown). */
  endWatches(): void {
    for (const w of this.watchers) w.end();
    this.watchers.clear();
  }

  private status(): number {
    return this.serving ? SERVING_STATUS.SERVING : SERVING_STATUS.NOT_SERVING;
  }

  /** The handlers to add to a grpc-js Server with the Health service definition. */
  implementation(): UntypedServiceImplementation {
    return {
      Check: (call: ServerUnaryCall<{ service?: string }, { status: number }>, callback: sendUnaryData<{ status: number }>) => {
        const service = call.request.service ?? "";
        if (!SERVICES.has(service)) return callback({ code: grpcStatus.NOT_FOUND, details: `unknown service ${JSON.stringify(service)}` });
        callback(null, { status: this.status() });
      },
      Watch: (call: ServerWritableStream<{ service?: string }, { status: number }>) => {
        const service = call.request.service ?? "";
        if (!SERVICES.has(service)) {
          call.write({ status: SERVING_STATUS.SERVICE_UNKNOWN });
          return;
        }
        call.write({ status: this.status() });
        this.watchers.add(call);
        call.on("cancelled", () => this.watchers.delete(call));
      },
    };
  }
}
