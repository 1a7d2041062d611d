// Worker faults give a 5xx within bounded time and leave no KV behind: decode killed mid-request,
// prefill unreachable, a manifest from another model (kv_integrity_error), a client that
// disconnects mid-stream, and a lease that reaches its TTL.
import { afterAll, afterEach, beforeAll, describe, expect, it } from "vitest";
import { closeSync, openSync, readSync, readlinkSync, rmSync, writeSync } from "node:fs";
import { join } from "node:path";
import {
  GATEWAY_BIN,
  freePort,
  leftoverBlobs,
  makeTinyModel,
  postJson,
  settledLeftovers,
  spawnService,
  startCluster,
  startWorkerProc,
  waitHealthy,
  type Cluster,
  type Service,
} from "./cluster-harness.ts";

const S = 256;
let model: string;
let otherModel: string;
/** Big enough that a long decode takes a while on the CPU path, so a fault lands mid-stream. */
let slowModel: string;
const SLOW_S = 512;
const clusters: Cluster[] = [];
const extra: Service[] = [];

beforeAll(() => {
  model = makeTinyModel(["--arch", "llama"]);
  otherModel = makeTinyModel(["--arch", "llama", "--seed", "7"]);
  slowModel = makeTinyModel(["--arch", "llama", "--layers", "8", "--hidden", "512", "--heads", "8", "--kv-heads", "2", "--intermediate", "1536"]);
});
afterEach(async () => {
  await Promise.all(extra.splice(0).map((s) => s.stop()));
  await Promise.all(clusters.splice(0).map((c) => c.stop()));
});
afterAll(() => {
  for (const m of [model, otherModel, slowModel]) if (m) rmSync(m, { recursive: true, force: true });
});

async function modelId(c: Cluster): Promise<string> {
  return ((await (await fetch(`${c.url}/v1/models`)).json()) as any).data[0].id;
}

async function health(url: string): Promise<any> {
  return (await fetch(`${url}/health`)).json();
}

async function until(cond: () => Promise<boolean>, what: string, limitMs = 60_000): Promise<void> {
  const end = Date.now() + limitMs;
  while (Date.now() < end) {
    if (await cond()) return;
    await new Promise((r) => setTimeout(r, 20));
  }
  throw new Error(`timed out waiting for ${what}`);
}

// A long generation: a token-id prompt and the rest of the context, so decode runs for a while.
const longBody = (id: string) => ({ model: id, prompt: Array.from({ length: 8 }, (_, i) => 10 + i), max_tokens: SLOW_S - 16, temperature: 0 });

describe("PD faults", () => {
  it("killing the decode worker mid-request gives a 5xx and leaves no KV blob under the shm root", async () => {
    const pd = await startCluster({ mode: "pd", model: slowModel, seqLen: SLOW_S });
    clusters.push(pd);
    const id = await modelId(pd);
    const pending = postJson(`${pd.url}/v1/completions`, longBody(id));
    await until(async () => (await health(pd.services.decode.url)).requests.running === 1, "decode to be running");
    pd.services.decode.proc.kill("SIGKILL");
    const r = await pending;
    expect(r.status).toBeGreaterThanOrEqual(500);
    expect(r.body.error.message).toMatch(/decode worker/);
    expect(await settledLeftovers(pd.shmRoot!)).toEqual([]);
    // the prefill worker's lease ended by the gateway's release, not by expiry
    const h = await health(pd.services.prefill.url);
    expect(h.leases).toEqual({ outstanding: 0, expired: 0 });
    // and the gateway answers the next request with a clear 5xx, not a hang
    const next = await postJson(`${pd.url}/v1/completions`, { model: id, prompt: "hi", max_tokens: 2 });
    expect(next.status).toBeGreaterThanOrEqual(500);
  });

  it("an unreachable prefill worker gives a 5xx naming it", async () => {
    const pd = await startCluster({ mode: "pd", model, seqLen: S, gatewayEnv: { AIRM_HEALTH_INTERVAL_MS: "60000" } });
    clusters.push(pd);
    const id = await modelId(pd);
    await pd.services.prefill.stop("SIGKILL");
    const r = await postJson(`${pd.url}/v1/completions`, { model: id, prompt: "hello", max_tokens: 4 });
    expect(r.status).toBe(502);
    expect(r.body.error.code).toBe("prefill_unreachable");
    expect(r.body.error.message).toContain(pd.services.prefill.url);
    // now marked down: the next request is refused at once with 503
    const r2 = await postJson(`${pd.url}/v1/completions`, { model: id, prompt: "hello", max_tokens: 4 });
    expect(r2.status).toBe(503);
    expect(r2.body.error.code).toBe("no_healthy_worker");
    // decode released its lease (the gateway told it the prefill failed)
    await until(async () => (await health(pd.services.decode.url)).leases.outstanding === 0, "decode lease to end");
  });

  it("KV from a different model is refused with kv_integrity_error naming the field, through the gateway too", async () => {
    const pd = await startCluster({ mode: "pd", model, seqLen: S });
    clusters.push(pd);
    // a second decode worker on another model, sharing the shm root
    const other = await startWorkerProc("decode", "atom", otherModel, { PD_SHM_ROOT: pd.shmRoot!, AIRM_KV_TRANSPORT: "shm" }, S);
    extra.push(other);
    const rid = "cmpl-integrity-1";
    const decode = fetch(`${other.url}/internal/decode`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({ request_id: rid, max_tokens: 4 }),
    });
    const p = await postJson(`${pd.services.prefill.url}/internal/prefill`, { request_id: rid, prompt: "hello", max_tokens: 4 });
    expect(p.status).toBe(200);
    const lines = (await (await decode).text()).trim().split("\n").map((l) => JSON.parse(l));
    expect(lines.at(-1)).toMatchObject({ type: "error", status: 502, code: "kv_integrity_error", param: "modelFingerprint" });
    await postJson(`${pd.services.prefill.url}/internal/release`, { request_id: rid, reason: "decode_rejected" });
    expect(await settledLeftovers(pd.shmRoot!)).toEqual([]);

    // the same mismatch through a gateway: a 502 with the OpenAI error body
    const port = await freePort();
    const gw = spawnService("gateway", GATEWAY_BIN, ["--port", String(port), "--prefill", pd.services.prefill.url, "--decode", other.url], process.env, `http://127.0.0.1:${port}`);
    extra.push(gw);
    await waitHealthy(gw);
    const gwModel = ((await (await fetch(`${gw.url}/v1/models`)).json()) as any).data[0].id;
    const r = await postJson(`${gw.url}/v1/completions`, { model: gwModel, prompt: "hello", max_tokens: 4 });
    expect(r.status).toBe(502);
    expect(r.body.error).toMatchObject({ code: "kv_integrity_error", param: "modelFingerprint", type: "server_error" });
    expect(await settledLeftovers(pd.shmRoot!)).toEqual([]);
  });

  it("a blob corrupted in the transport fails its CRC-32 check (kv_integrity_error, field crc)", async () => {
    const pd = await startCluster({ mode: "pd", model, seqLen: S });
    clusters.push(pd);
    const rid = "cmpl-corrupt-1";
    const p = await postJson(`${pd.services.prefill.url}/internal/prefill`, { request_id: rid, prompt: "flip a byte", max_tokens: 4 });
    expect(p.status).toBe(200);
    // flip one byte of layer 1's V inside its slab file, where the transport's link points
    const [slab, offset] = readlinkSync(join(pd.shmRoot!, "keys", rid, "1+v")).split(":");
    const fd = openSync(join(pd.shmRoot!, slab), "r+");
    const b = Buffer.alloc(1);
    readSync(fd, b, 0, 1, Number(offset) + 5);
    b[0] ^= 0xff;
    writeSync(fd, b, 0, 1, Number(offset) + 5);
    closeSync(fd);
    const d = await fetch(`${pd.services.decode.url}/internal/decode`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({ request_id: rid, max_tokens: 4 }),
    });
    const lines = (await d.text()).trim().split("\n").map((l) => JSON.parse(l));
    expect(lines).toHaveLength(1);
    expect(lines[0]).toMatchObject({ type: "error", status: 502, code: "kv_integrity_error", param: "crc" });
    expect(lines[0].message).toContain(`${rid}/1/v`);
    await postJson(`${pd.services.prefill.url}/internal/release`, { request_id: rid, reason: "decode_rejected" });
    expect(await settledLeftovers(pd.shmRoot!)).toEqual([]);
  });

  it("a client that disconnects mid-stream stops decode and frees its KV", async () => {
    const pd = await startCluster({ mode: "pd", model: slowModel, seqLen: SLOW_S });
    clusters.push(pd);
    const id = await modelId(pd);
    const ac = new AbortController();
    const r = await fetch(`${pd.url}/v1/completions`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({ ...longBody(id), stream: true }),
      signal: ac.signal,
    });
    const reader = r.body!.getReader();
    await reader.read();
    await until(async () => (await health(pd.services.decode.url)).requests.running === 1, "decode to be running");
    ac.abort();
    await until(async () => {
      const h = await health(pd.services.decode.url);
      return h.requests.running === 0 && h.leases.outstanding === 0;
    }, "decode to stop");
    expect(await settledLeftovers(pd.shmRoot!)).toEqual([]);
    const m = await (await fetch(`${pd.services.decode.url}/metrics`)).text();
    expect(m).toMatch(/^airm_kv_leases_released_total\{[^}]*reason="client_gone"[^}]*\} 1$/m);
  });

  it("a lease whose decode never comes expires after its TTL and its blobs are released", async () => {
    const pd = await startCluster({ mode: "pd", model, seqLen: S, env: { AIRM_KV_LEASE_TTL_S: "1" } });
    clusters.push(pd);
    const p = await postJson(`${pd.services.prefill.url}/internal/prefill`, { request_id: "cmpl-orphan-1", prompt: "nobody decodes this", max_tokens: 4 });
    expect(p.status).toBe(200);
    expect(leftoverBlobs(pd.shmRoot!).length).toBeGreaterThan(0);
    await until(async () => (await health(pd.services.prefill.url)).leases.expired === 1, "the lease to expire");
    expect(await settledLeftovers(pd.shmRoot!)).toEqual([]);
    const m = await (await fetch(`${pd.services.prefill.url}/metrics`)).text();
    expect(m).toMatch(/^airm_kv_leases_expired_total\{[^}]*\} 1$/m);
  });
});
