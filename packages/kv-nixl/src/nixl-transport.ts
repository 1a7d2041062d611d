// The `nixl` KV transport: a copy-only transport (plan / submit / wait between bound allocations)
// over the host's NIXL agent sidecar, used by the workers through rm-core's FencedTransport.
// A producer stages each blob in its registered arena and publishes it (the src half); a
// consumer, in any process of the host, adopts the publication: it binds a slot of its own arena
// as dst, plans (the route table), submits the NIXL READ and waits on the fence, then checks the
// CRC-32. The producer's slot is reused once the sidecar reports it read, released or expired.
// With a cross-host sidecar (AIRM_KV_NIXL_CROSS_HOST=1), a pull of a blob it has not got also
// asks it to look for the blob on other hosts (a `want`): it finds it through the relay and the
// READ comes from the producer host's agent.

import { randomBytes } from "node:crypto";
import { status, type ClientDuplexStream, type ClientReadableStream } from "@grpc/grpc-js";
import {
  ConfigSpec,
  KV_LAYOUT,
  RM_CORE_CONFIG,
  hostPort,
  TransportError,
  TransportTimeoutError,
  defineConfig,
  int,
  kvCrc32,
  num,
  opt,
  requestIdOf,
  validateRequestId,
  type ConfigValues,
  type CopyHandle,
  type CopyOnlyTransport,
  type CopyPlan,
  type CopyRequest,
  type CopyStatus,
  type TransportStats,
  type TransportSupport,
} from "@airm/rm-core";
import { Arena } from "./arena.ts";
import { NixlAgentClient } from "./agent-client.ts";
import type { AllocationMsg } from "./protos.ts";

/** cross-node: with AIRM_KV_NIXL_CROSS_HOST=1 on the sidecars of the hosts and the KV relay (see the README). */
export const NIXL_SUPPORT: TransportSupport = {
  scope: ["same-host", "cross-node"],
  tiers: ["host-dram", "device-dram", "dmabuf"],
  dtypes: ["bf16", "fp16"],
  layouts: [KV_LAYOUT],
  copyOnly: true,
};

export const DEFAULT_NIXL_ADDR = "127.0.0.1:7500";

export const NIXL_CONFIG = defineConfig("@airm/kv-nixl", {
  addr: opt(hostPort(), {
    env: "AIRM_KV_NIXL_ADDR",
    default: DEFAULT_NIXL_ADDR,
    doc: "The host's NIXL agent sidecar (airm-kv-nixl-agent), which `airm up` starts; every worker of the host drives the same agent.",
  }),
  poolMb: opt(num({ min: 1 }), {
    env: "AIRM_KV_NIXL_POOL_MB",
    default: 1024,
    doc: "Shared-memory arena per worker in MiB, registered with NIXL once: bounds the bytes pushed and not yet read plus the pulled blobs held until release.",
  }),
  connectTimeoutMs: opt(int({ min: 0 }), {
    env: "AIRM_KV_NIXL_CONNECT_TIMEOUT_MS",
    default: 60_000,
    doc: "How long opening an endpoint waits for the sidecar to accept connections (it may start beside the worker and take a few seconds to load NIXL).",
  }),
  rpcTimeoutMs: opt(int({ min: 100 }), {
    env: "AIRM_KV_NIXL_RPC_TIMEOUT_MS",
    default: 5000,
    doc: "Deadline of each control call to the sidecar (a wait's own timeout comes on top): a sidecar that does not answer within it is a TransportError.",
  }),
}).with(new ConfigSpec("@airm/rm-core", { internalToken: RM_CORE_CONFIG.options.internalToken }));
export type NixlOptions = ConfigValues<typeof NIXL_CONFIG.options>;

/**
 * Bytes per copy batch. The agent READs a batch after another; the consumer checks the blobs of a
 * finished batch (CRC-32, ~7 GB/s on one core) while the next is read. Measured on the 2-core VM
 * (pnpm bench kv-transport --transport nixl): 8 and 16 MiB batches pulled 64 MiB in 32-39 ms,
 * one batch per request 37-45 ms, 4 MiB 36-39 ms.
 */
const COPY_BATCH_BYTES = 8 * 1024 * 1024;

/** How long a consumer watches one request's publications at most (released requests stop at once). */
const PREFETCH_TTL_MS = 300_000;

interface Slot {
  offset: number;
  length: number;
}
interface NixlPlan extends CopyPlan {
  readonly offset: number;
  readonly crc32: number;
}
interface PublishedHandle extends CopyHandle {
  readonly kind: "published";
  readonly src: AllocationMsg;
  readonly crc32: number;
}
interface DoneHandle extends CopyHandle {
  readonly kind: "done";
  readonly state: string;
  readonly reason: string;
  readonly offset: number;
  readonly crc32: number;
}
interface Prefetch {
  /** Reads started for the request's blobs, by key. */
  arrived: Map<string, Promise<DoneHandle>>;
  /** Pulls waiting for a key not published yet. */
  waiting: Map<string, ((h: Promise<DoneHandle>) => void)[]>;
}
type CopyState = { state: string; reason: string };
interface SessionOut {
  kind: string;
  request_id: string;
  error: string;
  items: { key: string; src: AllocationMsg; crc32: number }[];
  copied: { id: string; states: CopyState[]; code: number; error: string } | null;
}
interface CopyItem {
  rid: string;
  key: string;
  src: AllocationMsg;
  dst: AllocationMsg;
  deadline: number;
}
interface Queued<I, R> {
  item: I;
  resolve: (r: R) => void;
  reject: (e: unknown) => void;
}

/** One worker's endpoint: its arena, registered with the host's agent, and the calls it makes. */
export class NixlCopyTransport implements CopyOnlyTransport {
  readonly name = "nixl";
  readonly support = NIXL_SUPPORT;
  readonly agent: string;
  /** Blobs this endpoint staged (producer), by key; `published` once the sidecar knows them. */
  private readonly srcSlots = new Map<string, Slot & { published: boolean }>();
  /** Blobs read into this arena (consumer), by key, held until their request is released. */
  private readonly dstSlots = new Map<string, Slot>();
  private readonly publishes: Queued<{ key: string; offset: number; bytes: number; crc32: number }, void>[] = [];
  private readonly prefetches = new Map<string, Prefetch>();
  private readonly copies: Queued<CopyItem, CopyState>[] = [];
  /** Copy batches sent on the session, by id, until their CopyDone. */
  private readonly inFlight = new Map<string, { xs: Queued<CopyItem, CopyState>[]; timer: NodeJS.Timeout }>();
  private nextBatch = 1;
  private session: ClientDuplexStream<unknown, unknown> | null = null;
  /** Who holds the registration in the sidecar (its Events stream ending releases it): new per registration. */
  private owner = "";
  private expired = 0;
  private events: ClientReadableStream<unknown> | null = null;
  /** The registration with a sidecar that came back, while it runs (see ensureOpen). */
  private reopening: Promise<void> | null = null;
  private closed = false;
  /** The sidecar looks up blobs published on other hosts (it said so at registration). */
  private crossHost = false;

  private constructor(
    private readonly o: NixlOptions,
    private readonly client: NixlAgentClient,
    private readonly arena: Arena,
    agent: string,
    private arenaId: number,
    private instance: string,
  ) {
    this.agent = agent;
  }

  /** Opens an endpoint: maps a fresh arena and registers it with the sidecar at `o.addr`. */
  static async open(o: NixlOptions): Promise<NixlCopyTransport> {
    const client = new NixlAgentClient(o.addr, o.internalToken, o.rpcTimeoutMs);
    const arena = Arena.create(Math.round(o.poolMb * 1024 * 1024));
    try {
      await client.ready(o.connectTimeoutMs);
      const t = new NixlCopyTransport(o, client, arena, "", 0, "");
      await t.register();
      return t;
    } catch (e) {
      arena.close();
      client.close();
      throw e;
    }
  }

  private async register(): Promise<void> {
    // A fresh owner per registration: ending the previous registration's Events stream (below)
    // then releases only what that one held, never the arena registered now.
    this.owner = `${process.pid}-${randomBytes(4).toString("hex")}`;
    const r = (await this.client.call("RegisterArena", { path: this.arena.path, bytes: String(this.arena.size), owner: this.owner })) as {
      arena: number;
      agent: string;
      instance: string;
      cross_host: boolean;
    };
    (this as { agent: string }).agent = r.agent;
    this.crossHost = r.cross_host;
    this.arenaId = r.arena;
    this.instance = r.instance;
    this.subscribe();
  }

  /** Slots the sidecar reports read, released or expired go back to the arena; the session opens. */
  private subscribe(): void {
    this.openSession();
    this.events?.cancel();
    this.events = this.client.events(this.owner, (ev) => {
      if (ev.kind === "subscribed") return;
      if (ev.kind === "expired") this.expired++;
      this.freeSlot(this.srcSlots, ev.key);
    });
  }

  /** Gives `key`'s slot (if `at` is given, only when it is still that offset) back to the arena. */
  private freeSlot(slots: Map<string, Slot>, key: string, at?: number): void {
    const s = slots.get(key);
    if (!s || (at !== undefined && s.offset !== at)) return;
    slots.delete(key);
    this.arena.free(s.offset);
  }

  /** The consumer's session stream with the sidecar: watches of requests and copy batches. */
  private openSession(): void {
    const old = this.session;
    if (old) {
      // watches and batches on the replaced stream would never be answered: they fail now
      this.session = null;
      old.cancel();
      this.failRiders(new TransportError(`nixl: the NIXL agent sidecar at ${this.o.addr} was restarted while this copy was under way; the request can be sent again`));
    }
    const s = this.client.session();
    this.session = s;
    s.on("data", (m: SessionOut) => {
      if (m.kind === "publications") this.published(m.request_id, m.items);
      else if (m.kind === "watch_end") this.watchEnded(m.request_id);
      else if (m.kind === "copied" && m.copied) this.copied(m.copied);
      else if (m.kind === "want_failed") this.wantFailed(m.request_id, m.error);
    });
    s.on("error", (e: Error) => this.sessionLost(s, e));
    s.on("end", () => this.sessionLost(s, Object.assign(new Error("the sidecar ended the session"), { code: status.UNAVAILABLE })));
  }

  /** The session broke (the sidecar died or was replaced): every copy and watch on it fails. */
  private sessionLost(s: ClientDuplexStream<unknown, unknown>, e: Error): void {
    if (this.session !== s) return; // replaced or closed by us
    this.session = null;
    this.failRiders(this.client.failure("Session", e)); // gone or replaced: the next call registers again
  }

  /** Fails every copy batch and watch of the session that just ended. */
  private failRiders(err: Error): void {
    for (const [id, b] of [...this.inFlight]) {
      clearTimeout(b.timer);
      this.inFlight.delete(id);
      for (const x of b.xs) x.reject(err);
    }
    for (const [rid, pf] of [...this.prefetches]) {
      this.prefetches.delete(rid);
      this.failWaiting(pf, err);
    }
  }

  private failWaiting(pf: Prefetch, err: Error): void {
    for (const [key, l] of pf.waiting) {
      const failed = Promise.reject(err);
      failed.catch(() => undefined);
      for (const w of l.splice(0)) w(failed);
      pf.waiting.delete(key);
    }
  }

  private async ensureOpen(): Promise<void> {
    if (this.closed) throw new TransportError("nixl: transport is closed", "TRANSPORT_CLOSED");
    if (!this.client.unreachable) {
      if (!this.session) this.openSession();
      return;
    }
    // A sidecar that came back is a new agent: what it held of ours is gone, so are our
    // publications (their slots are free again); the arena is registered anew, once for all
    // the calls that found it gone (each registration replaces the session and what rides on it).
    this.reopening ??= (async () => {
      try {
        await this.register();
        for (const [key, s] of [...this.srcSlots]) if (s.published) this.freeSlot(this.srcSlots, key);
      } finally {
        this.reopening = null;
      }
    })();
    await this.reopening;
  }

  private take(length: number, what: string): number {
    const at = this.arena.allocate(Math.max(1, length));
    if (at === null) {
      throw new TransportError(
        `nixl: no room for ${what} (${length} bytes) in this worker's ${this.arena.size}-byte arena (${this.arena.usedBytes} in use); raise AIRM_KV_NIXL_POOL_MB`,
        "TRANSPORT_NO_SPACE",
      );
    }
    return at;
  }

  private own(offset: number, length: number): AllocationMsg {
    return { tier: "dram", agent: this.agent, arena: this.arenaId, offset: String(offset), length: String(Math.max(1, length)) };
  }

  /** The producer's half: the blob staged in this arena with its CRC-32. */
  async plan(req: CopyRequest): Promise<NixlPlan> {
    await this.ensureOpen();
    if (req.src.byteLength === 0) throw new TransportError(`nixl: ${req.key} is empty; a NIXL copy needs at least one byte`);
    const offset = this.take(req.src.byteLength, req.key);
    this.arena.bytes.set(req.src, offset);
    const crc32 = req.crc32 ?? kvCrc32(req.src);
    this.freeSlot(this.srcSlots, req.key);
    this.srcSlots.set(req.key, { offset, length: req.src.byteLength, published: false });
    return { requestId: req.requestId, key: req.key, bytes: req.src.byteLength, offset, crc32 };
  }

  /**
   * Publishes the staged blob with the agent, where any worker of the host can adopt it. The
   * publications of one turn of the event loop go in one call (PublishMany).
   */
  async submit(plan: CopyPlan): Promise<PublishedHandle> {
    await this.ensureOpen();
    const p = plan as NixlPlan;
    await this.retryOnNewSidecar(() => this.batch(this.publishes, { key: p.key, offset: p.offset, bytes: p.bytes, crc32: p.crc32 }, (xs) => this.flushPublishes(xs)));
    const slot = this.srcSlots.get(p.key);
    if (slot && slot.offset === p.offset) slot.published = true;
    return { plan, kind: "published", src: this.own(p.offset, p.bytes), crc32: p.crc32 };
  }

  private async flushPublishes(xs: Queued<{ key: string; offset: number; bytes: number; crc32: number }, void>[]): Promise<void> {
    const entries = xs.map(({ item: e }) => ({ key: e.key, src: this.own(e.offset, e.bytes), crc32: e.crc32, instance: this.instance }));
    try {
      await this.client.call("PublishMany", { entries });
      for (const x of xs) x.resolve();
    } catch (e) {
      for (const x of xs) x.reject(e);
    }
  }

  /**
   * Waits for `key`'s publication, then reads it into this arena: bind, plan, submit and the fence
   * run in the sidecar, for every copy asked in the same turn of the event loop at once (one NIXL
   * transfer per request). The handle carries the outcome; wait() checks the bytes.
   */
  async adopt(key: string, timeoutMs: number): Promise<DoneHandle> {
    await this.ensureOpen();
    // The first pull of a request watches the whole request: every blob of it is read into this
    // arena as soon as it is published (a decode pulls all of them, layer after layer), so later
    // pulls find their bytes here already or arriving.
    const rid = requestIdOf(key);
    let pf = this.prefetches.get(rid);
    if (!pf) {
      pf = this.prefetch(rid);
      this.prefetches.set(rid, pf);
    }
    const have = pf.arrived.get(key);
    if (have) return have;
    const p = pf;
    return new Promise<DoneHandle>((resolve, reject) => {
      const timer = setTimeout(() => {
        const l = p.waiting.get(key);
        if (l) l.splice(l.indexOf(w), 1);
        reject(new TransportTimeoutError(`nixl: no blob ${key} was published within ${timeoutMs} ms`));
      }, timeoutMs);
      const w = (h: Promise<DoneHandle>): void => {
        clearTimeout(timer);
        h.then(resolve, reject);
      };
      const l = p.waiting.get(key) ?? [];
      l.push(w);
      p.waiting.set(key, l);
      // not published at this host's sidecar (yet): a cross-host sidecar (AIRM_KV_NIXL_CROSS_HOST)
      // also looks for it among the other hosts' publications (the relay)
      if (l.length === 1 && this.crossHost) this.session?.write({ kind: "want", want: { key, timeout_ms: Math.max(0, Math.round(timeoutMs)) } });
    });
  }

  /** The sidecar could not get `key` from the host that published it: its pulls fail with why. */
  private wantFailed(key: string, error: string): void {
    const pf = this.prefetches.get(requestIdOf(key));
    const l = pf?.waiting.get(key);
    if (!pf || !l) return;
    pf.waiting.delete(key);
    const failed = Promise.reject(new TransportError(`nixl: ${error}`));
    failed.catch(() => undefined);
    for (const w of l.splice(0)) w(failed);
  }

  /** Starts the watch of request `rid` on the session (see adopt). */
  private prefetch(rid: string): Prefetch {
    const pf: Prefetch = { arrived: new Map(), waiting: new Map() };
    if (!this.session) this.openSession();
    this.session!.write({ kind: "watch", watch: { request_id: rid, timeout_ms: PREFETCH_TTL_MS } });
    return pf;
  }

  /** Publications of a watched request: each is read into this arena at once. */
  private published(rid: string, items: SessionOut["items"]): void {
    const pf = this.prefetches.get(rid);
    if (!pf) return;
    for (const p of items) {
      if (pf.arrived.has(p.key)) continue;
      const h = this.read(p.key, p.src, p.crc32, Date.now() + this.o.rpcTimeoutMs);
      h.catch(() => undefined); // a pull of it reports the failure
      pf.arrived.set(p.key, h);
      for (const w of pf.waiting.get(p.key)?.splice(0) ?? []) w(h);
    }
  }

  /** A watch outlived its time (PREFETCH_TTL_MS): pulls still waiting on it fail. */
  private watchEnded(rid: string): void {
    const pf = this.prefetches.get(rid);
    if (!pf) return;
    this.prefetches.delete(rid);
    this.failWaiting(pf, new TransportTimeoutError(`nixl: the watch of request ${rid} ended after ${PREFETCH_TTL_MS} ms`));
  }

  private async read(key: string, src: AllocationMsg, crc32: number, deadline: number): Promise<DoneHandle> {
    const rid = requestIdOf(key);
    const length = Number(src.length);
    const offset = this.take(length, key);
    try {
      const r = await this.retryOnNewSidecar(() => this.batch(this.copies, { rid, key, src, dst: this.own(offset, length), deadline }, (xs) => this.flushCopies(xs)));
      this.dstSlots.set(key, { offset, length });
      return { plan: { requestId: rid, key, bytes: length }, kind: "done", state: r.state, reason: r.reason, offset, crc32 };
    } catch (e) {
      this.arena.free(offset);
      throw e;
    }
  }

  /**
   * Sends the turn's copies on the session in batches of about COPY_BATCH_BYTES: the sidecar
   * READs one batch after another, and the blobs of a finished batch are checked here (CRC-32)
   * while the next one is read.
   */
  private flushCopies(xs: Queued<CopyItem, CopyState>[]): void {
    const limit = COPY_BATCH_BYTES;
    let group: Queued<CopyItem, CopyState>[] = [];
    let bytes = 0;
    for (const x of xs) {
      group.push(x);
      bytes += Number(x.item.src.length);
      if (bytes >= limit) {
        this.sendCopies(group);
        group = [];
        bytes = 0;
      }
    }
    if (group.length) this.sendCopies(group);
  }

  private sendCopies(xs: Queued<CopyItem, CopyState>[]): void {
    if (!this.session) this.openSession();
    const s = this.session!;
    const id = String(this.nextBatch++);
    const timeout = Math.max(0, ...xs.map((x) => x.item.deadline - Date.now()));
    const timer = setTimeout(() => {
      if (!this.inFlight.delete(id)) return;
      // a sidecar that holds a batch past its own fence is hung: the session is dropped with it
      this.sessionLost(s, Object.assign(new Error(`no answer to a copy batch within ${timeout + this.o.rpcTimeoutMs} ms`), { code: status.DEADLINE_EXCEEDED }));
      const e = new TransportError(`nixl: the NIXL agent sidecar at ${this.o.addr} did not answer a copy batch within ${timeout + this.o.rpcTimeoutMs} ms`);
      for (const x of xs) x.reject(e);
    }, timeout + this.o.rpcTimeoutMs);
    this.inFlight.set(id, { xs, timer });
    s.write({ kind: "copy", copy: { id, copies: xs.map(({ item: c }) => ({ request_id: c.rid, src: c.src, dst: c.dst, context: c.key })), timeout_ms: Math.round(timeout) } });
  }

  private copied(done: NonNullable<SessionOut["copied"]>): void {
    const b = this.inFlight.get(String(done.id));
    if (!b) return;
    this.inFlight.delete(String(done.id));
    clearTimeout(b.timer);
    if (done.code !== 0) {
      const e = this.client.failure("copy", Object.assign(new Error(done.error), { code: done.code, details: done.error }));
      for (const x of b.xs) x.reject(e);
      return;
    }
    for (const [i, x] of b.xs.entries()) x.resolve(done.states[i] ?? { state: "ERROR", reason: "the sidecar gave no state for this copy" });
  }

  /** Queues `item`; the queue is flushed as one call when this turn of the event loop ends. */
  private batch<I, R>(queue: Queued<I, R>[], item: I, flush: (xs: Queued<I, R>[]) => unknown): Promise<R> {
    return new Promise<R>((resolve, reject) => {
      queue.push({ item, resolve, reject });
      if (queue.length === 1) {
        setImmediate(() => {
          const xs = queue.splice(0);
          void flush(xs);
        });
      }
    });
  }

  /** Runs `fn`; when it failed because the sidecar was replaced, registers again and runs it once more. */
  private async retryOnNewSidecar<T>(fn: () => Promise<T>): Promise<T> {
    try {
      return await fn();
    } catch (e) {
      if (!this.client.unreachable || this.closed) throw e;
      await this.ensureOpen();
      return fn();
    }
  }

  /** The fence's outcome, with a view of the bytes in this arena (CRC-32 checked). */
  async wait(handle: CopyHandle, timeoutMs: number): Promise<CopyStatus> {
    await this.ensureOpen();
    let h = handle as PublishedHandle | DoneHandle;
    if (h.kind === "published") h = await this.read(h.plan.key, h.src, h.crc32, Date.now() + timeoutMs);
    if (h.state === "PENDING") throw new TransportTimeoutError(`nixl: the READ of ${h.plan.key} did not complete within its timeout`);
    if (h.state !== "DONE") return { ok: false, reason: `NIXL READ failed: ${h.reason}` };
    const data = this.arena.bytes.subarray(h.offset, h.offset + h.plan.bytes);
    const got = kvCrc32(data);
    if (got !== h.crc32) return { ok: false, reason: `KV_INTEGRITY: CRC-32 of the ${h.plan.bytes} bytes read is ${got.toString(16)}, the producer's is ${h.crc32.toString(16)}` };
    return { ok: true, data, crc32: got };
  }

  async release(requestId: string): Promise<void> {
    validateRequestId(requestId);
    if (this.closed) return;
    const pf = this.prefetches.get(requestId);
    if (pf) {
      this.prefetches.delete(requestId);
      this.session?.write({ kind: "unwatch", request_id: requestId });
      // copies still in flight free their slots when they settle
      for (const h of pf.arrived.values()) {
        void h.then(
          (d) => this.freeSlot(this.dstSlots, d.plan.key, d.offset),
          () => undefined,
        );
      }
    }
    for (const slots of [this.srcSlots, this.dstSlots]) for (const key of [...slots.keys()]) if (requestIdOf(key) === requestId) this.freeSlot(slots, key);
    await this.client.call("Release", { request_id: requestId });
  }

  stats(): TransportStats {
    return { blobs: this.srcSlots.size, bytes: this.arena.usedBytes, expired: this.expired };
  }

  async close(): Promise<void> {
    if (this.closed) return;
    this.closed = true;
    this.events?.cancel();
    const s = this.session;
    this.session = null;
    s?.cancel();
    for (const [id, b] of [...this.inFlight]) {
      clearTimeout(b.timer);
      this.inFlight.delete(id);
      for (const x of b.xs) x.reject(new TransportError("nixl: transport is closed", "TRANSPORT_CLOSED"));
    }
    this.prefetches.clear();
    await this.client.call("ReleaseArena", { arena: this.arenaId }).catch(() => undefined);
    this.client.close();
    this.arena.close();
  }
}
