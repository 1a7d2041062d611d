// Worker faults give a 5xx within bounded time and leave no KV behind: decode killed mid-request,
// prefill unreachable, a manifest from another model (kv_integrity_error), a client that
// disconnects mid-stream, and a lease that reaches its TTL.
import { afterAll, afterEach, beforeAll, describe, expect, it } from "vitest";
import { closeSync, openSync, readSync, readlinkSync, rmSync, writeSync } from "node:fs";
import { join } from "node:path";
import { WorkerClient } from "@airm/internal-api";
import { INTERNAL_TOKEN_HEADER } from "@airm/rm-core";
import type { RunningCluster } from "../../src/index.ts";
import { cluster, health, leftoverBlobs, modelId, postJson, settledLeftovers, tinyModel, until, SLOW_MODEL } from "../helpers/cluster.ts";

const S = 256;
let model: string;
let otherModel: string;
/** Big enough that a long decode takes a while on the CPU path, so a fault lands mid-stream. */
let slowModel: string;
const SLOW_S = 512;
const clusters: RunningCluster[] = [];

beforeAll(() => {
  model = tinyModel();
  otherModel = tinyModel({ arch: "llama", seed: 7 });
  slowModel = tinyModel(SLOW_MODEL);
});
afterEach(async () => {
  await Promise.all(clusters.splice(0).map((c) => c.stop()));
});
afterAll(() => {
  for (const m of [model, otherModel, slowModel]) if (m) rmSync(m, { recursive: true, force: true });
});

/** The header a direct call of a worker's /internal/* route needs (the cluster's internal token). */
const internal = (c: RunningCluster) => ({ [INTERNAL_TOKEN_HEADER]: c.internalToken });

// A long generation: a token-id prompt and the rest of the context, so decode runs for a while.
const longBody = (id: string) => ({ model: id, prompt: Array.from({ length: 8 }, (_, i) => 10 + i), max_tokens: SLOW_S - 16, temperature: 0 });

describe("PD faults", () => {
  it("killing the decode worker mid-request gives a 5xx and leaves no KV blob under the shm root", async () => {
    const pd = await cluster({ model: slowModel, maxModelLen: SLOW_S });
    clusters.push(pd);
    const id = await modelId(pd);
    const pending = postJson(`${pd.url}/v1/completions`, longBody(id));
    await until(async () => (await health(pd.part("decode").url)).requests.running === 1, "decode to be running");
    pd.part("decode").child.kill("SIGKILL");
    const r = await pending;
    expect(r.status).toBeGreaterThanOrEqual(500);
    expect(r.body.error.message).toMatch(/decode worker/);
    expect(await settledLeftovers(pd.clusterDir!)).toEqual([]);
    // the prefill worker's lease ended by the gateway's release (sent as the client got its
    // answer, so it may land a moment later), not by expiry
    await until(async () => (await health(pd.part("prefill").url)).leases.outstanding === 0, "the prefill lease to be released");
    expect((await health(pd.part("prefill").url)).leases).toEqual({ outstanding: 0, expired: 0 });
    // and the gateway answers the next request with a clear 5xx, not a hang
    const next = await postJson(`${pd.url}/v1/completions`, { model: id, prompt: "hi", max_tokens: 2 });
    expect(next.status).toBeGreaterThanOrEqual(500);
  });

  it("an unreachable prefill worker gives a 5xx naming it", async () => {
    const pd = await cluster({ model, maxModelLen: S, gatewayEnv: { AIRM_HEALTH_INTERVAL_MS: "60000" } });
    clusters.push(pd);
    const id = await modelId(pd);
    await pd.part("prefill").stop("SIGKILL");
    const r = await postJson(`${pd.url}/v1/completions`, { model: id, prompt: "hello", max_tokens: 4 });
    expect(r.status).toBe(502);
    expect(r.body.error.code).toBe("prefill_unreachable");
    expect(r.body.error.message).toContain(pd.part("prefill").url);
    // now marked down: the next request is refused at once with 503
    const r2 = await postJson(`${pd.url}/v1/completions`, { model: id, prompt: "hello", max_tokens: 4 });
    expect(r2.status).toBe(503);
    expect(r2.body.error.code).toBe("no_healthy_worker");
    // decode released its lease (the gateway told it the prefill failed)
    await until(async () => (await health(pd.part("decode").url)).leases.outstanding === 0, "decode lease to end");
  });

  it("KV from a different model is refused with kv_integrity_error naming the field, through the gateway too", async () => {
    // prefill on one model, decode on another (same layout and shapes, other weights), one shm root
    const pd = await cluster({ model, maxModelLen: S, decode: [{ backend: "atom", model: otherModel }] });
    clusters.push(pd);
    const rid = "cmpl-integrity-1";
    const decode = new WorkerClient(pd.part("decode").url, undefined, { token: pd.internalToken }).decode({ requestId: rid, maxTokens: 4 });
    const p = await postJson(`${pd.part("prefill").url}/internal/prefill`, { requestId: rid, input: { prompt: "hello" }, maxTokens: 4 }, internal(pd));
    expect(p.status).toBe(200);
    const lines = (await (await decode).text())
      .trim()
      .split("\n")
      .map((l) => JSON.parse(l));
    expect(lines.at(-1)).toMatchObject({ type: "error", status: 502, code: "kv_integrity_error", param: "modelFingerprint" });
    await postJson(`${pd.part("prefill").url}/internal/release`, { requestId: rid, reason: "decode_rejected" }, internal(pd));
    expect(await settledLeftovers(pd.clusterDir!)).toEqual([]);

    // the same mismatch through the gateway: a 502 with the OpenAI error body
    const gwModel = ((await (await fetch(`${pd.url}/v1/models`)).json()) as any).data[0].id;
    const r = await postJson(`${pd.url}/v1/completions`, { model: gwModel, prompt: "hello", max_tokens: 4 });
    expect(r.status).toBe(502);
    expect(r.body.error).toMatchObject({ code: "kv_integrity_error", param: "modelFingerprint", type: "server_error" });
    expect(await settledLeftovers(pd.clusterDir!)).toEqual([]);
  });

  it("a blob corrupted in the transport fails its CRC-32 check (kv_integrity_error, field crc)", async () => {
    const pd = await cluster({ model, maxModelLen: S });
    clusters.push(pd);
    const rid = "cmpl-corrupt-1";
    const p = await postJson(`${pd.part("prefill").url}/internal/prefill`, { requestId: rid, input: { prompt: "flip a byte" }, maxTokens: 4 }, internal(pd));
    expect(p.status).toBe(200);
    // flip one byte of layer 1's V inside its slab file, where the transport's link points
    const [slab, offset] = readlinkSync(join(pd.clusterDir!, "keys", rid, "1+v")).split(":");
    const fd = openSync(join(pd.clusterDir!, slab), "r+");
    const b = Buffer.alloc(1);
    readSync(fd, b, 0, 1, Number(offset) + 5);
    b[0] ^= 0xff;
    writeSync(fd, b, 0, 1, Number(offset) + 5);
    closeSync(fd);
    const d = await fetch(`${pd.part("decode").url}/internal/decode`, {
      method: "POST",
      headers: { "content-type": "application/json", ...internal(pd) },
      body: JSON.stringify({ requestId: rid, maxTokens: 4 }),
    });
    const lines = (await d.text())
      .trim()
      .split("\n")
      .map((l) => JSON.parse(l));
    expect(lines).toHaveLength(1);
    expect(lines[0]).toMatchObject({ type: "error", status: 502, code: "kv_integrity_error", param: "crc" });
    expect(lines[0].message).toContain(`${rid}/1/v`);
    await postJson(`${pd.part("prefill").url}/internal/release`, { requestId: rid, reason: "decode_rejected" }, internal(pd));
    expect(await settledLeftovers(pd.clusterDir!)).toEqual([]);
  });

  it("a client that disconnects mid-stream stops decode and frees its KV", async () => {
    const pd = await cluster({ model: slowModel, maxModelLen: SLOW_S });
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
    await until(async () => (await health(pd.part("decode").url)).requests.running === 1, "decode to be running");
    ac.abort();
    await until(async () => {
      const h = await health(pd.part("decode").url);
      return h.requests.running === 0 && h.leases.outstanding === 0;
    }, "decode to stop");
    expect(await settledLeftovers(pd.clusterDir!)).toEqual([]);
    const m = await (await fetch(`${pd.part("decode").url}/metrics`)).text();
    expect(m).toMatch(/^airm_kv_leases_released_total\{[^}]*reason="client_gone"[^}]*\} 1$/m);
  });

  it("a lease whose decode never comes expires after its TTL and its blobs are released", async () => {
    const pd = await cluster({ model, maxModelLen: S, env: { AIRM_KV_LEASE_TTL_S: "1" } });
    clusters.push(pd);
    const p = await postJson(`${pd.part("prefill").url}/internal/prefill`, { requestId: "cmpl-orphan-1", input: { prompt: "nobody decodes this" }, maxTokens: 4 }, internal(pd));
    expect(p.status).toBe(200);
    expect(leftoverBlobs(pd.clusterDir!).length).toBeGreaterThan(0);
    await until(async () => (await health(pd.part("prefill").url)).leases.expired === 1, "the lease to expire");
    expect(await settledLeftovers(pd.clusterDir!)).toEqual([]);
    const m = await (await fetch(`${pd.part("prefill").url}/metrics`)).text();
    expect(m).toMatch(/^airm_kv_leases_expired_total\{[^}]*\} 1$/m);
  });
});
