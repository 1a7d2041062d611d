// The bench's reference: the smallest ext_proc server that answers like the picker (same protos,
// same messages, same stream order) but always with one fixed destination, so the gRPC
// round trip without any picking is measured in the same run.

import { Server, ServerCredentials, type ServerDuplexStream } from "@grpc/grpc-js";
import type { ProcessingResponse } from "../ext-proc-messages.ts";
import { serveProcessStream, type ProcessingRequest } from "../ext-proc-stream.ts";
import { silentLog } from "../log.ts";
import { protos } from "../protos.ts";

export interface FixedExtProc {
  address: string;
  close(): Promise<void>;
}

/** Starts it on 127.0.0.1 (a free port); every request goes to `destination`. */
export async function startFixedExtProc(destination: string): Promise<FixedExtProc> {
  const server = new Server({ "grpc.enable_channelz": 0 });
  const router = { route: () => ({ kind: "route" as const, destination, prefill: null }) };
  server.addService(protos().extProc.service, {
    Process: (call: ServerDuplexStream<ProcessingRequest, ProcessingResponse>) => serveProcessStream(call, router, { maxBodyBytes: 16 * 1024 * 1024, log: silentLog }),
  });
  const port = await new Promise<number>((resolve, reject) => server.bindAsync("127.0.0.1:0", ServerCredentials.createInsecure(), (e, p) => (e ? reject(e) : resolve(p))));
  return { address: `127.0.0.1:${port}`, close: () => new Promise<void>((resolve) => server.tryShutdown(() => resolve())) };
}
