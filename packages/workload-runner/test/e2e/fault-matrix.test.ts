// The fault matrix with real processes (docs/fault-matrix.md lists every case and where it is
// tested): each case kills or breaks one thing, asserts the bounded, clear error (or success) a
// client sees, and then that nothing is left: no KV link under the shm root, no slab of a dead
// process, every live worker's lease gauge back to 0.
import { spawn, spawnSync } from "node:child_process";
import { existsSync, mkdtempSync, readdirSync, rmSync } from "node:fs";
import { join } from "node:path";
import { WorkerClient } from "@airm/internal-api";
import { startFlipProxy } from "@airm/kv-relay/testing";
import { newInternalToken } from "@airm/rm-core";
import { afterAll, afterEach, beforeAll, describe, expect, it } from "vitest";
import { binPath, freePort, type RunningCluster } from "../../src/index.ts";
import { cluster, deadSlabs, health, leftoverBlobs, modelId, postJson, tinyModel, until, SLOW_MODEL } from "../helpers/cluster.ts";

const SLOW_S = 512;
/** Big enough that prefill and decode take a while on the CPU path, so a fault lands mid-request. */
let slowModel: string;
const clusters: RunningCluster[] = [];
const cleanups: (() => unknown)[] = [];

beforeAll(() => {
  slowModel = tinyModel(SLOW_MODEL);
});
afterEach(async () => {
  await Promise.all(clusters.splice(0).map((c) => c.stop()));
  while (cleanups.length) await cleanups.pop()!();
});
afterAll(() => rmSync(slowModel, { recursive: true, force: true }));

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

/** A long prompt (token ids) and a long answer: prefill and decode both take a while. */
const longBody = (id: string, promptTokens = 400, maxTokens = 64) => ({
  model: id,
  prompt: Array.from({ length: promptTokens }, (_, i) => 10 + (i % 200)),
  max_tokens: maxTokens,
  temperature: 0,
});

/** A relay metrics port for a tcp cluster (sidecarEnv), so a case can check the relay holds no blob afterwards. */
async function relayMetrics(): Promise<{ sidecarEnv: Record<string, string>; url: string }> {
  const port = await freePort();
  return { sidecarEnv: { AIRM_METRICS_PORT: String(port) }, url: `http://127.0.0.1:${port}/metrics` };
}

/** The relay's airm_kv_relay_blobs gauge. */
async function relayBlobs(metricsUrl: string): Promise<number> {
  const m = await (await fetch(metricsUrl)).text();
  return Number(/^airm_kv_relay_blobs(?:\{[^}]*\})? (\d+)$/m.exec(m)?.[1] ?? Number.NaN);
}

/**
 * Waits until nothing of any request is left: no KV link, no dead process's slab, no open lease on
 * a live worker, and (given its metrics URL) no blob in the relay.
 */
async function expectNoLeaks(c: RunningCluster, shmRoot = c.clusterDir, relayMetricsUrl?: string): Promise<void> {
  const workers = c.parts.filter((p) => p.alive && /^(prefill|decode|solo)/.test(p.name));
  const leases = async () => {
    const hs = await Promise.all(workers.map(async (w) => (await health(w.url)).leases.outstanding as number));
    return hs.every((n) => n === 0);
  };
  await until(leases, "every live worker's leases to end", 30_000);
  if (shmRoot) {
    // a killed endpoint's slabs are swept by the live ones within seconds
    await until(() => leftoverBlobs(shmRoot).length === 0 && deadSlabs(shmRoot).length === 0, `no KV left under ${shmRoot}`, 20_000, 100);
  }
  if (relayMetricsUrl) await until(async () => (await relayBlobs(relayMetricsUrl)) === 0, "the relay to hold no blob", 20_000, 100);
}

describe("fault matrix", () => {
  it("prefill killed while pushing KV: 502 naming the prefill worker; the decode's wait ends; nothing left", async () => {
    // Nothing restarts the prefill worker here: the gateway is told not to wait for it to come
    // back (AIRM_WORKER_WAIT_S=0; waiting for a restarted worker is the fault soak's and
    // gateway-drain's business), so the error comes at once.
    const pd = await cluster({ model: slowModel, maxModelLen: SLOW_S, gatewayEnv: { AIRM_WORKER_WAIT_S: "0", AIRM_HEALTH_INTERVAL_MS: "500" } });
    clusters.push(pd);
    const id = await modelId(pd);
    const keys = join(pd.clusterDir!, "keys");
    const answer = postJson(`${pd.url}/v1/completions`, longBody(id));
    // the first layer's K and V land in keys/<request> while prefill still computes the others
    await until(() => existsSync(keys) && readdirSync(keys).length > 0, "prefill to start pushing", 30_000, 2);
    const prefill = pd.part("prefill");
    prefill.child.kill("SIGKILL");
    const t0 = Date.now();
    const r = await answer;
    expect(Date.now() - t0).toBeLessThan(20_000); // bounded (not the 120 s prefill timeout)
    expect(r.status).toBe(502);
    expect(r.body.error.code).toBe("prefill_unreachable");
    expect(r.body.error.message).toContain(prefill.url);
    await expectNoLeaks(pd);
  });

  it("the only prefill worker killed and restarted by the launcher: requests sent meanwhile wait for it (AIRM_WORKER_WAIT_S) and are answered, the same as before", async () => {
    const pd = await cluster({ model: slowModel, maxModelLen: SLOW_S, onPartExit: "restart" });
    clusters.push(pd);
    const id = await modelId(pd);
    const body = { model: id, prompt: "A restart should cost nothing but time:", max_tokens: 8, temperature: 0 };
    const before = await postJson(`${pd.url}/v1/completions`, body);
    expect(before.status).toBe(200);
    const prefill = pd.part("prefill");
    prefill.child.kill("SIGKILL");
    await prefill.exited;
    const during = await Promise.all([0, 1, 2].map(() => postJson(`${pd.url}/v1/completions`, body)));
    for (const r of during) {
      expect(r.status, JSON.stringify(r.body)).toBe(200);
      expect(r.body.choices[0].text).toBe(before.body.choices[0].text);
    }
    await expectNoLeaks(pd);
  });

  it("decode killed mid-stream with two decode workers and migration off (AIRM_MIGRATION_LIMIT=0): only its request fails (a stream error naming it), the other finishes", async () => {
    // With migration on (the default) the broken stream moves instead: test/e2e/migration.test.ts.
    const pd = await cluster({ model: slowModel, maxModelLen: SLOW_S, decode: [{}, {}], gatewayEnv: { AIRM_MIGRATION_LIMIT: "0", AIRM_HEALTH_INTERVAL_MS: "500" } });
    clusters.push(pd);
    const id = await modelId(pd);
    const stream = async () => {
      const r = await fetch(`${pd.url}/v1/completions`, {
        method: "POST",
        headers: { "content-type": "application/json" },
        body: JSON.stringify({ ...longBody(id, 16, SLOW_S - 32), stream: true }),
      });
      return (await r.text()).split("\n").filter((l) => l.startsWith("data: {"));
    };
    const a = stream();
    const b = stream();
    const running = async (url: string) => (await health(url)).requests.running as number;
    await until(async () => (await running(pd.part("decode").url)) === 1 && (await running(pd.part("decode-2").url)) === 1, "both decode workers to stream", 30_000);
    const victim = pd.part("decode-2");
    victim.child.kill("SIGKILL");
    const [ra, rb] = await Promise.all([a, b]);
    const last = (lines: string[]) => JSON.parse(lines.at(-1)!.slice(6));
    const [broken, whole] = last(ra).error ? [ra, rb] : [rb, ra];
    expect(last(broken).error).toMatchObject({ code: "worker_stream_broken" });
    expect(last(broken).error.message).toContain(victim.url);
    expect(last(whole).error).toBeUndefined();
    expect(["length", "stop"]).toContain(last(whole).choices[0].finish_reason);
    // the next requests go to the live decode worker
    const next = await postJson(`${pd.url}/v1/completions`, longBody(id, 16, 4));
    expect(next.status).toBe(200);
    await expectNoLeaks(pd);
  });

  it("relay killed during a transfer and restarted by the launcher (tcp): the request in flight fails with a 5xx (or, when its KV got through, gives the same text as a clean run), the next ones succeed", async () => {
    const relay0 = await relayMetrics();
    const pd = await cluster({ model: slowModel, maxModelLen: SLOW_S, kvTransport: "tcp", onPartExit: "restart", restart: { firstDelayMs: 200 }, sidecarEnv: relay0.sidecarEnv });
    clusters.push(pd);
    const id = await modelId(pd);
    const answer = postJson(`${pd.url}/v1/completions`, longBody(id));
    await until(async () => (await health(pd.part("prefill").url)).requests.running === 1, "prefill to run", 30_000, 5);
    const relay = pd.part("kv-relay");
    relay.child.kill("SIGKILL");
    const r = await answer;
    await until(() => pd.part("kv-relay").alive && pd.part("kv-relay") !== relay, "the launcher to restart the relay", 10_000);
    if (r.status === 200) {
      // The kill landed after the blobs this request needed had crossed (its pushes and pulls are
      // CRC-checked): then its text must be exactly that of the same request on the healed cluster.
      let clean = await postJson(`${pd.url}/v1/completions`, longBody(id));
      for (let i = 0; i < 50 && clean.status !== 200; i++) {
        await sleep(200);
        clean = await postJson(`${pd.url}/v1/completions`, longBody(id));
      }
      expect(clean.status).toBe(200);
      expect(r.body.choices[0].text).toBe(clean.body.choices[0].text);
    } else {
      expect(r.status).toBeGreaterThanOrEqual(500);
      expect(r.body.error.message).toMatch(/relay|KV|kv/);
    }
    // the workers reconnect to the restarted relay on their own
    let ok = 0;
    const end = Date.now() + 30_000;
    while (ok < 2 && Date.now() < end) {
      const again = await postJson(`${pd.url}/v1/completions`, longBody(id, 16, 4));
      if (again.status === 200) ok++;
      else await sleep(200);
    }
    expect(ok).toBe(2);
    await expectNoLeaks(pd, null, relay0.url);
  });

  it("one byte flipped on the wire between the relay and decode (tcp): 502 kv_integrity_error on the CRC, nothing left", async () => {
    // the decode worker reaches the relay through a proxy that flips one payload byte
    const relayPort = await freePort();
    const proxy = await startFlipProxy({ host: "127.0.0.1", port: relayPort }, "down", 40_000);
    cleanups.push(() => proxy.close());
    const metrics = await relayMetrics();
    const pd = await cluster({
      model: slowModel,
      maxModelLen: SLOW_S,
      kvTransport: "tcp",
      sidecarPort: relayPort,
      sidecarEnv: metrics.sidecarEnv,
      decode: [{ env: { AIRM_KV_TCP_ADDR: proxy.address } }],
    });
    clusters.push(pd);
    const r = await postJson(`${pd.url}/v1/completions`, longBody(await modelId(pd), 64, 4));
    expect(r.status, JSON.stringify(r.body)).toBe(502);
    expect(r.body.error.code).toBe("kv_integrity_error");
    expect(r.body.error.param).toMatch(/^crc/);
    await expectNoLeaks(pd, null, metrics.url);
  });

  it("a prompt that waits and computes longer than the KV timeout is still served (the decode's wait covers the prefill's bound)", async () => {
    // the gateway's KV slack is 300 ms; this prefill alone takes longer, and a second one queues behind it
    const pd = await cluster({ model: slowModel, maxModelLen: SLOW_S, gatewayEnv: { AIRM_KV_TIMEOUT_MS: "300" } });
    clusters.push(pd);
    const id = await modelId(pd);
    const t0 = Date.now();
    const [a, b] = await Promise.all([postJson(`${pd.url}/v1/completions`, longBody(id, 400, 2)), postJson(`${pd.url}/v1/completions`, longBody(id, 399, 2))]);
    expect(Date.now() - t0).toBeGreaterThan(300);
    expect([a.status, b.status], JSON.stringify([a.body, b.body])).toEqual([200, 200]);
    await expectNoLeaks(pd);
  });

  it("a request past its deadline: 504 request_timeout, and its slots, leases and blobs are released", async () => {
    const pd = await cluster({ model: slowModel, maxModelLen: SLOW_S });
    clusters.push(pd);
    const id = await modelId(pd);
    // a long prompt: the deadline passes while prefill computes and pushes
    const r = await postJson(`${pd.url}/v1/completions`, { ...longBody(id, 400, 64), timeout: 0.2 });
    expect(r.status, JSON.stringify(r.body)).toBe(504);
    expect(r.body.error.code).toBe("request_timeout");
    await until(async () => (await health(pd.part("decode").url)).requests.running === 0, "decode to drop it", 30_000);
    await expectNoLeaks(pd);
    // the prefill worker was told why (the decode worker saw its caller leave first)
    const m = await (await fetch(`${pd.part("prefill").url}/metrics`)).text();
    expect(m).toMatch(/^airm_kv_leases_released_total\{[^}]*reason="deadline"[^}]*\} 1$/m);
  });
});

describe("fault matrix: a full /dev/shm", () => {
  const mountOk = process.platform === "linux" && process.getuid?.() === 0;
  it.skipIf(!mountOk)("KV that does not fit the shm root (a 1 MiB tmpfs): a clear 5xx within the KV timeout, nothing left in it", async () => {
    const root = mkdtempSync(join("/dev/shm", "airm-full-"));
    const m = spawnSync("mount", ["-t", "tmpfs", "-o", "size=1m", "tmpfs", root], { encoding: "utf8" });
    expect(m.status, m.stderr).toBe(0);
    cleanups.push(() => {
      spawnSync("umount", [root]);
      rmSync(root, { recursive: true, force: true });
    });
    const env = { PD_SHM_ROOT: root, AIRM_KV_TIMEOUT_MS: "1500" };
    const pd = await cluster({ model: slowModel, maxModelLen: SLOW_S, prefill: [{ env }], decode: [{ env }] });
    clusters.push(pd);
    const t0 = Date.now();
    const r = await postJson(`${pd.url}/v1/completions`, longBody(await modelId(pd)));
    expect(Date.now() - t0).toBeLessThan(30_000);
    expect(r.status).toBeGreaterThanOrEqual(500);
    expect(r.body.error.code).toBe("kv_transport_error");
    expect(r.body.error.message).toMatch(/space|full|ENOSPC/i);
    await expectNoLeaks(pd, root);
  });
});

describe("fault matrix: a worker started by hand", () => {
  it("stopped with SIGTERM, leaves nothing under its PD_SHM_ROOT", async () => {
    const model = tinyModel();
    const shmRoot = `/dev/shm/airm-hand-${process.pid}`;
    cleanups.push(() => {
      rmSync(shmRoot, { recursive: true, force: true });
      rmSync(model, { recursive: true, force: true });
    });
    const token = newInternalToken();
    const worker = spawn(
      process.execPath,
      [binPath("@airm/worker", "airm-worker"), "--role", "prefill", "--backend", "rngd-full", "--port", "0", "--model", model, "--max-model-len", "64"],
      { env: { ...process.env, PD_SHM_ROOT: shmRoot, AIRM_INTERNAL_TOKEN: token, AIRM_ENGINE_LOG: "0" }, stdio: ["ignore", "ignore", "pipe"] },
    );
    cleanups.push(() => worker.kill("SIGKILL"));
    let log = "";
    worker.stderr!.on("data", (d) => (log += d));
    await until(() => /"url":"(http:[^"]+)"/.test(log), "the worker to be ready", 60_000, 50);
    const url = /"url":"(http:[^"]+)"/.exec(log)![1];
    const client = new WorkerClient(url, "prefill worker", { token });
    await client.prefill({ requestId: "cmpl-by-hand-1", input: { prompt: "hello" }, maxTokens: 2 });
    expect(readdirSync(shmRoot).length).toBeGreaterThan(0);
    await client.release({ requestId: "cmpl-by-hand-1", reason: "done" });
    worker.kill("SIGTERM");
    await new Promise((r) => worker.once("exit", r));
    expect(readdirSync(shmRoot)).toEqual([]);
  });
});
