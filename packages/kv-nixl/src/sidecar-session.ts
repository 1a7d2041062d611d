// The NIXL agent sidecar's two streams (sidecar-service.ts serves them): Session, a worker's duplex
// stream of watches of whole requests, cross-host lookups of blobs it waits for, and copy batches;
// Events, an arena owner's stream of what became of its publications (consumed, expired,
// released), whose end releases the owner's arenas.

import { status, type ServerDuplexStream, type ServerWritableStream } from "@grpc/grpc-js";
import { INTERNAL_TOKEN_HEADER, TransportTimeoutError, requestIdOf } from "@airm/rm-core";
import type { SidecarCore } from "./sidecar-core.ts";
import { RpcError, descriptorKey, fromAlloc, parseDescriptor, type PubRec, type SessionIn } from "./sidecar-records.ts";

/** One Session stream: its watches (by request id) and lookups, until it ends. */
class Session {
  private open = true;
  private readonly watches = new Map<string, () => void>();
  private readonly wanted = new Set<string>();

  constructor(
    private readonly core: SidecarCore,
    private readonly call: ServerDuplexStream<SessionIn, unknown>,
  ) {
    call.on("data", (m: SessionIn) => this.onData(m));
    const end = (): void => this.end();
    call.on("end", () => {
      end();
      call.end();
    });
    call.on("cancelled", end);
    call.on("error", end);
    call.on("close", end);
  }

  private send(m: unknown): void {
    if (this.open) this.call.write(m);
  }

  private onData(m: SessionIn): void {
    if (m.kind === "want" && m.want) this.want(m.want.key, m.want.timeout_ms);
    else if (m.kind === "watch" && m.watch) this.watch(m.watch.request_id, m.watch.timeout_ms);
    else if (m.kind === "unwatch") this.watches.get(m.request_id)?.();
    else if (m.kind === "copy" && m.copy) {
      const id = m.copy.id;
      this.core.copyBatch(m.copy.copies ?? [], m.copy.timeout_ms).then(
        (states) => this.send({ kind: "copied", copied: { id, states, code: 0, error: "" } }),
        (e: unknown) =>
          this.send({ kind: "copied", copied: { id, states: [], code: e instanceof RpcError ? e.code : status.INTERNAL, error: e instanceof Error ? e.message : String(e) } }),
      );
    }
  }

  private watch(rid: string, timeoutMs: number): void {
    this.watches.get(rid)?.();
    // the whole request: what is published now in one message, then each turn's new ones
    let ready: unknown[] = [];
    const item = (p: PubRec) => ({ key: p.key, src: fromAlloc(p.src), crc32: p.crc32 });
    const flush = (): void => {
      if (ready.length) this.send({ kind: "publications", request_id: rid, items: ready });
      ready = [];
    };
    const watcher = (p: PubRec): void => {
      ready.push(item(p));
      if (ready.length === 1) setImmediate(flush);
    };
    for (const p of this.core.pubs.values()) if (requestIdOf(p.key) === rid) ready.push(item(p));
    flush();
    const unwatch = this.core.watchRequest(rid, watcher);
    const stop = (): void => {
      clearTimeout(timer);
      unwatch();
      if (this.watches.get(rid) === stop) this.watches.delete(rid);
    };
    const timer = setTimeout(() => {
      stop();
      this.send({ kind: "watch_end", request_id: rid });
    }, timeoutMs);
    this.watches.set(rid, stop);
  }

  /** A blob the consumer waits for and this sidecar has not got: looked up in the relay (cross-host). */
  private want(key: string, timeoutMs: number): void {
    const { core } = this;
    const relay = core.relay;
    if (!relay || core.pubs.has(key) || this.wanted.has(key) || core.remotePubs.has(key)) return;
    this.wanted.add(key);
    const rid = requestIdOf(key);
    void (async () => {
      try {
        const d = parseDescriptor((await relay.pull(descriptorKey(key), { timeoutMs })).bytes, key);
        // published by this host's agent: the watch carries it; a watch that ended wants nothing
        if (d.agent === core.me || core.pubs.has(key) || !this.open || !this.watches.has(rid)) return;
        const src = await core.adoptRemote(key, d);
        this.send({ kind: "publications", request_id: rid, items: [{ key, src: fromAlloc(src), crc32: d.crc32 >>> 0 }] });
      } catch (e) {
        // not announced in time: the consumer's own timeout says so
        if (!(e instanceof TransportTimeoutError)) this.send({ kind: "want_failed", request_id: key, error: `looking up ${key} across hosts: ${(e as Error).message}` });
      } finally {
        this.wanted.delete(key);
      }
    })();
  }

  private end(): void {
    this.open = false;
    for (const stop of [...this.watches.values()]) stop();
  }
}

/** The Session handler: a worker's duplex stream (watch, unwatch, want, copy). */
export const sessionHandler =
  (core: SidecarCore) =>
  (call: ServerDuplexStream<SessionIn, unknown>): void => {
    if (!core.authorized(call.metadata)) {
      call.emit("error", { code: status.UNAUTHENTICATED, details: `the call lacks the deployment's ${INTERNAL_TOKEN_HEADER}` });
      return;
    }
    new Session(core, call);
  };

/** The Events handler: an arena owner's subscription; when its last one ends, the owner's arenas are released. */
export const eventsHandler =
  (core: SidecarCore) =>
  (call: ServerWritableStream<{ owner: string }, unknown>): void => {
    if (!core.authorized(call.metadata)) {
      call.emit("error", { code: status.UNAUTHENTICATED, details: `the call lacks the deployment's ${INTERNAL_TOKEN_HEADER}` });
      return;
    }
    const owner = call.request.owner;
    const set = core.subscribers.get(owner) ?? new Set();
    set.add(call);
    core.subscribers.set(owner, set);
    call.write({ kind: "subscribed", key: "", arena: 0, offset: "0" });
    const gone = (): void => {
      set.delete(call);
      if (set.size === 0) {
        core.subscribers.delete(owner);
        // the owner's process is gone (or closed): nothing of its arenas may stay registered
        void core.releaseOwner(owner);
      }
    };
    call.on("cancelled", gone);
    call.on("close", gone);
    call.on("error", gone);
  };
