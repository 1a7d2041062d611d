// The gRPC client of a host's NIXL agent sidecar, with the seed's copy API on top of the raw
// calls: bind(request, {src, dst, context}) -> plan -> submit -> wait (the completion fence).
// Every call has a deadline; a sidecar that does not answer is a TransportError, a refused route
// an UnsupportedError with the reason.

import { credentials, Metadata, status, type Client, type ClientDuplexStream, type ClientReadableStream, type ServiceError } from "@grpc/grpc-js";
import { INTERNAL_TOKEN_HEADER, TransportError, UnsupportedError } from "@airm/rm-core";
import { nixlAgentService, type AllocationMsg } from "./protos.ts";
import type { Tier } from "./routes.ts";

/** An allocation as callers give it (offsets and lengths in bytes). */
export interface Allocation {
  tier: Tier;
  agent: string;
  arena: number;
  offset: number;
  length: number;
}

export const toMsg = (a: Allocation): AllocationMsg => ({ ...a, offset: String(a.offset), length: String(a.length) });

export interface AgentHealth {
  agent: string;
  backends: string[];
  plugins: string[];
  arenas: number;
  publications: number;
  copies_in_flight: number;
  remote_agents: number;
  remote_publications: number;
  instance: string;
  python_pid: number;
  fd_socket: string;
  held_fds: number;
}

type Rpc = (req: unknown, md: Metadata, opts: { deadline: Date }, cb: (e: ServiceError | null, r: unknown) => void) => void;

export class NixlAgentClient {
  /** True after a call found the sidecar gone (UNAVAILABLE, past its deadline) or replaced by a new one. */
  unreachable = false;
  private readonly client: Client;

  constructor(
    readonly addr: string,
    private readonly token: string | undefined,
    private readonly rpcTimeoutMs = 5000,
  ) {
    this.client = new (nixlAgentService())(addr, credentials.createInsecure()) as Client;
  }

  private md(): Metadata {
    const md = new Metadata();
    if (this.token) md.set(INTERNAL_TOKEN_HEADER, this.token);
    return md;
  }

  /** One unary call; `extraMs` extends the deadline for calls that wait on purpose. */
  call(method: string, req: unknown, extraMs = 0): Promise<unknown> {
    const fn = (this.client as unknown as Record<string, Rpc>)[method].bind(this.client);
    return new Promise((resolve, reject) => {
      fn(req, this.md(), { deadline: new Date(Date.now() + this.rpcTimeoutMs + extraMs) }, (e, r) => {
        if (!e) {
          this.unreachable = false;
          return resolve(r);
        }
        reject(this.failure(method, e));
      });
    });
  }

  /** The typed error for a failed call (and whether the sidecar is gone or was replaced). */
  failure(method: string, err: Error): Error {
    const e = err as ServiceError;
    const details = e.details || e.message;
    if (e.code === status.UNAVAILABLE || e.code === status.DEADLINE_EXCEEDED) {
      this.unreachable = true;
      return new TransportError(
        `nixl: the NIXL agent sidecar at ${this.addr} did not answer ${method} (${details}); it is started by airm up (or the pod) and restarted when it dies`,
      );
    }
    if (/register the arena again|registered with an earlier sidecar/.test(details)) {
      // a restarted sidecar: it answers, but holds nothing of ours
      this.unreachable = true;
      return new TransportError(`nixl: ${method}: ${details}`);
    }
    if (e.code === status.FAILED_PRECONDITION && /refused/.test(details)) return new UnsupportedError(details);
    return new TransportError(`nixl: ${method}: ${details}`);
  }

  /** A consumer's session stream (watches and copy batches; see the proto), open until cancelled. */
  session(): ClientDuplexStream<unknown, unknown> {
    return (this.client as unknown as { Session: (md: Metadata) => ClientDuplexStream<unknown, unknown> }).Session(this.md());
  }

  /** Slot events for `owner` (read, released, expired) until cancelled. */
  events(owner: string, onEvent: (ev: { kind: string; key: string }) => void): ClientReadableStream<unknown> {
    const stream = (this.client as unknown as { Events: (req: unknown, md: Metadata) => ClientReadableStream<unknown> }).Events({ owner }, this.md());
    stream.on("data", onEvent);
    stream.on("error", () => undefined); // a dead sidecar surfaces on the next call
    return stream;
  }

  /**
   * Waits up to `timeoutMs` for the sidecar to accept connections (it may start beside the
   * worker and take a few seconds to load NIXL). Throws TransportError naming the address.
   */
  ready(timeoutMs: number): Promise<void> {
    return new Promise((resolve, reject) =>
      this.client.waitForReady(new Date(Date.now() + timeoutMs), (e) =>
        e
          ? reject(
              new TransportError(`nixl: no NIXL agent sidecar answered at ${this.addr} within ${timeoutMs} ms (${e.message}); airm up starts it, a pod runs it beside the workers`),
            )
          : resolve(),
      ),
    );
  }

  async health(): Promise<AgentHealth> {
    return (await this.call("Health", {})) as AgentHealth;
  }

  /** Binds `src` and `dst` to `requestId` (same length); `context` names the copy (the blob key). */
  async bind(requestId: string, b: { src: Allocation | AllocationMsg; dst: Allocation | AllocationMsg; context?: string }): Promise<string> {
    const m = (a: Allocation | AllocationMsg): AllocationMsg => (typeof a.offset === "number" ? toMsg(a as Allocation) : (a as AllocationMsg));
    const r = (await this.call("Bind", { request_id: requestId, src: m(b.src), dst: m(b.dst), context: b.context ?? "" })) as { binding: string };
    return r.binding;
  }

  /** Plans the request's bound copies (or only `bindings`): the route table is checked here. */
  async plan(requestId: string, bindings: string[] = []): Promise<{ plan: string; routes: string[]; bytes: number; copies: number }> {
    const r = (await this.call("Plan", { request_id: requestId, bindings })) as { plan: string; routes: string[]; bytes: string; copies: number };
    return { ...r, bytes: Number(r.bytes) };
  }

  async submit(plan: string): Promise<string> {
    return ((await this.call("Submit", { plan })) as { handle: string }).handle;
  }

  /** The fence: "DONE", "ERROR" (with the reason) or "PENDING" when `timeoutMs` passed first. */
  async wait(handle: string, timeoutMs: number): Promise<{ state: "DONE" | "ERROR" | "PENDING"; reason: string }> {
    const t = Math.max(0, Math.round(timeoutMs));
    return (await this.call("Wait", { handle, timeout_ms: t }, t)) as { state: "DONE" | "ERROR" | "PENDING"; reason: string };
  }

  async release(requestId: string): Promise<number> {
    return ((await this.call("Release", { request_id: requestId })) as { released: number }).released;
  }

  close(): void {
    this.client.close();
  }
}
