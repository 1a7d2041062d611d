// airm-kv-nixl-agent: the one NIXL agent of a host (the seed's one-agent rule) behind a gRPC
// control API. Workers register their shared-memory arenas once, publish staged blobs, and bind /
// plan / submit / wait copies between allocations; the Python child (python-agent.ts) makes the
// NIXL calls. The route table is enforced at Plan. Bytes never cross gRPC. The state and its
// operations are in sidecar-core.ts, the gRPC service in sidecar-service.ts and sidecar-session.ts.

import { randomBytes } from "node:crypto";
import { rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { Server, ServerCredentials } from "@grpc/grpc-js";
import type { TlsMaterial } from "@airm/rm-core";
import { nixlAgentService } from "./protos.ts";
import { PythonAgent } from "./python-agent.ts";
import { SidecarCore } from "./sidecar-core.ts";
import { sidecarService } from "./sidecar-service.ts";

export { descriptorKey, type Descriptor } from "./sidecar-records.ts";

export interface SidecarOptions {
  /** host:port to listen on ("127.0.0.1:0" picks a port). */
  listen: string;
  python: string;
  /** NIXL agent name (default airm-<host>-<pid>). */
  agentName?: string;
  /** Seconds an unread publication lives. */
  ttlS?: number;
  /** The deployment's internal token: every call must carry it (x-airm-internal-token). */
  token?: string;
  /**
   * Copies between agents of different hosts: each publication is also announced in the relay at
   * `relay` (a descriptor under descriptorKey(key)), a pull of a blob not published here is looked
   * up there, and this sidecar READs it from the producer's agent, whose sidecar other hosts reach
   * at `peer` (its metadata, and the acknowledgement that frees the producer's slot).
   */
  crossHost?: { relay: string; peer: string; tls?: TlsMaterial };
  /** The Python agent's environment (UCX_* picks UCX's transports). */
  env?: Record<string, string | undefined>;
  log?: (line: string) => void;
}

/** The progress thread's poll timeout (µs) when peers READ from this agent: it sleeps on UCX's event fd in between. */
const PROGRESS_US = 100_000;

/** A running sidecar: its address, agent and a way to stop it. */
export interface Sidecar {
  readonly address: string;
  readonly agent: string;
  readonly instance: string;
  readonly pythonPid: number;
  /** Settles when the Python agent ends (the sidecar is then useless and should exit). */
  readonly agentExited: Promise<string>;
  close(): Promise<void>;
}

/** Starts the Python NIXL agent, taking file descriptors on `fdSocket`. */
function startAgent(opts: SidecarOptions, instance: string, fdSocket: string): Promise<PythonAgent> {
  return PythonAgent.start({
    python: opts.python,
    name: opts.agentName ?? `airm-${process.pid}-${instance}`,
    fdSocket,
    env: opts.env ?? {},
    progressUs: opts.crossHost ? PROGRESS_US : undefined,
  });
}

/** Serves `impl` on `listen`; the address bound (the port picked for port 0). */
async function serve(listen: string, impl: object): Promise<{ server: Server; address: string }> {
  const server = new Server();
  server.addService(nixlAgentService().service, impl as never);
  const port = await new Promise<number>((resolve, reject) => server.bindAsync(listen, ServerCredentials.createInsecure(), (e, p) => (e ? reject(e) : resolve(p))));
  const host = listen.slice(0, listen.lastIndexOf(":"));
  return { server, address: `${host}:${port}` };
}

export async function startSidecar(opts: SidecarOptions): Promise<Sidecar> {
  const log = opts.log ?? (() => undefined);
  const instance = randomBytes(6).toString("hex");
  const fdSocket = join(tmpdir(), `airm-nixl-agent-${process.pid}-${instance}.sock`);
  const py = await startAgent(opts, instance, fdSocket);
  const core = new SidecarCore(py, { instance, ttlMs: (opts.ttlS ?? 300) * 1000, token: opts.token, crossHost: opts.crossHost ?? null, log });
  const { server, address } = await serve(opts.listen, sidecarService(core));
  log(`NIXL agent ${core.me} (plugins ${py.hello.plugins.join(", ")}) serving on ${address}`);
  return {
    address,
    agent: core.me,
    instance,
    pythonPid: py.hello.pid,
    agentExited: py.exited,
    async close() {
      server.forceShutdown();
      core.close();
      await py.stop();
      rmSync(fdSocket, { force: true });
    },
  };
}
