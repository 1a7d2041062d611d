// airm-kv-nixl-agent: the one NIXL agent of a host (the seed's one-agent rule) behind a gRPC
// control API. Workers register their shared-memory arenas once, publish staged blobs, and bind /
// plan / submit / wait copies between allocations; the Python child (python-agent.ts) makes the
// NIXL calls. The route table is enforced at Plan. Bytes never cross gRPC.

import { randomBytes } from "node:crypto";
import { rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { Server, ServerCredentials, status, type Metadata, type ServerDuplexStream, type ServerUnaryCall, type ServerWritableStream, type sendUnaryData } from "@grpc/grpc-js";
import { INTERNAL_TOKEN_HEADER, TransportTimeoutError, requestIdOf, sameSecret } from "@airm/rm-core";
import { RelayClient } from "@airm/kv-relay";
import { NixlAgentClient } from "./agent-client.ts";
import { nixlAgentService, type AllocationMsg } from "./protos.ts";
import { PythonAgent } from "./python-agent.ts";
import { routeFor } from "./routes.ts";

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
  crossHost?: { relay: string; peer: string };
  /** The Python agent's environment (UCX_* picks UCX's transports). */
  env?: Record<string, string | undefined>;
  log?: (line: string) => void;
}

interface PublishMsg {
  key: string;
  src: AllocationMsg;
  crc32: number;
  instance: string;
}
interface CopyMsg {
  request_id: string;
  src: AllocationMsg;
  dst: AllocationMsg;
  context: string;
}
interface SessionIn {
  kind: string;
  watch: { request_id: string; timeout_ms: number } | null;
  request_id: string;
  copy: { id: string; copies: CopyMsg[]; timeout_ms: number } | null;
  want: { key: string; timeout_ms: number } | null;
}
interface ArenaRec {
  id: number;
  path: string;
  bytes: bigint;
  base: bigint;
  owner: string;
}
interface Alloc {
  tier: string;
  agent: string;
  arena: number;
  offset: bigint;
  length: bigint;
}
/** What a producer's sidecar announces in the relay for each publication (cross-host). */
export interface Descriptor {
  v: 1;
  /** The producer's agent, its sidecar's instance and metadata generation (+1 per registered arena). */
  agent: string;
  instance: string;
  gen: number;
  /** host:port of the producer's sidecar (Metadata, Consumed). */
  peer: string;
  /** Address of the arena's first byte in the producer's agent. */
  base: string;
  src: AllocationMsg;
  crc32: number;
}

/** The relay key of `key`'s descriptor (same request id, so releasing the request drops it). */
export const descriptorKey = (key: string): string => `${key}/nixl-desc`;

/** How long announcing a descriptor in the relay, and each call to a peer sidecar, may take (ms). */
const CROSS_HOST_TIMEOUT_MS = 10_000;
/** The progress thread's poll timeout (µs) when peers READ from this agent: it sleeps on UCX's event fd in between. */
const PROGRESS_US = 100_000;

function parseDescriptor(raw: Uint8Array, key: string): Descriptor {
  const d = JSON.parse(Buffer.from(raw).toString("utf8")) as Descriptor;
  if (d?.v !== 1 || typeof d.agent !== "string" || typeof d.peer !== "string" || typeof d.base !== "string" || typeof d.src !== "object" || typeof d.crc32 !== "number")
    throw new RpcError(status.DATA_LOSS, `the relay's descriptor of ${key} is not a kv-nixl descriptor (v1)`);
  return d;
}

interface PubRec {
  key: string;
  src: Alloc;
  crc32: number;
  at: number;
  owner: string;
}
interface BindRec {
  id: bigint;
  src: Alloc;
  dst: Alloc;
  context: string;
  planned: boolean;
}
interface PlanRec {
  id: bigint;
  requestId: string;
  copies: BindRec[];
  bytes: bigint;
}
interface HandleRec {
  id: bigint;
  plan: PlanRec;
  state: "PENDING" | "DONE" | "ERROR";
  reason: string;
  waiters: (() => void)[];
}
type Unary<Req, Res> = (call: ServerUnaryCall<Req, Res>, cb: sendUnaryData<Res>) => void;

class RpcError extends Error {
  constructor(
    readonly code: status,
    message: string,
  ) {
    super(message);
  }
}

const toAlloc = (m: AllocationMsg | undefined, what: string): Alloc => {
  if (!m) throw new RpcError(status.INVALID_ARGUMENT, `${what}: an allocation is required`);
  return { tier: m.tier, agent: m.agent, arena: Number(m.arena), offset: BigInt(m.offset), length: BigInt(m.length) };
};
const fromAlloc = (a: Alloc): AllocationMsg => ({ tier: a.tier, agent: a.agent, arena: a.arena, offset: a.offset.toString(), length: a.length.toString() });

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

export async function startSidecar(opts: SidecarOptions): Promise<Sidecar> {
  const log = opts.log ?? (() => undefined);
  const instance = randomBytes(6).toString("hex");
  const fdSocket = join(tmpdir(), `airm-nixl-agent-${process.pid}-${instance}.sock`);
  const cross = opts.crossHost ?? null;
  const py = await PythonAgent.start({
    python: opts.python,
    name: opts.agentName ?? `airm-${process.pid}-${instance}`,
    fdSocket,
    env: opts.env ?? {},
    progressUs: cross ? PROGRESS_US : undefined,
  });
  const me = py.hello.agent;
  const ttlMs = (opts.ttlS ?? 300) * 1000;
  const arenas = new Map<number, ArenaRec>();
  const pubs = new Map<string, PubRec>();
  /** Watchers of a whole request (WatchRequest.request_id), told of each publication of it. */
  const requestWatchers = new Map<string, Set<(p: PubRec) => void>>();
  const binds = new Map<string, BindRec[]>();
  const plans = new Map<bigint, PlanRec>();
  const handles = new Map<bigint, HandleRec>();
  const subscribers = new Map<string, Set<ServerWritableStream<unknown, unknown>>>();
  let nextId = 1n;
  /** Metadata generation: +1 per registered arena (a peer holding an older one adds it again). */
  let gen = 0;

  // --- cross-host -------------------------------------------------------------------------------
  const relay = cross ? RelayClient.connect(cross.relay, { connections: 1, token: opts.token }) : null;
  /** Remote agents added to ours, by name: from which sidecar (peer, instance) and generation. */
  const remotes = new Map<string, { peer: string; instance: string; gen: number; ready: Promise<void> }>();
  /** Publications of other hosts handed to a consumer here, by key, until read, released or expired. */
  const remotePubs = new Map<string, { desc: Descriptor; src: Alloc; at: number }>();
  const peerClients = new Map<string, NixlAgentClient>();
  const peer = (addr: string): NixlAgentClient => {
    let c = peerClients.get(addr);
    if (!c) peerClients.set(addr, (c = new NixlAgentClient(addr, opts.token, CROSS_HOST_TIMEOUT_MS)));
    return c;
  };
  const dropRemote = (name: string): void => {
    if (!remotes.delete(name)) return;
    void py.call("remove_remote", { agent: name }).catch(() => undefined);
  };
  /** Adds `d`'s agent (its metadata from its sidecar) once, and again when it registered arenas since. */
  const ensureRemote = (d: Descriptor): Promise<void> => {
    const have = remotes.get(d.agent);
    if (have && have.gen >= d.gen) return have.ready;
    // another agent of the same sidecar address: that sidecar restarted, its old agent is gone
    for (const [name, r] of [...remotes]) if (r.peer === d.peer && r.instance !== d.instance) dropRemote(name);
    const ready = (async () => {
      const m = (await peer(d.peer).call("Metadata", {})) as { agent: string; metadata: Buffer };
      if (m.agent !== d.agent) throw new RpcError(status.UNAVAILABLE, `the sidecar at ${d.peer} runs agent ${m.agent}, not ${d.agent} (it was restarted)`);
      await py.call("add_remote", { metadata: Buffer.from(m.metadata).toString("base64") });
    })();
    const rec = { peer: d.peer, instance: d.instance, gen: d.gen, ready };
    remotes.set(d.agent, rec);
    ready.catch(() => {
      if (remotes.get(d.agent) === rec) remotes.delete(d.agent);
    });
    return ready;
  };
  /** Publications of other hosts read to the end, per peer sidecar: acknowledged once per turn. */
  const acks = new Map<string, { instance: string; items: unknown[] }[]>();
  const ack = (d: Descriptor, key: string): void => {
    const list = acks.get(d.peer) ?? [];
    if (list.length === 0 && acks.size === 0) setImmediate(flushAcks);
    let a = list.find((x) => x.instance === d.instance);
    if (!a) list.push((a = { instance: d.instance, items: [] }));
    a.items.push({ key, src: d.src, crc32: d.crc32 });
    acks.set(d.peer, list);
  };
  const flushAcks = (): void => {
    for (const [addr, list] of acks) {
      for (const a of list)
        peer(addr)
          .call("Consumed", a)
          .catch((e: Error) => log(`telling ${addr} that ${a.items.length} blob(s) were read failed: ${e.message}`));
    }
    acks.clear();
  };
  /** Announces a publication in the relay, where other hosts' sidecars look for it. */
  const announce = (p: PubRec): void => {
    if (!relay || !cross) return;
    const arena = arenas.get(p.src.arena);
    if (!arena) return;
    const d: Descriptor = { v: 1, agent: me, instance, gen, peer: cross.peer, base: arena.base.toString(), src: fromAlloc(p.src), crc32: p.crc32 };
    relay
      .push(descriptorKey(p.key), Buffer.from(JSON.stringify(d)), { timeoutMs: CROSS_HOST_TIMEOUT_MS })
      .catch((e: Error) => log(`announcing ${p.key} in the relay at ${relay.address} failed: ${e.message}`));
  };

  const emit = (owner: string, kind: string, key: string, a: Alloc): void => {
    for (const s of subscribers.get(owner) ?? []) s.write({ kind, key, arena: a.arena, offset: a.offset.toString() });
  };
  const dropPub = (key: string, kind: string | null): void => {
    const p = pubs.get(key);
    if (!p) return;
    pubs.delete(key);
    if (kind) emit(p.owner, kind, key, p.src);
  };
  const finish = (h: HandleRec, state: "DONE" | "ERROR", reason: string, released = false): void => {
    if (h.state !== "PENDING") return;
    h.state = state;
    h.reason = reason;
    if (state === "DONE") {
      // a publication read to the end is consumed: its owner may reuse the slot (another host's
      // owner once its sidecar hears it)
      for (const c of h.plan.copies) {
        const p = pubs.get(c.context);
        if (p && p.src.arena === c.src.arena && p.src.offset === c.src.offset) dropPub(c.context, "consumed");
        const r = remotePubs.get(c.context);
        if (r && r.src.agent === c.src.agent && r.src.offset === c.src.offset) {
          remotePubs.delete(c.context);
          ack(r.desc, c.context);
        }
      }
    } else if (!released) {
      // a failed READ from another host: its metadata is fetched again before the next one
      for (const c of h.plan.copies) if (c.src.agent !== me) dropRemote(c.src.agent);
    }
    for (const w of h.waiters.splice(0)) w();
  };
  const inflight = new Map<number, HandleRec>();
  py.onTransfer((e) => {
    const h = inflight.get(e.xfer);
    if (!h) return;
    inflight.delete(e.xfer);
    finish(h, e.state === "DONE" ? "DONE" : "ERROR", e.error ?? "");
  });
  void py.exited.then((why) => {
    for (const h of inflight.values()) finish(h, "ERROR", `the NIXL agent process ended (${why})`);
    inflight.clear();
    log(`the NIXL agent process ended (${why})`);
  });

  const addressOf = (a: Alloc, what: string): bigint => {
    if (a.agent !== me) {
      if (!cross)
        throw new RpcError(
          status.UNIMPLEMENTED,
          `${what}: allocation of agent ${a.agent}; this sidecar copies between arenas of its own agent ${me} only (one agent per host; AIRM_KV_NIXL_CROSS_HOST=1 reads from other hosts' agents)`,
        );
      // another host's agent: `offset` is the address in its registered memory (NIXL checks it)
      if (!remotes.has(a.agent))
        throw new RpcError(status.NOT_FOUND, `${what}: agent ${a.agent} is not a remote agent known here (its publication was not looked up here, or its sidecar restarted)`);
      return a.offset;
    }
    const arena = arenas.get(a.arena);
    if (!arena) throw new RpcError(status.NOT_FOUND, `${what}: arena ${a.arena} is not registered here (released, or registered with an earlier sidecar)`);
    if (a.length <= 0n || a.offset < 0n || a.offset + a.length > arena.bytes) {
      throw new RpcError(status.OUT_OF_RANGE, `${what}: [${a.offset}, ${a.offset + a.length}) lies outside arena ${a.arena} of ${arena.bytes} bytes`);
    }
    return arena.base + a.offset;
  };

  const publish = (req: PublishMsg) => {
    if (req.instance !== instance)
      throw new RpcError(status.FAILED_PRECONDITION, `publication made for sidecar instance ${req.instance}, this is ${instance}: register the arena again`);
    const src = toAlloc(req.src, `publish ${req.key}`);
    addressOf(src, `publish ${req.key}`);
    const arena = arenas.get(src.arena)!;
    const rec: PubRec = { key: req.key, src, crc32: req.crc32 >>> 0, at: Date.now(), owner: arena.owner };
    pubs.set(req.key, rec);
    for (const w of requestWatchers.get(requestIdOf(req.key)) ?? []) w(rec);
    announce(rec);
  };

  /** Checks each bound copy's route (the seed's table) and plans them as one transfer. */
  const planCopies = (requestId: string, list: BindRec[]): { plan: PlanRec; routes: string[] } => {
    const routes = new Set<string>();
    for (const b of list) {
      try {
        routes.add(routeFor(b.src.tier, b.dst.tier, py.hello.plugins).name);
      } catch (e) {
        throw new RpcError(status.FAILED_PRECONDITION, (e as Error).message);
      }
    }
    for (const b of list) b.planned = true;
    return { plan: { id: nextId++, requestId, copies: list, bytes: list.reduce((s, b) => s + b.src.length, 0n) }, routes: [...routes] };
  };

  /** Submits a plan as one NIXL READ; the handle settles with it (its id is the transfer's). */
  const submitPlan = async (p: PlanRec): Promise<HandleRec> => {
    const sources = new Set(p.copies.map((c) => c.src.agent));
    if (sources.size !== 1) throw new RpcError(status.FAILED_PRECONDITION, `submit: a plan READs from one agent, this one from ${[...sources].join(", ")}`);
    const remote = [...sources][0]!;
    for (const c of p.copies) {
      if (c.dst.agent !== me)
        throw new RpcError(status.FAILED_PRECONDITION, `submit: ${c.context} would land in agent ${c.dst.agent}'s memory; a READ lands in this agent's (${me})`);
    }
    if (remote !== me) await remotes.get(remote)?.ready;
    const copies = p.copies.map((c) => [addressOf(c.dst, "submit dst").toString(), addressOf(c.src, "submit src").toString(), Number(c.src.length)]);
    const h: HandleRec = { id: nextId++, plan: p, state: "PENDING", reason: "", waiters: [] };
    handles.set(h.id, h);
    const xfer = Number(h.id);
    inflight.set(xfer, h);
    try {
      const r = await py.call("read", { xfer, remote, copies });
      if (r.state === "DONE" && inflight.get(xfer) === h) {
        inflight.delete(xfer);
        finish(h, "DONE", "");
      }
    } catch (e) {
      inflight.delete(xfer);
      handles.delete(h.id);
      if (remote !== me) dropRemote(remote);
      throw new RpcError(status.INTERNAL, (e as Error).message);
    }
    return h;
  };

  /** Resolves once `h` settled or `timeoutMs` passed; a settled handle is forgotten. */
  const settled = async (h: HandleRec, timeoutMs: number): Promise<void> => {
    if (h.state === "PENDING") {
      await new Promise<void>((resolve) => {
        const t = setTimeout(resolve, timeoutMs);
        h.waiters.push(() => {
          clearTimeout(t);
          resolve();
        });
      });
    }
    if (h.state !== "PENDING") handles.delete(h.id);
  };

  const releaseRequest = async (rid: string): Promise<number> => {
    let n = 0;
    for (const key of [...pubs.keys()]) {
      if (requestIdOf(key) === rid) {
        dropPub(key, "released");
        n++;
      }
    }
    for (const key of [...remotePubs.keys()]) if (requestIdOf(key) === rid) remotePubs.delete(key);
    // the request's descriptors in the relay (cross-host) go with it
    relay?.release(rid).catch((e: Error) => log(`releasing ${rid} in the relay failed: ${e.message}`));
    n += binds.get(rid)?.length ?? 0;
    binds.delete(rid);
    for (const [id, p] of plans) if (p.requestId === rid) plans.delete(id);
    for (const [id, h] of handles) {
      if (h.plan.requestId !== rid) continue;
      handles.delete(id);
      if (inflight.delete(Number(id))) await py.call("cancel", { xfer: Number(id) }).catch(() => undefined);
      finish(h, "ERROR", `request ${rid} was released`, true);
    }
    return n;
  };

  const releaseOwner = async (owner: string): Promise<void> => {
    for (const [key, p] of pubs) if (p.owner === owner) pubs.delete(key);
    for (const a of [...arenas.values()]) {
      if (a.owner !== owner) continue;
      arenas.delete(a.id);
      await py.call("deregister", { arena: a.id }).catch(() => undefined);
    }
  };

  /** Binds, plans (routes), submits and fences a batch: one NIXL transfer per request id in it (a release drops its own copies only). */
  const copyBatch = async (copies: CopyMsg[], timeoutMs: number): Promise<{ state: string; reason: string }[]> => {
    const byRequest = new Map<string, BindRec[]>();
    const order: BindRec[] = [];
    for (const c of copies) {
      const src = toAlloc(c.src, `copy ${c.context}`);
      const dst = toAlloc(c.dst, `copy ${c.context}`);
      if (src.length !== dst.length) throw new RpcError(status.INVALID_ARGUMENT, `copy ${c.context}: src holds ${src.length} bytes and dst ${dst.length}`);
      const b: BindRec = { id: nextId++, src, dst, context: c.context, planned: false };
      // one transfer per request and source agent (a NIXL READ names one remote agent)
      const group = `${c.request_id}\n${src.agent}`;
      const list = byRequest.get(group) ?? [];
      list.push(b);
      byRequest.set(group, list);
      order.push(b);
    }
    const handleOf = new Map<BindRec, HandleRec>();
    for (const [group, list] of byRequest) {
      const h = await submitPlan(planCopies(group.slice(0, group.indexOf("\n")), list).plan);
      for (const b of list) handleOf.set(b, h);
    }
    await Promise.all([...new Set(handleOf.values())].map((h) => settled(h, timeoutMs)));
    return order.map((b) => ({ state: handleOf.get(b)!.state, reason: handleOf.get(b)!.reason }));
  };

  const sweep = setInterval(() => {
    const now = Date.now();
    for (const [key, p] of pubs) if (now - p.at > ttlMs) dropPub(key, "expired");
    for (const [key, r] of remotePubs) if (now - r.at > ttlMs) remotePubs.delete(key);
  }, 1000);
  sweep.unref();

  const authorized = (md: Metadata): boolean => {
    if (!opts.token) return true;
    const got = md.get(INTERNAL_TOKEN_HEADER)[0];
    return typeof got === "string" && sameSecret(opts.token, got);
  };
  const unary =
    <Req, Res>(fn: (req: Req) => Promise<Res> | Res): Unary<Req, Res> =>
    (call, cb) => {
      if (!authorized(call.metadata)) {
        cb({ code: status.UNAUTHENTICATED, details: `the call lacks the deployment's ${INTERNAL_TOKEN_HEADER} (AIRM_INTERNAL_TOKEN)` });
        return;
      }
      Promise.resolve()
        .then(() => fn(call.request))
        .then(
          (res) => cb(null, res),
          (e: unknown) => cb({ code: e instanceof RpcError ? e.code : status.INTERNAL, details: e instanceof Error ? e.message : String(e) }),
        );
    };

  const impl = {
    Health: unary(async () => ({
      fd_socket: py.hello.fdSocket ?? "",
      held_fds: Object.values(((await py.call("held")).held ?? {}) as Record<string, number>).reduce((a, n) => a + n, 0),
      agent: me,
      backends: py.hello.backends,
      plugins: py.hello.plugins,
      arenas: arenas.size,
      publications: pubs.size,
      copies_in_flight: inflight.size,
      remote_agents: remotes.size,
      remote_publications: remotePubs.size,
      instance,
      python_pid: py.hello.pid,
    })),
    RegisterArena: unary(async (req: { path: string; bytes: string; owner: string }) => {
      const r = await py.call("register", { path: req.path, bytes: Number(req.bytes) });
      const id = Number(r.arena);
      arenas.set(id, { id, path: req.path, bytes: BigInt(req.bytes), base: BigInt(String(r.base)), owner: req.owner });
      gen++;
      log(`arena ${id} registered for ${req.owner}: ${req.bytes} bytes`);
      return { arena: id, agent: me, instance, cross_host: cross !== null };
    }),
    ReleaseArena: unary(async (req: { arena: number }) => {
      const a = arenas.get(req.arena);
      if (!a) return { released: 0 };
      arenas.delete(req.arena);
      for (const [key, p] of pubs) if (p.src.arena === req.arena) pubs.delete(key);
      await py.call("deregister", { arena: req.arena });
      return { released: 1 };
    }),
    Metadata: unary(async () => {
      const r = await py.call("metadata");
      return { agent: me, metadata: Buffer.from(String(r.metadata), "base64") };
    }),
    AddRemote: unary(async (req: { metadata: Buffer }) => {
      const r = await py.call("add_remote", { metadata: Buffer.from(req.metadata).toString("base64") });
      return { agent: String(r.agent) };
    }),
    PublishMany: unary((req: { entries: PublishMsg[] }) => {
      for (const e of req.entries) publish(e);
      return { released: req.entries.length };
    }),
    Bind: unary((req: { request_id: string; src: AllocationMsg; dst: AllocationMsg; context: string }) => {
      const src = toAlloc(req.src, "bind src");
      const dst = toAlloc(req.dst, "bind dst");
      if (src.length !== dst.length) throw new RpcError(status.INVALID_ARGUMENT, `bind: src holds ${src.length} bytes and dst ${dst.length}; a copy never resizes`);
      if (src.tier === "dram") addressOf(src, "bind src");
      if (dst.tier === "dram") addressOf(dst, "bind dst");
      const b: BindRec = { id: nextId++, src, dst, context: req.context, planned: false };
      const list = binds.get(req.request_id) ?? [];
      list.push(b);
      binds.set(req.request_id, list);
      return { binding: b.id.toString() };
    }),
    Plan: unary((req: { request_id: string; bindings: string[] }) => {
      const only = new Set((req.bindings ?? []).map((b) => BigInt(b)));
      const list = (binds.get(req.request_id) ?? []).filter((b) => !b.planned && (only.size === 0 || only.has(b.id)));
      if (list.length === 0) throw new RpcError(status.FAILED_PRECONDITION, `plan: request ${req.request_id} has no bound allocations (bind first)`);
      const { plan, routes } = planCopies(req.request_id, list);
      plans.set(plan.id, plan);
      return { plan: plan.id.toString(), routes, bytes: plan.bytes.toString(), copies: list.length };
    }),
    Submit: unary(async (req: { plan: string }) => {
      const p = plans.get(BigInt(req.plan));
      if (!p) throw new RpcError(status.NOT_FOUND, `submit: plan ${req.plan} is unknown (released, or already submitted)`);
      plans.delete(p.id);
      return { handle: (await submitPlan(p)).id.toString() };
    }),
    Wait: unary(async (req: { handle: string; timeout_ms: number }) => {
      const h = handles.get(BigInt(req.handle));
      if (!h) throw new RpcError(status.NOT_FOUND, `wait: handle ${req.handle} is unknown (released?)`);
      await settled(h, req.timeout_ms);
      return { state: h.state, reason: h.reason };
    }),
    Release: unary(async (req: { request_id: string }) => ({ released: await releaseRequest(req.request_id) })),
    DropFds: unary(async (req: { tag: string }) => ({ released: Number((await py.call("drop_fds", { tag: req.tag })).dropped) })),
    Consumed: unary((req: { instance: string; items: { key: string; src: AllocationMsg }[] }) => {
      // a restarted sidecar holds none of the old instance's publications
      if (req.instance !== instance) return { released: 0 };
      let n = 0;
      for (const it of req.items) {
        const p = pubs.get(it.key);
        const src = toAlloc(it.src, `consumed ${it.key}`);
        if (p && p.src.arena === src.arena && p.src.offset === src.offset) {
          dropPub(it.key, "consumed");
          n++;
        }
      }
      return { released: n };
    }),
    Session: (call: ServerDuplexStream<SessionIn, unknown>) => {
      if (!authorized(call.metadata)) {
        call.emit("error", { code: status.UNAUTHENTICATED, details: `the call lacks the deployment's ${INTERNAL_TOKEN_HEADER}` });
        return;
      }
      let open = true;
      const send = (m: unknown): void => {
        if (open) call.write(m);
      };
      const watches = new Map<string, () => void>();
      const watch = (rid: string, timeoutMs: number): void => {
        watches.get(rid)?.();
        // the whole request: what is published now in one message, then each turn's new ones
        let ready: unknown[] = [];
        const item = (p: PubRec) => ({ key: p.key, src: fromAlloc(p.src), crc32: p.crc32 });
        const flush = (): void => {
          if (ready.length) send({ kind: "publications", request_id: rid, items: ready });
          ready = [];
        };
        const watcher = (p: PubRec): void => {
          ready.push(item(p));
          if (ready.length === 1) setImmediate(flush);
        };
        for (const p of pubs.values()) if (requestIdOf(p.key) === rid) ready.push(item(p));
        flush();
        const set = requestWatchers.get(rid) ?? new Set();
        set.add(watcher);
        requestWatchers.set(rid, set);
        const stop = (): void => {
          clearTimeout(timer);
          set.delete(watcher);
          if (set.size === 0 && requestWatchers.get(rid) === set) requestWatchers.delete(rid);
          if (watches.get(rid) === stop) watches.delete(rid);
        };
        const timer = setTimeout(() => {
          stop();
          send({ kind: "watch_end", request_id: rid });
        }, timeoutMs);
        watches.set(rid, stop);
      };
      const wanted = new Set<string>();
      /** A blob the consumer waits for and this sidecar has not got: looked up in the relay (cross-host). */
      const want = (key: string, timeoutMs: number): void => {
        if (!relay || pubs.has(key) || wanted.has(key) || remotePubs.has(key)) return;
        wanted.add(key);
        const rid = requestIdOf(key);
        void (async () => {
          try {
            const d = parseDescriptor((await relay.pull(descriptorKey(key), { timeoutMs })).bytes, key);
            // published by this host's agent: the watch carries it; a watch that ended wants nothing
            if (d.agent === me || pubs.has(key) || !open || !watches.has(rid)) return;
            await ensureRemote(d);
            const src: Alloc = { ...toAlloc(d.src, key), agent: d.agent, offset: BigInt(d.base) + BigInt(d.src.offset) };
            remotePubs.set(key, { desc: d, src, at: Date.now() });
            send({ kind: "publications", request_id: rid, items: [{ key, src: fromAlloc(src), crc32: d.crc32 >>> 0 }] });
          } catch (e) {
            // not announced in time: the consumer's own timeout says so
            if (!(e instanceof TransportTimeoutError)) send({ kind: "want_failed", request_id: key, error: `looking up ${key} across hosts: ${(e as Error).message}` });
          } finally {
            wanted.delete(key);
          }
        })();
      };
      call.on("data", (m: SessionIn) => {
        if (m.kind === "want" && m.want) want(m.want.key, m.want.timeout_ms);
        else if (m.kind === "watch" && m.watch) watch(m.watch.request_id, m.watch.timeout_ms);
        else if (m.kind === "unwatch") watches.get(m.request_id)?.();
        else if (m.kind === "copy" && m.copy) {
          const id = m.copy.id;
          copyBatch(m.copy.copies ?? [], m.copy.timeout_ms).then(
            (states) => send({ kind: "copied", copied: { id, states, code: 0, error: "" } }),
            (e: unknown) =>
              send({ kind: "copied", copied: { id, states: [], code: e instanceof RpcError ? e.code : status.INTERNAL, error: e instanceof Error ? e.message : String(e) } }),
          );
        }
      });
      const end = (): void => {
        open = false;
        for (const stop of [...watches.values()]) stop();
      };
      call.on("end", () => {
        end();
        call.end();
      });
      call.on("cancelled", end);
      call.on("error", end);
      call.on("close", end);
    },
    Events: (call: ServerWritableStream<{ owner: string }, unknown>) => {
      if (!authorized(call.metadata)) {
        call.emit("error", { code: status.UNAUTHENTICATED, details: `the call lacks the deployment's ${INTERNAL_TOKEN_HEADER}` });
        return;
      }
      const owner = call.request.owner;
      const set = subscribers.get(owner) ?? new Set();
      set.add(call);
      subscribers.set(owner, set);
      call.write({ kind: "subscribed", key: "", arena: 0, offset: "0" });
      const gone = (): void => {
        set.delete(call);
        if (set.size === 0) {
          subscribers.delete(owner);
          // the owner's process is gone (or closed): nothing of its arenas may stay registered
          void releaseOwner(owner);
        }
      };
      call.on("cancelled", gone);
      call.on("close", gone);
      call.on("error", gone);
    },
  };

  const server = new Server();
  server.addService(nixlAgentService().service, impl as never);
  const port = await new Promise<number>((resolve, reject) => server.bindAsync(opts.listen, ServerCredentials.createInsecure(), (e, p) => (e ? reject(e) : resolve(p))));
  const host = opts.listen.slice(0, opts.listen.lastIndexOf(":"));
  log(`NIXL agent ${me} (plugins ${py.hello.plugins.join(", ")}) serving on ${host}:${port}`);
  return {
    address: `${host}:${port}`,
    agent: me,
    instance,
    pythonPid: py.hello.pid,
    agentExited: py.exited,
    async close() {
      clearInterval(sweep);
      server.forceShutdown();
      relay?.close();
      for (const c of peerClients.values()) c.close();
      await py.stop();
      rmSync(fdSocket, { force: true });
    },
  };
}
