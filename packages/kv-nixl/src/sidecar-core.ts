// The NIXL agent sidecar's state (sidecar.ts) and what it does with it: the registered arenas,
// publications and their watchers, bound / planned / submitted copies and their NIXL transfers
// (the Python child makes the calls), the route table checked at plan, and, cross-host, the other
// hosts' agents and publications this one READs (announced in the relay, acknowledged to their
// sidecars).

import { status, type Metadata, type ServerWritableStream } from "@grpc/grpc-js";
import { INTERNAL_TOKEN_HEADER, requestIdOf, sameSecret, type TlsMaterial } from "@airm/rm-core";
import { RelayClient } from "@airm/kv-relay";
import { NixlAgentClient } from "./agent-client.ts";
import type { PythonAgent } from "./python-agent.ts";
import { routeFor } from "./routes.ts";
import {
  RpcError,
  descriptorKey,
  fromAlloc,
  toAlloc,
  type Alloc,
  type ArenaRec,
  type BindRec,
  type CopyMsg,
  type Descriptor,
  type HandleRec,
  type PlanRec,
  type PubRec,
  type PublishMsg,
} from "./sidecar-records.ts";

/** How long announcing a descriptor in the relay, and each call to a peer sidecar, may take (ms). */
const CROSS_HOST_TIMEOUT_MS = 10_000;

export interface CoreOptions {
  /** This start of the sidecar (publications and acknowledgements name it). */
  instance: string;
  /** Milliseconds an unread publication lives. */
  ttlMs: number;
  /** The deployment's internal token (calls in and to peer sidecars carry it). */
  token?: string;
  /** `tls`: the relay is reached over mutual TLS with it (AIRM_TLS_DIR). */
  crossHost: { relay: string; peer: string; tls?: TlsMaterial } | null;
  log: (line: string) => void;
}

/** The sidecar's state around its Python NIXL agent `py`; the gRPC service (sidecar-service.ts) drives it. */
export class SidecarCore {
  /** This host's NIXL agent. */
  readonly me: string;
  readonly instance: string;
  readonly cross: { relay: string; peer: string; tls?: TlsMaterial } | null;
  readonly arenas = new Map<number, ArenaRec>();
  readonly pubs = new Map<string, PubRec>();
  /** Watchers of a whole request (WatchRequest.request_id), told of each publication of it. */
  readonly requestWatchers = new Map<string, Set<(p: PubRec) => void>>();
  readonly binds = new Map<string, BindRec[]>();
  readonly plans = new Map<bigint, PlanRec>();
  readonly handles = new Map<bigint, HandleRec>();
  readonly subscribers = new Map<string, Set<ServerWritableStream<unknown, unknown>>>();
  readonly relay: RelayClient | null;
  /** Remote agents added to ours, by name: from which sidecar (peer, instance) and generation. */
  readonly remotes = new Map<string, { peer: string; instance: string; gen: number; ready: Promise<void> }>();
  /** Publications of other hosts handed to a consumer here, by key, until read, released or expired. */
  readonly remotePubs = new Map<string, { desc: Descriptor; src: Alloc; at: number }>();
  /** Submitted copies by NIXL transfer id, until the agent reports them. */
  readonly inflight = new Map<number, HandleRec>();
  private readonly peerClients = new Map<string, NixlAgentClient>();
  /** Publications of other hosts read to the end, per peer sidecar: acknowledged once per turn. */
  private readonly acks = new Map<string, { instance: string; items: unknown[] }[]>();
  private nextId = 1n;
  /** Metadata generation: +1 per registered arena (a peer holding an older one adds it again). */
  private gen = 0;
  private readonly sweep: NodeJS.Timeout;
  private readonly ttlMs: number;
  private readonly token: string | undefined;
  readonly log: (line: string) => void;

  constructor(
    readonly py: PythonAgent,
    o: CoreOptions,
  ) {
    this.me = py.hello.agent;
    this.instance = o.instance;
    this.ttlMs = o.ttlMs;
    this.token = o.token;
    this.cross = o.crossHost;
    this.log = o.log;
    this.relay = this.cross ? RelayClient.connect(this.cross.relay, { connections: 1, token: o.token, tls: this.cross.tls }) : null;
    py.onTransfer((e) => {
      const h = this.inflight.get(e.xfer);
      if (!h) return;
      this.inflight.delete(e.xfer);
      this.finish(h, e.state === "DONE" ? "DONE" : "ERROR", e.error ?? "");
    });
    void py.exited.then((why) => {
      for (const h of this.inflight.values()) this.finish(h, "ERROR", `the NIXL agent process ended (${why})`);
      this.inflight.clear();
      this.log(`the NIXL agent process ended (${why})`);
    });
    this.sweep = setInterval(() => this.expire(), 1000);
    this.sweep.unref();
  }

  /** Stops the sweep and closes the relay and peer sidecar clients (the agent is stopped by its owner). */
  close(): void {
    clearInterval(this.sweep);
    this.relay?.close();
    for (const c of this.peerClients.values()) c.close();
  }

  newId(): bigint {
    return this.nextId++;
  }

  /** Whether a call carries the deployment's token (any call does when there is none). */
  authorized(md: Metadata): boolean {
    if (!this.token) return true;
    const got = md.get(INTERNAL_TOKEN_HEADER)[0];
    return typeof got === "string" && sameSecret(this.token, got);
  }

  /** Keeps an arena the agent registered (a new metadata generation). */
  addArena(a: ArenaRec): void {
    this.arenas.set(a.id, a);
    this.gen++;
  }

  // --- cross-host -------------------------------------------------------------------------------

  peer(addr: string): NixlAgentClient {
    let c = this.peerClients.get(addr);
    if (!c) this.peerClients.set(addr, (c = new NixlAgentClient(addr, this.token, CROSS_HOST_TIMEOUT_MS)));
    return c;
  }

  dropRemote(name: string): void {
    if (!this.remotes.delete(name)) return;
    void this.py.call("remove_remote", { agent: name }).catch(() => undefined);
  }

  /** Adds `d`'s agent (its metadata from its sidecar) once, and again when it registered arenas since. */
  ensureRemote(d: Descriptor): Promise<void> {
    const have = this.remotes.get(d.agent);
    if (have && have.gen >= d.gen) return have.ready;
    // another agent of the same sidecar address: that sidecar restarted, its old agent is gone
    for (const [name, r] of [...this.remotes]) if (r.peer === d.peer && r.instance !== d.instance) this.dropRemote(name);
    const ready = (async () => {
      const m = (await this.peer(d.peer).call("Metadata", {})) as { agent: string; metadata: Buffer };
      if (m.agent !== d.agent) throw new RpcError(status.UNAVAILABLE, `the sidecar at ${d.peer} runs agent ${m.agent}, not ${d.agent} (it was restarted)`);
      await this.py.call("add_remote", { metadata: Buffer.from(m.metadata).toString("base64") });
    })();
    const rec = { peer: d.peer, instance: d.instance, gen: d.gen, ready };
    this.remotes.set(d.agent, rec);
    ready.catch(() => {
      if (this.remotes.get(d.agent) === rec) this.remotes.delete(d.agent);
    });
    return ready;
  }

  /** Hands another host's publication `key` (its descriptor `d`) to a consumer here: its agent added, its source in that agent's memory. */
  async adoptRemote(key: string, d: Descriptor): Promise<Alloc> {
    await this.ensureRemote(d);
    const src: Alloc = { ...toAlloc(d.src, key), agent: d.agent, offset: BigInt(d.base) + BigInt(d.src.offset) };
    this.remotePubs.set(key, { desc: d, src, at: Date.now() });
    return src;
  }

  private ack(d: Descriptor, key: string): void {
    const list = this.acks.get(d.peer) ?? [];
    if (list.length === 0 && this.acks.size === 0) setImmediate(() => this.flushAcks());
    let a = list.find((x) => x.instance === d.instance);
    if (!a) list.push((a = { instance: d.instance, items: [] }));
    a.items.push({ key, src: d.src, crc32: d.crc32 });
    this.acks.set(d.peer, list);
  }

  private flushAcks(): void {
    for (const [addr, list] of this.acks) {
      for (const a of list)
        this.peer(addr)
          .call("Consumed", a)
          .catch((e: Error) => this.log(`telling ${addr} that ${a.items.length} blob(s) were read failed: ${e.message}`));
    }
    this.acks.clear();
  }

  /** Announces a publication in the relay, where other hosts' sidecars look for it. */
  private announce(p: PubRec): void {
    const { relay, cross } = this;
    if (!relay || !cross) return;
    const arena = this.arenas.get(p.src.arena);
    if (!arena) return;
    const d: Descriptor = { v: 1, agent: this.me, instance: this.instance, gen: this.gen, peer: cross.peer, base: arena.base.toString(), src: fromAlloc(p.src), crc32: p.crc32 };
    relay
      .push(descriptorKey(p.key), Buffer.from(JSON.stringify(d)), { timeoutMs: CROSS_HOST_TIMEOUT_MS })
      .catch((e: Error) => this.log(`announcing ${p.key} in the relay at ${relay.address} failed: ${e.message}`));
  }

  // --- publications -----------------------------------------------------------------------------

  private emit(owner: string, kind: string, key: string, a: Alloc): void {
    for (const s of this.subscribers.get(owner) ?? []) s.write({ kind, key, arena: a.arena, offset: a.offset.toString() });
  }

  dropPub(key: string, kind: string | null): void {
    const p = this.pubs.get(key);
    if (!p) return;
    this.pubs.delete(key);
    if (kind) this.emit(p.owner, kind, key, p.src);
  }

  publish(req: PublishMsg): void {
    if (req.instance !== this.instance)
      throw new RpcError(status.FAILED_PRECONDITION, `publication made for sidecar instance ${req.instance}, this is ${this.instance}: register the arena again`);
    const src = toAlloc(req.src, `publish ${req.key}`);
    this.addressOf(src, `publish ${req.key}`);
    const arena = this.arenas.get(src.arena)!;
    const rec: PubRec = { key: req.key, src, crc32: req.crc32 >>> 0, at: Date.now(), owner: arena.owner };
    this.pubs.set(req.key, rec);
    for (const w of this.requestWatchers.get(requestIdOf(req.key)) ?? []) w(rec);
    this.announce(rec);
  }

  /** Tells `watcher` of each publication of request `rid` from now on; the function returned stops that. */
  watchRequest(rid: string, watcher: (p: PubRec) => void): () => void {
    const set = this.requestWatchers.get(rid) ?? new Set();
    set.add(watcher);
    this.requestWatchers.set(rid, set);
    return () => {
      set.delete(watcher);
      if (set.size === 0 && this.requestWatchers.get(rid) === set) this.requestWatchers.delete(rid);
    };
  }

  /** Drops the expired publications (this host's, whose owners hear it, and other hosts'). */
  private expire(): void {
    const now = Date.now();
    for (const [key, p] of this.pubs) if (now - p.at > this.ttlMs) this.dropPub(key, "expired");
    for (const [key, r] of this.remotePubs) if (now - r.at > this.ttlMs) this.remotePubs.delete(key);
  }

  // --- copies -----------------------------------------------------------------------------------

  private finish(h: HandleRec, state: "DONE" | "ERROR", reason: string, released = false): void {
    if (h.state !== "PENDING") return;
    h.state = state;
    h.reason = reason;
    if (state === "DONE") {
      // a publication read to the end is consumed: its owner may reuse the slot (another host's
      // owner once its sidecar hears it)
      for (const c of h.plan.copies) {
        const p = this.pubs.get(c.context);
        if (p && p.src.arena === c.src.arena && p.src.offset === c.src.offset) this.dropPub(c.context, "consumed");
        const r = this.remotePubs.get(c.context);
        if (r && r.src.agent === c.src.agent && r.src.offset === c.src.offset) {
          this.remotePubs.delete(c.context);
          this.ack(r.desc, c.context);
        }
      }
    } else if (!released) {
      // a failed READ from another host: its metadata is fetched again before the next one
      for (const c of h.plan.copies) if (c.src.agent !== this.me) this.dropRemote(c.src.agent);
    }
    for (const w of h.waiters.splice(0)) w();
  }

  addressOf(a: Alloc, what: string): bigint {
    if (a.agent !== this.me) {
      if (!this.cross)
        throw new RpcError(
          status.UNIMPLEMENTED,
          `${what}: allocation of agent ${a.agent}; this sidecar copies between arenas of its own agent ${this.me} only (one agent per host; AIRM_KV_NIXL_CROSS_HOST=1 reads from other hosts' agents)`,
        );
      // another host's agent: `offset` is the address in its registered memory (NIXL checks it)
      if (!this.remotes.has(a.agent))
        throw new RpcError(status.NOT_FOUND, `${what}: agent ${a.agent} is not a remote agent known here (its publication was not looked up here, or its sidecar restarted)`);
      return a.offset;
    }
    const arena = this.arenas.get(a.arena);
    if (!arena) throw new RpcError(status.NOT_FOUND, `${what}: arena ${a.arena} is not registered here (released, or registered with an earlier sidecar)`);
    if (a.length <= 0n || a.offset < 0n || a.offset + a.length > arena.bytes) {
      throw new RpcError(status.OUT_OF_RANGE, `${what}: [${a.offset}, ${a.offset + a.length}) lies outside arena ${a.arena} of ${arena.bytes} bytes`);
    }
    return arena.base + a.offset;
  }

  /** Checks each bound copy's route (the seed's table) and plans them as one transfer. */
  planCopies(requestId: string, list: BindRec[]): { plan: PlanRec; routes: string[] } {
    const routes = new Set<string>();
    for (const b of list) {
      try {
        routes.add(routeFor(b.src.tier, b.dst.tier, this.py.hello.plugins).name);
      } catch (e) {
        throw new RpcError(status.FAILED_PRECONDITION, (e as Error).message);
      }
    }
    for (const b of list) b.planned = true;
    return { plan: { id: this.nextId++, requestId, copies: list, bytes: list.reduce((s, b) => s + b.src.length, 0n) }, routes: [...routes] };
  }

  /** Submits a plan as one NIXL READ; the handle settles with it (its id is the transfer's). */
  async submitPlan(p: PlanRec): Promise<HandleRec> {
    const sources = new Set(p.copies.map((c) => c.src.agent));
    if (sources.size !== 1) throw new RpcError(status.FAILED_PRECONDITION, `submit: a plan READs from one agent, this one from ${[...sources].join(", ")}`);
    const remote = [...sources][0]!;
    for (const c of p.copies) {
      if (c.dst.agent !== this.me)
        throw new RpcError(status.FAILED_PRECONDITION, `submit: ${c.context} would land in agent ${c.dst.agent}'s memory; a READ lands in this agent's (${this.me})`);
    }
    if (remote !== this.me) await this.remotes.get(remote)?.ready;
    const copies = p.copies.map((c) => [this.addressOf(c.dst, "submit dst").toString(), this.addressOf(c.src, "submit src").toString(), Number(c.src.length)]);
    const h: HandleRec = { id: this.nextId++, plan: p, state: "PENDING", reason: "", waiters: [] };
    this.handles.set(h.id, h);
    const xfer = Number(h.id);
    this.inflight.set(xfer, h);
    try {
      const r = await this.py.call("read", { xfer, remote, copies });
      if (r.state === "DONE" && this.inflight.get(xfer) === h) {
        this.inflight.delete(xfer);
        this.finish(h, "DONE", "");
      }
    } catch (e) {
      this.inflight.delete(xfer);
      this.handles.delete(h.id);
      if (remote !== this.me) this.dropRemote(remote);
      throw new RpcError(status.INTERNAL, (e as Error).message);
    }
    return h;
  }

  /** Resolves once `h` settled or `timeoutMs` passed; a settled handle is forgotten. */
  async settled(h: HandleRec, timeoutMs: number): Promise<void> {
    if (h.state === "PENDING") {
      await new Promise<void>((resolve) => {
        const t = setTimeout(resolve, timeoutMs);
        h.waiters.push(() => {
          clearTimeout(t);
          resolve();
        });
      });
    }
    if (h.state !== "PENDING") this.handles.delete(h.id);
  }

  /** Binds, plans (routes), submits and fences a batch: one NIXL transfer per request id in it (a release drops its own copies only). */
  async copyBatch(copies: CopyMsg[], timeoutMs: number): Promise<{ state: string; reason: string }[]> {
    const byRequest = new Map<string, BindRec[]>();
    const order: BindRec[] = [];
    for (const c of copies) {
      const src = toAlloc(c.src, `copy ${c.context}`);
      const dst = toAlloc(c.dst, `copy ${c.context}`);
      if (src.length !== dst.length) throw new RpcError(status.INVALID_ARGUMENT, `copy ${c.context}: src holds ${src.length} bytes and dst ${dst.length}`);
      const b: BindRec = { id: this.nextId++, src, dst, context: c.context, planned: false };
      // one transfer per request and source agent (a NIXL READ names one remote agent)
      const group = `${c.request_id}\n${src.agent}`;
      const list = byRequest.get(group) ?? [];
      list.push(b);
      byRequest.set(group, list);
      order.push(b);
    }
    const handleOf = new Map<BindRec, HandleRec>();
    for (const [group, list] of byRequest) {
      const h = await this.submitPlan(this.planCopies(group.slice(0, group.indexOf("\n")), list).plan);
      for (const b of list) handleOf.set(b, h);
    }
    await Promise.all([...new Set(handleOf.values())].map((h) => this.settled(h, timeoutMs)));
    return order.map((b) => ({ state: handleOf.get(b)!.state, reason: handleOf.get(b)!.reason }));
  }

  // --- release ----------------------------------------------------------------------------------

  async releaseRequest(rid: string): Promise<number> {
    let n = 0;
    for (const key of [...this.pubs.keys()]) {
      if (requestIdOf(key) === rid) {
        this.dropPub(key, "released");
        n++;
      }
    }
    for (const key of [...this.remotePubs.keys()]) if (requestIdOf(key) === rid) this.remotePubs.delete(key);
    // the request's descriptors in the relay (cross-host) go with it
    this.relay?.release(rid).catch((e: Error) => this.log(`releasing ${rid} in the relay failed: ${e.message}`));
    n += this.binds.get(rid)?.length ?? 0;
    this.binds.delete(rid);
    for (const [id, p] of this.plans) if (p.requestId === rid) this.plans.delete(id);
    for (const [id, h] of this.handles) {
      if (h.plan.requestId !== rid) continue;
      this.handles.delete(id);
      if (this.inflight.delete(Number(id))) await this.py.call("cancel", { xfer: Number(id) }).catch(() => undefined);
      this.finish(h, "ERROR", `request ${rid} was released`, true);
    }
    return n;
  }

  async releaseOwner(owner: string): Promise<void> {
    for (const [key, p] of this.pubs) if (p.owner === owner) this.pubs.delete(key);
    for (const a of [...this.arenas.values()]) {
      if (a.owner !== owner) continue;
      this.arenas.delete(a.id);
      await this.py.call("deregister", { arena: a.id }).catch(() => undefined);
    }
  }
}
