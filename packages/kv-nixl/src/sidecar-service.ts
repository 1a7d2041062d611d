// The NIXL agent sidecar's gRPC service (proto/nixl_agent.proto), served by sidecar.ts over a
// SidecarCore: unary calls for arenas, publications and bind / plan / submit / wait copies (the
// route table is enforced at Plan), and the Session and Events streams (sidecar-session.ts).
// Every call carries the deployment's internal token when there is one.

import { status, type ServerUnaryCall, type sendUnaryData } from "@grpc/grpc-js";
import { INTERNAL_TOKEN_HEADER } from "@airm/rm-core";
import type { AllocationMsg } from "./protos.ts";
import type { SidecarCore } from "./sidecar-core.ts";
import { RpcError, toAlloc, type BindRec, type PublishMsg } from "./sidecar-records.ts";
import { eventsHandler, sessionHandler } from "./sidecar-session.ts";

type Unary<Req, Res> = (call: ServerUnaryCall<Req, Res>, cb: sendUnaryData<Res>) => void;

/** A unary handler: `fn`'s answer, or its error with its status code (INTERNAL unless an RpcError). */
const unary =
  <Req, Res>(core: SidecarCore, fn: (req: Req) => Promise<Res> | Res): Unary<Req, Res> =>
  (call, cb) => {
    if (!core.authorized(call.metadata)) {
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

/** The agent, its arenas and publications (this host's, and acknowledgements of them from other hosts). */
function agentCalls(core: SidecarCore) {
  const { py, me, instance } = core;
  return {
    Health: unary(core, async () => ({
      fd_socket: py.hello.fdSocket ?? "",
      held_fds: Object.values(((await py.call("held")).held ?? {}) as Record<string, number>).reduce((a, n) => a + n, 0),
      agent: me,
      backends: py.hello.backends,
      plugins: py.hello.plugins,
      arenas: core.arenas.size,
      publications: core.pubs.size,
      copies_in_flight: core.inflight.size,
      remote_agents: core.remotes.size,
      remote_publications: core.remotePubs.size,
      instance,
      python_pid: py.hello.pid,
    })),
    RegisterArena: unary(core, async (req: { path: string; bytes: string; owner: string }) => {
      const r = await py.call("register", { path: req.path, bytes: Number(req.bytes) });
      const id = Number(r.arena);
      core.addArena({ id, path: req.path, bytes: BigInt(req.bytes), base: BigInt(String(r.base)), owner: req.owner });
      core.log(`arena ${id} registered for ${req.owner}: ${req.bytes} bytes`);
      return { arena: id, agent: me, instance, cross_host: core.cross !== null };
    }),
    ReleaseArena: unary(core, async (req: { arena: number }) => {
      const a = core.arenas.get(req.arena);
      if (!a) return { released: 0 };
      core.arenas.delete(req.arena);
      for (const [key, p] of core.pubs) if (p.src.arena === req.arena) core.pubs.delete(key);
      await py.call("deregister", { arena: req.arena });
      return { released: 1 };
    }),
    Metadata: unary(core, async () => {
      const r = await py.call("metadata");
      return { agent: me, metadata: Buffer.from(String(r.metadata), "base64") };
    }),
    AddRemote: unary(core, async (req: { metadata: Buffer }) => {
      const r = await py.call("add_remote", { metadata: Buffer.from(req.metadata).toString("base64") });
      return { agent: String(r.agent) };
    }),
    PublishMany: unary(core, (req: { entries: PublishMsg[] }) => {
      for (const e of req.entries) core.publish(e);
      return { released: req.entries.length };
    }),
    DropFds: unary(core, async (req: { tag: string }) => ({ released: Number((await py.call("drop_fds", { tag: req.tag })).dropped) })),
    Consumed: unary(core, (req: { instance: string; items: { key: string; src: AllocationMsg }[] }) => {
      // a restarted sidecar holds none of the old instance's publications
      if (req.instance !== instance) return { released: 0 };
      let n = 0;
      for (const it of req.items) {
        const p = core.pubs.get(it.key);
        const src = toAlloc(it.src, `consumed ${it.key}`);
        if (p && p.src.arena === src.arena && p.src.offset === src.offset) {
          core.dropPub(it.key, "consumed");
          n++;
        }
      }
      return { released: n };
    }),
  };
}

/** Copies call by call (a Session sends whole batches instead): bind, plan, submit, wait, and releasing a request. */
function copyCalls(core: SidecarCore) {
  return {
    Bind: unary(core, (req: { request_id: string; src: AllocationMsg; dst: AllocationMsg; context: string }) => {
      const src = toAlloc(req.src, "bind src");
      const dst = toAlloc(req.dst, "bind dst");
      if (src.length !== dst.length) throw new RpcError(status.INVALID_ARGUMENT, `bind: src holds ${src.length} bytes and dst ${dst.length}; a copy never resizes`);
      if (src.tier === "dram") core.addressOf(src, "bind src");
      if (dst.tier === "dram") core.addressOf(dst, "bind dst");
      const b: BindRec = { id: core.newId(), src, dst, context: req.context, planned: false };
      const list = core.binds.get(req.request_id) ?? [];
      list.push(b);
      core.binds.set(req.request_id, list);
      return { binding: b.id.toString() };
    }),
    Plan: unary(core, (req: { request_id: string; bindings: string[] }) => {
      const only = new Set((req.bindings ?? []).map((b) => BigInt(b)));
      const list = (core.binds.get(req.request_id) ?? []).filter((b) => !b.planned && (only.size === 0 || only.has(b.id)));
      if (list.length === 0) throw new RpcError(status.FAILED_PRECONDITION, `plan: request ${req.request_id} has no bound allocations (bind first)`);
      const { plan, routes } = core.planCopies(req.request_id, list);
      core.plans.set(plan.id, plan);
      return { plan: plan.id.toString(), routes, bytes: plan.bytes.toString(), copies: list.length };
    }),
    Submit: unary(core, async (req: { plan: string }) => {
      const p = core.plans.get(BigInt(req.plan));
      if (!p) throw new RpcError(status.NOT_FOUND, `submit: plan ${req.plan} is unknown (released, or already submitted)`);
      core.plans.delete(p.id);
      return { handle: (await core.submitPlan(p)).id.toString() };
    }),
    Wait: unary(core, async (req: { handle: string; timeout_ms: number }) => {
      const h = core.handles.get(BigInt(req.handle));
      if (!h) throw new RpcError(status.NOT_FOUND, `wait: handle ${req.handle} is unknown (released?)`);
      await core.settled(h, req.timeout_ms);
      return { state: h.state, reason: h.reason };
    }),
    Release: unary(core, async (req: { request_id: string }) => ({ released: await core.releaseRequest(req.request_id) })),
  };
}

/** The NixlAgent service's implementation over `core`. */
export function sidecarService(core: SidecarCore) {
  return { ...agentCalls(core), ...copyCalls(core), Session: sessionHandler(core), Events: eventsHandler(core) };
}
