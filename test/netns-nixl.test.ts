// The `nixl` transport across hosts for real: a NIXL agent sidecar on each of two hosts (network
// namespaces joined by a switch, links shaped to 1 Gbit/s, scripts/netns-rig), the KV relay on a
// third. A producer endpoint on prefill-node pushes 64 x 1 MiB; a consumer endpoint on
// decode-node pulls them: its sidecar finds the descriptors in the relay, adds the producer's
// agent and READs the bytes over UCX's TCP transport across the link (the counters of the hosts'
// eth0 show it). Needs root and the NIXL wheels; skipped with the reason otherwise.
import type { ChildProcess } from "node:child_process";
import { existsSync, mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { createInterface } from "node:readline";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { SIDECAR_CONFIG, defaultNixlPython } from "../packages/kv-nixl/src/index.ts";
import { makeTinyModel } from "../packages/llama/src/index.ts";
import { gatewayArgv } from "../packages/workload-runner/src/rngd-pd-workload.ts";
import { NetnsRig } from "../scripts/netns-rig/rig.ts";
import { bin, fetchIn, QUIET, SoloReference, until } from "./netns-helpers.ts";

const python = SIDECAR_CONFIG.resolve({ env: process.env }).python ?? defaultNixlPython();
const why =
  process.getuid?.() !== 0
    ? "needs root (CAP_NET_ADMIN)"
    : ["/usr/sbin/ip", "/usr/sbin/tc"].some((p) => !existsSync(p))
      ? "needs iproute2 (ip, tc)"
      : !existsSync(python)
        ? `the NIXL wheels are not installed (no ${python}); run scripts/tools/nixl.sh`
        : null;
const src = (path: string) => new URL(`../packages/${path}`, import.meta.url).href;
const MIB = 1 << 20;
const BLOBS = 64;

/**
 * An endpoint process in a host: JSON commands on stdin, one JSON answer per line. push: `n`
 * blobs of `size` bytes (patternBytes(seed + i)) under `${rid}/${i}/k`; pull: the same keys,
 * checked byte for byte; release; flip (a byte of each staged blob); stats (the endpoint's) and
 * health (its sidecar's).
 */
const ENDPOINT = `
import { createInterface } from "node:readline";
import { NIXL_CONFIG, NixlCopyTransport, NixlAgentClient } from ${JSON.stringify(src("kv-nixl/src/index.ts"))};
import { FencedTransport, patternBytes } from ${JSON.stringify(src("rm-core/src/index.ts"))};
const o = NIXL_CONFIG.resolve({ env: process.env, options: { poolMb: 160 } });
const n = await NixlCopyTransport.open(o);
const t = new FencedTransport(n);
const sidecar = new NixlAgentClient(o.addr, undefined, 5000);
const say = (m) => process.stdout.write(JSON.stringify(m) + "\\n");
say({ ready: true });
const keys = (c) => Array.from({ length: c.n }, (_, i) => c.rid + "/" + i + "/k");
for await (const line of createInterface({ input: process.stdin })) {
  const c = JSON.parse(line);
  try {
    if (c.op === "push") {
      const t0 = performance.now();
      await Promise.all(keys(c).map((k, i) => t.push(k, patternBytes(c.seed + i, c.size))));
      say({ ok: true, ms: performance.now() - t0 });
    } else if (c.op === "pull") {
      const t0 = performance.now();
      const got = await Promise.all(keys(c).map((k) => t.pull(k, { timeoutMs: c.timeoutMs })));
      const ms = performance.now() - t0;
      let bytes = 0, equal = 0;
      for (const [i, b] of got.entries()) {
        bytes += b.bytes.byteLength;
        if (Buffer.from(b.bytes.buffer, b.bytes.byteOffset, b.bytes.byteLength).equals(Buffer.from(patternBytes(c.seed + i, c.size)))) equal++;
      }
      say({ ok: true, ms, bytes, equal });
    } else if (c.op === "release") {
      await t.release(c.rid);
      say({ ok: true });
    } else if (c.op === "flip") {
      // one byte of every blob this endpoint staged, after its CRC-32 was taken
      for (const s of n.srcSlots.values()) n.arena.bytes[s.offset + 777] ^= 0x10;
      say({ ok: true });
    } else if (c.op === "stats") {
      say({ ok: true, stats: t.stats(), health: await sidecar.health() });
    } else if (c.op === "exit") {
      await t.close();
      say({ ok: true });
      process.exit(0);
    }
  } catch (e) {
    say({ ok: false, error: String(e?.message ?? e), code: e?.code });
  }
}
`;

interface Answer {
  ok: boolean;
  error?: string;
  code?: string;
  ms?: number;
  bytes?: number;
  equal?: number;
  stats?: { blobs: number; bytes: number; expired: number };
  health?: { publications: number; arenas: number; remote_agents: number; remote_publications: number; copies_in_flight: number };
}

class Endpoint {
  private readonly answers: ((a: Answer) => void)[] = [];
  private readonly ready: Promise<void>;
  constructor(readonly p: ChildProcess) {
    let up: () => void;
    this.ready = new Promise((r) => {
      up = r;
    });
    let err = "";
    p.stderr!.on("data", (d: Buffer) => {
      err = (err + d.toString()).slice(-2000);
    });
    p.once("exit", (code) => {
      for (const a of this.answers.splice(0)) a({ ok: false, error: `the endpoint exited ${code}: ${err}` });
    });
    createInterface({ input: p.stdout! }).on("line", (line) => {
      const m = JSON.parse(line) as Answer & { ready?: boolean };
      if (m.ready) up();
      else this.answers.shift()?.(m);
    });
  }
  async send(cmd: Record<string, unknown>): Promise<Answer> {
    await this.ready;
    return new Promise((resolve) => {
      this.answers.push(resolve);
      this.p.stdin!.write(`${JSON.stringify(cmd)}\n`);
    });
  }
}

describe.skipIf(why !== null)(`nixl across network namespaces${why ? ` (skipped: ${why})` : ""}`, () => {
  let rig: NetnsRig;
  let producer: Endpoint;
  let consumer: Endpoint;
  const sidecars = new Map<string, ChildProcess>();
  let startSidecar: (h: string) => Promise<void>;
  let openEndpoint: (h: string) => Endpoint;
  const ip = (h: string) => rig.host(h).address;
  /** eth0's byte counters in `host` (/proc/net/dev is the reader's namespace's; /sys would be this one's). */
  const counter = (host: string, what: "rx_bytes" | "tx_bytes") => {
    const line = rig
      .sh(host, "cat", ["/proc/net/dev"])
      .split("\n")
      .find((l) => l.trim().startsWith("eth0:"));
    if (!line) throw new Error(`no eth0 in ${host}'s /proc/net/dev`);
    const f = line.trim().slice(5).trim().split(/\s+/).map(Number);
    return what === "rx_bytes" ? f[0]! : f[8]!;
  };

  beforeAll(async () => {
    rig = await NetnsRig.up({ hosts: ["prefill-node", "decode-node", "relay-node"], link: { rate: "1gbit", burst: "256kb", mtu: 1500 } });
    const base = {
      ...process.env,
      AIRM_LOG_LEVEL: "warn",
      AIRM_NIXL_PYTHON: python,
      AIRM_KV_TCP_ADDR: `${ip("relay-node")}:7400`,
      AIRM_KV_NIXL_CROSS_HOST: "1",
      // The namespaces share this machine: left to itself UCX would see one node and move the
      // bytes through shared memory (cma, posix). A real second host has no such path; here the
      // agents are held to TCP over eth0 so the bytes cross the shaped link.
      UCX_TLS: "tcp",
      UCX_NET_DEVICES: "eth0",
    };
    rig.spawn("relay-node", process.execPath, [bin("kv-relay", "airm-kv-relay"), "--listen", `${ip("relay-node")}:7400`], { stdio: "ignore", env: base });
    startSidecar = (h) => {
      const p = rig.spawn(h, process.execPath, [bin("kv-nixl", "airm-kv-nixl-agent"), "--listen", `${ip(h)}:7500`], { stdio: ["ignore", "pipe", "inherit"], env: base });
      sidecars.set(h, p);
      return new Promise<void>((resolve, reject) => {
        p.stdout!.on("data", (d: Buffer) => {
          if (d.toString().includes("listening on")) resolve();
        });
        p.once("exit", (code) => reject(new Error(`the sidecar on ${h} exited ${code}`)));
      });
    };
    await Promise.all(["prefill-node", "decode-node"].map((h) => startSidecar(h)));
    const endpoint = (h: string) =>
      new Endpoint(
        rig.spawn(h, process.execPath, ["--import", "tsx", "--input-type=module", "-e", ENDPOINT], {
          stdio: ["pipe", "pipe", "pipe"],
          env: { ...base, AIRM_KV_NIXL_ADDR: `${ip(h)}:7500` },
        }),
      );
    openEndpoint = endpoint;
    producer = endpoint("prefill-node");
    consumer = endpoint("decode-node");
  }, 120_000);

  afterAll(async () => {
    await Promise.all([producer?.send({ op: "exit" }), consumer?.send({ op: "exit" })].map((p) => p?.catch(() => undefined)));
    await rig?.down();
  });

  it("64 x 1 MiB pushed on prefill-node are READ by decode-node's agent across the link, byte for byte; both hosts hold nothing after", { timeout: 120_000 }, async () => {
    const rid = "xhost1";
    const pushed = await producer.send({ op: "push", rid, n: BLOBS, size: MIB, seed: 7 });
    expect(pushed.error).toBeUndefined();
    const [tx0, rx0] = [counter("prefill-node", "tx_bytes"), counter("decode-node", "rx_bytes")];
    const pulled = await consumer.send({ op: "pull", rid, n: BLOBS, size: MIB, seed: 7, timeoutMs: 30_000 });
    const [tx, rx] = [counter("prefill-node", "tx_bytes") - tx0, counter("decode-node", "rx_bytes") - rx0];
    console.log(
      `nixl across hosts: ${BLOBS} x 1 MiB pushed in ${pushed.ms?.toFixed(1)} ms, pulled in ${pulled.ms?.toFixed(1)} ms ` +
        `(${(((pulled.bytes ?? 0) / (pulled.ms ?? 1)) * 1e-6).toFixed(3)} GB/s incl. the first metadata exchange); prefill eth0 sent ${tx} bytes, decode eth0 received ${rx}`,
    );
    expect(pulled.error).toBeUndefined();
    expect(pulled.bytes).toBe(BLOBS * MIB);
    expect(pulled.equal).toBe(BLOBS);
    // the bytes crossed the link (UCX's TCP between the two hosts), not a path inside the machine
    expect(tx).toBeGreaterThan(BLOBS * MIB);
    expect(rx).toBeGreaterThan(BLOBS * MIB);
    // the consumer's sidecar acknowledged each READ: the producer's slots are free, nothing published
    await until(
      "the producer's slots are given back",
      async () => {
        const s = await producer.send({ op: "stats" });
        return s.stats?.blobs === 0 && s.stats.bytes === 0 && s.health?.publications === 0;
      },
      10,
    );
    const c = await consumer.send({ op: "stats" });
    expect(c.health?.remote_agents).toBe(1);
    expect(c.health?.remote_publications).toBe(0);
    expect(c.stats?.bytes).toBe(BLOBS * MIB); // the pulled blobs, held until release
    expect((await consumer.send({ op: "release", rid })).ok).toBe(true);
    expect((await consumer.send({ op: "stats" })).stats?.bytes).toBe(0);
    expect((await producer.send({ op: "release", rid })).ok).toBe(true);

    // a second producer of the host registers an arena the consumer's agent has not seen: its
    // metadata is added again (the same remote agent, one more registration), bytes exact
    const producer2 = openEndpoint("prefill-node");
    const again = await producer2.send({ op: "push", rid: "xhost2", n: BLOBS, size: MIB, seed: 99 });
    expect(again.error).toBeUndefined();
    const second = await consumer.send({ op: "pull", rid: "xhost2", n: BLOBS, size: MIB, seed: 99, timeoutMs: 30_000 });
    console.log(`second request: ${BLOBS} x 1 MiB pulled across the link in ${second.ms?.toFixed(1)} ms (${((BLOBS * MIB) / (second.ms ?? 1)) * 1e-6} GB/s)`);
    expect(second.equal).toBe(BLOBS);
    expect((await consumer.send({ op: "stats" })).health?.remote_agents).toBe(1);
    await consumer.send({ op: "release", rid: "xhost2" });
    await until("the second producer holds nothing", async () => (await producer2.send({ op: "stats" })).stats?.bytes === 0, 10);
    expect((await producer2.send({ op: "exit" })).ok).toBe(true);
  });

  it("a blob released by its producer before the consumer pulls it is a timeout on the other host, never stale bytes", { timeout: 60_000 }, async () => {
    const rid = "xhost3";
    expect((await producer.send({ op: "push", rid, n: 2, size: MIB, seed: 3 })).error).toBeUndefined();
    expect((await producer.send({ op: "release", rid })).ok).toBe(true);
    const p = await producer.send({ op: "stats" });
    expect(p.stats?.bytes).toBe(0);
    expect(p.health?.publications).toBe(0);
    const pulled = await consumer.send({ op: "pull", rid, n: 2, size: MIB, seed: 3, timeoutMs: 1500 });
    expect(pulled.ok).toBe(false);
    expect(pulled.code).toBe("TRANSPORT_TIMEOUT");
    await consumer.send({ op: "release", rid });
    expect((await consumer.send({ op: "stats" })).stats?.bytes).toBe(0);
  });

  it("a flipped byte in the producer's slot on the other host is a KV_INTEGRITY failure at the consumer, never wrong bytes", { timeout: 60_000 }, async () => {
    const rid = "xhost4";
    expect((await producer.send({ op: "push", rid, n: 1, size: MIB, seed: 5 })).error).toBeUndefined();
    expect((await producer.send({ op: "flip" })).ok).toBe(true);
    const pulled = await consumer.send({ op: "pull", rid, n: 1, size: MIB, seed: 5, timeoutMs: 10_000 });
    expect(pulled.ok).toBe(false);
    expect(pulled.error).toMatch(/KV_INTEGRITY: CRC-32/);
    await consumer.send({ op: "release", rid });
    await producer.send({ op: "release", rid });
    await until("the producer holds nothing", async () => (await producer.send({ op: "stats" })).stats?.bytes === 0, 10);
    expect((await consumer.send({ op: "stats" })).stats?.bytes).toBe(0);
  });

  it("the producer host's sidecar restarted: the consumer's sidecar drops the old agent and adds the new one (new metadata), bytes still exact", { timeout: 90_000 }, async () => {
    const old = sidecars.get("prefill-node")!;
    const gone = new Promise((r) => old.once("exit", r));
    old.kill("SIGKILL");
    await gone;
    await startSidecar("prefill-node");
    const rid = "xhost5";
    // the first call after the restart registers the producer's arena with the new agent
    let pushed = await producer.send({ op: "push", rid, n: 16, size: MIB, seed: 11 });
    if (!pushed.ok) pushed = await producer.send({ op: "push", rid, n: 16, size: MIB, seed: 11 });
    expect(pushed.error).toBeUndefined();
    const pulled = await consumer.send({ op: "pull", rid, n: 16, size: MIB, seed: 11, timeoutMs: 30_000 });
    expect(pulled.error).toBeUndefined();
    expect(pulled.equal).toBe(16);
    const c = await consumer.send({ op: "stats" });
    expect(c.health?.remote_agents).toBe(1);
    expect(c.health?.remote_publications).toBe(0);
    await consumer.send({ op: "release", rid });
    await producer.send({ op: "release", rid });
    await until("the producer holds nothing", async () => (await producer.send({ op: "stats" })).stats?.bytes === 0, 10);
    expect((await consumer.send({ op: "stats" })).stats?.bytes).toBe(0);
  });
});

describe.skipIf(why !== null)(`PD over nixl across network namespaces${why ? ` (skipped: ${why})` : ""}`, () => {
  let rig: NetnsRig;
  const solo = new SoloReference();
  const model = mkdtempSync(join(tmpdir(), "airm-netns-nixl-model-"));

  beforeAll(async () => {
    makeTinyModel({ arch: "llama", out: model });
    rig = await NetnsRig.up({ hosts: ["gateway-node", "prefill-node", "decode-node", "relay-node"], link: { rate: "1gbit", burst: "256kb", mtu: 1500 } });
    const ip = (h: string) => rig.host(h).address;
    const env = {
      ...process.env,
      ...QUIET,
      AIRM_NIXL_PYTHON: python,
      AIRM_KV_TRANSPORT: "nixl",
      AIRM_KV_TCP_ADDR: `${ip("relay-node")}:7400`,
      AIRM_KV_NIXL_CROSS_HOST: "1",
      AIRM_KV_NIXL_POOL_MB: "64",
      UCX_TLS: "tcp", // see above: the namespaces share the machine, the bytes must take the link
      UCX_NET_DEVICES: "eth0",
    };
    rig.spawn("relay-node", process.execPath, [bin("kv-relay", "airm-kv-relay"), "--listen", `${ip("relay-node")}:7400`], { stdio: "ignore", env });
    for (const [h, role, backend, port] of [
      ["prefill-node", "prefill", "rngd-full", "8101"],
      ["decode-node", "decode", "atom", "8102"],
    ] as const) {
      const hostEnv = { ...env, AIRM_KV_NIXL_ADDR: `${ip(h)}:7500` };
      rig.spawn(h, process.execPath, [bin("kv-nixl", "airm-kv-nixl-agent"), "--listen", `${ip(h)}:7500`], { stdio: "ignore", env: hostEnv });
      rig.spawn(h, process.execPath, [bin("worker", "airm-worker"), "--role", role, "--backend", backend, "--host", ip(h), "--port", port, "--model", model], {
        stdio: "ignore",
        env: hostEnv,
      });
    }
    const gw = gatewayArgv({ host: ip("gateway-node"), port: 8000, prefill: [`http://${ip("prefill-node")}:8101`], decode: [`http://${ip("decode-node")}:8102`] });
    rig.spawn("gateway-node", gw[0]!, gw.slice(1), { stdio: "ignore", env: { ...process.env, ...QUIET, AIRM_HEALTH_INTERVAL_MS: "500" } });
    await solo.start(model);
    await until(
      "the gateway in the rig is healthy",
      () => {
        try {
          return JSON.parse(fetchIn(rig, "gateway-node", `http://${ip("gateway-node")}:8000/health`)).status === "ok";
        } catch {
          return false;
        }
      },
      120,
    );
  }, 240_000);

  afterAll(async () => {
    solo.stop();
    await rig?.down();
    rmSync(model, { recursive: true, force: true });
  });

  it("prefill and decode on two hosts, KV by NIXL READs across the link, give the solo worker's tokens, greedy and seeded", { timeout: 60_000 }, async () => {
    const gw = `http://${rig.host("gateway-node").address}:8000`;
    const pdModel = JSON.parse(fetchIn(rig, "gateway-node", `${gw}/v1/models`)).data[0].id;
    for (const extra of [{ temperature: 0 }, { temperature: 0.9, top_p: 0.95, seed: 4242 }]) {
      const req = { prompt: "The quick brown fox jumps over the lazy dog and", max_tokens: 24, ...extra };
      const pd = JSON.parse(fetchIn(rig, "gateway-node", `${gw}/v1/completions`, { ...req, model: pdModel }));
      expect(pd.usage.completion_tokens).toBe(24);
      expect(pd.choices[0].text).toBe(await solo.text(req));
    }
    // the KV came by the cross-host path: the decode host's agent added the prefill host's, and
    // nothing it was handed is left unread; the prefill host's agent holds no publication
    const health = (h: string) =>
      JSON.parse(
        rig.sh(h, process.execPath, [
          "--import",
          "tsx",
          "--input-type=module",
          "-e",
          `import { NixlAgentClient } from ${JSON.stringify(src("kv-nixl/src/index.ts"))};
           const c = new NixlAgentClient(${JSON.stringify(`${rig.host(h).address}:7500`)}, undefined, 5000);
           process.stdout.write(JSON.stringify(await c.health())); c.close();`,
        ]),
      ) as { remote_agents: number; remote_publications: number; publications: number };
    await until("the prefill host's agent holds no publication", () => health("prefill-node").publications === 0, 15);
    const d = health("decode-node");
    expect(d.remote_agents).toBe(1);
    expect(d.remote_publications).toBe(0);
  });
});
