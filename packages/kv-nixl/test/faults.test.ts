// Faults of the nixl transport, each against a real sidecar process and a real NIXL agent: a
// refused route, a flipped byte, a READ of a released blob or arena, and the sidecar killed in the
// middle of a request. Each ends in a typed error, and nothing stays registered or mapped.
import { spawn, type ChildProcess } from "node:child_process";
import { existsSync, readdirSync } from "node:fs";
import { createInterface } from "node:readline";
import { fileURLToPath } from "node:url";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { FencedTransport, blobKey, isAirmError, patternBytes } from "@airm/rm-core";
import { NIXL_CONFIG, NixlCopyTransport, defaultNixlPython, routeFor } from "../src/index.ts";
import { NixlAgentClient } from "../src/agent-client.ts";

const BIN = fileURLToPath(new URL("../bin/airm-kv-nixl-agent.mjs", import.meta.url));
const missing = !existsSync(defaultNixlPython());

/** Starts the sidecar bin on `listen`; resolves with its process and address once it listens. */
async function sidecar(listen = "127.0.0.1:0"): Promise<{ child: ChildProcess; addr: string }> {
  const child = spawn(process.execPath, [BIN, "--listen", listen], { stdio: ["ignore", "pipe", "pipe"], env: { ...process.env, AIRM_INTERNAL_TOKEN: "" } });
  const rl = createInterface({ input: child.stdout! });
  const addr = await new Promise<string>((resolve, reject) => {
    rl.on("line", (l) => {
      const m = /listening on (\S+)/.exec(l);
      if (m) resolve(m[1]);
    });
    child.once("exit", (c) => reject(new Error(`sidecar exited (${c})`)));
  });
  return { child, addr };
}

const opts = (addr: string, over: Partial<ReturnType<typeof NIXL_CONFIG.resolve>> = {}) =>
  NIXL_CONFIG.resolve({ env: {}, options: { addr, poolMb: 80, rpcTimeoutMs: 1500, ...over } });
const ourArenaFiles = () => readdirSync("/dev/shm").filter((f) => f.startsWith(`airm-nixl-${process.pid}-`));

describe("routes (the seed's table, checked at plan)", () => {
  it("dram->dram over UCX; the NPU routes only with the HETERO_NPU plugin; host->host, atom->*, rngd->rngd never", () => {
    expect(routeFor("dram", "dram", ["UCX"]).backend).toBe("UCX");
    for (const [s, d] of [
      ["rngd", "dmabuf"],
      ["rngd", "host"],
      ["host", "rngd"],
    ]) {
      expect(() => routeFor(s, d, ["UCX", "POSIX"])).toThrow(/HETERO_NPU backend plugin is not loaded/);
      // the plugin list is the boundary: with HETERO_NPU loaded (an NPU node) plan accepts them
      expect(routeFor(s, d, ["UCX", "HETERO_NPU"]).backend).toBe("HETERO_NPU");
    }
    expect(() => routeFor("host", "host", ["UCX", "HETERO_NPU"])).toThrow(/host -> host/);
    expect(() => routeFor("atom", "dram", ["UCX", "HETERO_NPU"])).toThrow(/ATOM memory is never a source/);
    expect(() => routeFor("rngd", "rngd", ["UCX", "HETERO_NPU"])).toThrow(/two staging legs/);
    expect(() => routeFor("gpu", "dram", ["UCX"])).toThrow(/unknown memory tier/);
  });
});

describe.skipIf(missing)("faults against a real sidecar", () => {
  let sc: { child: ChildProcess; addr: string };
  beforeAll(async () => {
    sc = await sidecar();
  }, 60_000);
  afterAll(() => {
    sc?.child.kill("SIGKILL");
  });

  it("a wrong route is refused at plan with the reason, through the sidecar (no HETERO_NPU here)", async () => {
    const client = new NixlAgentClient(sc.addr, undefined, 3000);
    try {
      const h = await client.health();
      expect(h.plugins).toContain("UCX");
      expect(h.plugins).not.toContain("HETERO_NPU");
      const dev = (tier: "rngd" | "dmabuf" | "host" | "atom") => ({ tier, agent: h.agent, arena: 0, offset: 0, length: 4096 });
      for (const [s, d, why] of [
        ["rngd", "dmabuf", /HETERO_NPU backend plugin is not loaded/],
        ["rngd", "host", /HETERO_NPU backend plugin is not loaded/],
        ["host", "host", /host -> host/],
        ["atom", "host", /ATOM memory is never a source/],
        ["rngd", "rngd", /two staging legs/],
      ] as const) {
        const rid = `route-${s}-${d}`;
        await client.bind(rid, { src: dev(s), dst: dev(d) });
        const e = await client.plan(rid).catch((x: unknown) => x);
        expect(isAirmError(e, "UNSUPPORTED"), String(e)).toBe(true);
        expect((e as Error).message).toMatch(why);
        await client.release(rid);
      }
      expect((await client.health()).publications).toBe(0);
    } finally {
      client.close();
    }
  });

  it("a flipped byte in the producer's slot is a KV_INTEGRITY failure at the fence, never wrong bytes", async () => {
    const producer = await NixlCopyTransport.open(opts(sc.addr));
    const consumer = new FencedTransport(await NixlCopyTransport.open(opts(sc.addr)));
    try {
      const key = blobKey("flip-1", 0, "k");
      const data = patternBytes(3, 100_000);
      const plan = await producer.plan({ requestId: "flip-1", key, src: data });
      (producer as unknown as { arena: { bytes: Uint8Array } }).arena.bytes[plan.offset + 777] ^= 0x10;
      await producer.submit(plan);
      const e = await consumer.pull(key, { timeoutMs: 5000 }).catch((x: unknown) => x);
      expect(isAirmError(e), String(e)).toBe(true);
      expect((e as Error).message).toMatch(/KV_INTEGRITY: CRC-32/);
      await consumer.release("flip-1");
      await producer.release("flip-1");
      expect(producer.stats().bytes).toBe(0);
      expect(consumer.stats().bytes).toBe(0);
    } finally {
      await consumer.close();
      await producer.close();
    }
  });

  it("a blob read by a consumer gives the producer its slot back without a release (the sidecar's slot events)", async () => {
    const producer = new FencedTransport(await NixlCopyTransport.open(opts(sc.addr)));
    const consumer = new FencedTransport(await NixlCopyTransport.open(opts(sc.addr)));
    try {
      const data = patternBytes(8, 200_000);
      for (const l of [0, 1]) await producer.push(blobKey("read-1", l, "k"), data);
      expect(producer.stats().blobs).toBe(2);
      for (const l of [0, 1]) expect(Buffer.from((await consumer.pull(blobKey("read-1", l, "k"), { timeoutMs: 5000 })).bytes).equals(Buffer.from(data))).toBe(true);
      const until = Date.now() + 5000;
      while (producer.stats().blobs > 0 && Date.now() < until) await new Promise((r) => setTimeout(r, 20));
      expect(producer.stats()).toMatchObject({ blobs: 0, bytes: 0 });
      await consumer.release("read-1");
      expect(consumer.stats().bytes).toBe(0);
    } finally {
      await consumer.close();
      await producer.close();
    }
  });

  it("a READ of a released blob or of a released arena fails typed; the producer's slot is free again", async () => {
    const producer = new FencedTransport(await NixlCopyTransport.open(opts(sc.addr)));
    const consumer = new FencedTransport(await NixlCopyTransport.open(opts(sc.addr)));
    const client = new NixlAgentClient(sc.addr, undefined, 3000);
    try {
      const key = blobKey("rel-1", 0, "v");
      await producer.push(key, patternBytes(5, 65_536));
      expect(producer.stats().bytes).toBeGreaterThan(0);
      await producer.release("rel-1");
      expect(producer.stats().bytes).toBe(0);
      const e = await consumer.pull(key, { timeoutMs: 300 }).catch((x: unknown) => x);
      expect(isAirmError(e, "TRANSPORT_TIMEOUT"), String(e)).toBe(true);
      // a copy bound to a slot whose arena was given back: refused when it is bound
      const lone = await NixlCopyTransport.open(opts(sc.addr));
      const p = await lone.plan({ requestId: "rel-2", key: blobKey("rel-2", 0, "k"), src: patternBytes(6, 4096) });
      const h = await lone.submit(p);
      await lone.close();
      const bound = await client.bind("rel-2", { src: h.src, dst: h.src, context: "x" }).catch((x: unknown) => x);
      expect(isAirmError(bound), String(bound)).toBe(true);
      expect((bound as Error).message).toMatch(/not registered here/);
      const health = await client.health();
      expect(health.publications).toBe(0);
    } finally {
      client.close();
      await consumer.close();
      await producer.close();
    }
    expect(ourArenaFiles()).toEqual([]);
  });

  it("a hung NIXL agent (SIGSTOP) fails the copies waiting on it with a TransportError within their deadline, not a hang; once it runs again the same endpoints work", async () => {
    const own = await sidecar();
    const client = new NixlAgentClient(own.addr, undefined, 3000);
    const { python_pid: pythonPid } = await client.health();
    client.close();
    const producer = new FencedTransport(await NixlCopyTransport.open(opts(own.addr)));
    const consumer = new FencedTransport(await NixlCopyTransport.open(opts(own.addr)));
    try {
      for (let i = 0; i < 4; i++) await producer.push(blobKey("hung-1", i, "k"), patternBytes(i + 1, 1 << 20));
      process.kill(pythonPid, "SIGSTOP");
      const t0 = Date.now();
      let results: unknown[];
      try {
        results = await Promise.all(
          [0, 1, 2, 3].map((i) =>
            consumer.pull(blobKey("hung-1", i, "k"), { timeoutMs: 20_000 }).then(
              () => "ok",
              (e: unknown) => e,
            ),
          ),
        );
      } finally {
        process.kill(pythonPid, "SIGCONT");
      }
      // the batch is read with the endpoint's RPC deadline (1.5 s here) as its fence, then 1.5 s of grace
      for (const r of results) {
        expect(isAirmError(r, "TRANSPORT_ERROR"), String(r)).toBe(true);
        expect(String((r as Error).message)).toMatch(/did not answer/);
      }
      expect(Date.now() - t0).toBeLessThan(10_000);
      // the agent runs again: the same endpoints push and pull
      const key = blobKey("hung-2", 0, "k");
      const data = patternBytes(12, 200_000);
      await producer.push(key, data);
      const got = await consumer.pull(key, { timeoutMs: 5000 });
      expect(Buffer.from(got.bytes).equals(Buffer.from(data))).toBe(true);
      await consumer.release("hung-2");
      await producer.release("hung-2");
    } finally {
      await consumer.close();
      await producer.close();
      own.child.kill("SIGKILL");
    }
    expect(ourArenaFiles()).toEqual([]);
  }, 60_000);

  it("the sidecar killed in the middle of a 64 MiB request: every pull fails typed within its deadline, the agent goes with it, nothing stays mapped; a new sidecar serves the same endpoints", async () => {
    const own = await sidecar();
    const client = new NixlAgentClient(own.addr, undefined, 3000);
    const { python_pid: pythonPid, fd_socket: fdSocket } = await client.health();
    client.close();
    const producer = new FencedTransport(await NixlCopyTransport.open(opts(own.addr)));
    const consumer = new FencedTransport(await NixlCopyTransport.open(opts(own.addr)));
    try {
      const blobs = Array.from({ length: 64 }, (_, i) => patternBytes(i + 1, 1 << 20));
      for (let i = 0; i < 64; i++) await producer.push(blobKey("kill-1", i >> 1, i % 2 ? "v" : "k"), blobs[i]);
      const t0 = Date.now();
      const pulls = blobs.map((_, i) =>
        consumer.pull(blobKey("kill-1", i >> 1, i % 2 ? "v" : "k"), { timeoutMs: 20_000 }).then(
          () => "ok",
          (e: unknown) => e,
        ),
      );
      own.child.kill("SIGKILL");
      const results = await Promise.all(pulls);
      const failed = results.filter((r) => r !== "ok");
      expect(failed.length).toBeGreaterThan(0);
      for (const f of failed) expect(isAirmError(f), String(f)).toBe(true);
      expect(Date.now() - t0).toBeLessThan(15_000);
      // the Python agent ends with its sidecar (its stdin closes)
      const deadline = Date.now() + 5000;
      while (existsSync(`/proc/${pythonPid}`) && Date.now() < deadline) await new Promise((r) => setTimeout(r, 100));
      expect(existsSync(`/proc/${pythonPid}`)).toBe(false);
      // and takes its fd socket with it
      expect(existsSync(fdSocket)).toBe(false);
      // a supervisor starts the sidecar again on its address: the endpoints register again (once
      // each, however many calls find the old sidecar gone at the same time) and work
      const again = await sidecar(own.addr);
      try {
        const keys = Array.from({ length: 16 }, (_, i) => blobKey("kill-2", i >> 1, i % 2 ? "v" : "k"));
        const data = keys.map((_, i) => patternBytes(11 + i, 300_000));
        await Promise.all(keys.map((k, i) => producer.push(k, data[i])));
        const got = await Promise.all(keys.map((k) => consumer.pull(k, { timeoutMs: 5000 })));
        for (const [i, g] of got.entries()) expect(Buffer.from(g.bytes).equals(Buffer.from(data[i]))).toBe(true);
        const health = new NixlAgentClient(again.addr, undefined, 3000);
        expect((await health.health()).arenas).toBe(2);
        health.close();
        await consumer.release("kill-2");
        await producer.release("kill-2");
      } finally {
        await consumer.close();
        await producer.close();
        again.child.kill("SIGKILL");
      }
    } finally {
      own.child.kill("SIGKILL");
    }
    expect(ourArenaFiles()).toEqual([]);
  }, 60_000);
});

describe.skipIf(missing)("file descriptors handed to the agent (SCM_RIGHTS)", () => {
  it("memfds sent by a worker are held by the agent after the sender closed them, and read through the agent's own mapping", async () => {
    const { startSidecar } = await import("../src/index.ts");
    const { sendFds, memfdWith, closeFd, NixlAgentClient } = await import("../src/index.ts");
    const { kvCrc32 } = await import("@airm/rm-core");
    const sc = await startSidecar({ listen: "127.0.0.1:0", python: defaultNixlPython(), env: {} });
    const client = new NixlAgentClient(sc.address, undefined, 3000);
    let socketPath = "";
    try {
      const h = await client.health();
      socketPath = h.fd_socket;
      expect(h.fd_socket).toMatch(/\.sock$/);
      expect(existsSync(h.fd_socket)).toBe(true);
      const a = patternBytes(21, 1 << 20);
      const b = patternBytes(22, 4096);
      const fds = [memfdWith("dmabuf-a", a), memfdWith("dmabuf-b", b, 65536)];
      const r = sendFds(h.fd_socket, fds, { tag: "req-1", check: 1 << 20 }) as { fds: { bytes: number; crc32: number }[] };
      for (const fd of fds) closeFd(fd);
      // the agent saw the same memory through its own descriptors
      expect(r.fds).toEqual([
        { bytes: 1 << 20, crc32: kvCrc32(a) },
        { bytes: 65536, crc32: kvCrc32(Buffer.concat([Buffer.from(b), Buffer.alloc(65536 - 4096)])) },
      ]);
      expect((await client.health()).held_fds).toBe(2);
      // a message without descriptors is refused with the reason, and holds nothing
      expect(() => sendFds(h.fd_socket, [], { tag: "req-2" })).toThrow(/no file descriptor came with the message/);
      expect(await client.call("DropFds", { tag: "req-1" })).toEqual({ released: 2 });
      expect((await client.health()).held_fds).toBe(0);
    } finally {
      client.close();
      await sc.close();
    }
    expect(existsSync(socketPath)).toBe(false);
  });
});
