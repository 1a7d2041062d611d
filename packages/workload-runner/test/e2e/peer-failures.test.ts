// The PD failures that users of peer projects (vLLM, SGLang) keep reporting, one named test each,
// through a real cluster (gateway, prefill and decode worker processes, KV over /dev/shm). Each
// checks what the client sees (a whole answer equal to an undisturbed run, or an OpenAI error
// body whose code names the cause; never wrong tokens, never a hang) and that nothing is left
// after it: no open lease and no used KV block on a live worker, no KV link under the shm root,
// no slab of a dead process. docs/reliability.md maps each test to the peer's issue.
import { closeSync, existsSync, openSync, readdirSync, readlinkSync, readSync, renameSync, rmSync, symlinkSync, writeSync } from "node:fs";
import { join } from "node:path";
import { INTERNAL_TOKEN_HEADER } from "@airm/rm-core";
import { afterAll, afterEach, beforeAll, describe, expect, it } from "vitest";
import { sseEvents, type RunningCluster } from "../../src/index.ts";
import { cluster, expectNothingLeft, health, modelId, postJson, tinyModel, until, SLOW_MODEL } from "../helpers/cluster.ts";

const S = 512;
/** The generated tiny model (2 layers): fast, for the bursts of 128 requests. */
let tiny: string;
/** Big enough that a prefill of a few hundred tokens takes a while on the CPU path, so a fault lands during it. */
let slow: string;
const clusters: RunningCluster[] = [];
const cleanups: (() => unknown)[] = [];

beforeAll(() => {
  tiny = tinyModel();
  slow = tinyModel(SLOW_MODEL);
});
afterEach(async () => {
  while (cleanups.length) await cleanups.pop()!();
  await Promise.all(clusters.splice(0).map((c) => c.stop()));
});
afterAll(() => {
  for (const m of [tiny, slow]) if (m) rmSync(m, { recursive: true, force: true });
});

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

/** A cluster stopped after the test. */
async function started(o: Parameters<typeof cluster>[0]): Promise<RunningCluster> {
  const c = await cluster(o);
  clusters.push(c);
  return c;
}

/** A greedy completion of `len` prompt token ids (varied by `seed`), its token ids returned (logprobs with token ids). */
function body(model: string, seed: number, len: number, maxTokens = 8) {
  return {
    model,
    prompt: Array.from({ length: len }, (_, j) => 5 + ((seed * 37 + j * 11) % 300)),
    max_tokens: maxTokens,
    ignore_eos: true,
    temperature: 0,
    logprobs: 0,
    return_tokens_as_token_ids: true,
  };
}

/** What a client got: the token ids of a 200, else the status and error code. */
function answerOf(r: { status: number; body: any }): string {
  return r.status === 200 ? r.body.choices[0].logprobs.tokens.join(",") : `${r.status} ${r.body?.error?.code}`;
}

const complete = (c: RunningCluster, b: unknown) => postJson(`${c.url}/v1/completions`, b);

/** The answers of `bodies` sent `width` at a time (no request waits for a slot), each checked to be whole. */
async function calmRun(c: RunningCluster, bodies: unknown[], width: number): Promise<string[]> {
  const out: string[] = [];
  for (let i = 0; i < bodies.length; i += width) out.push(...(await Promise.all(bodies.slice(i, i + width).map((b) => complete(c, b)))).map(answerOf));
  expect(out.filter((t) => !t.startsWith("token_id"))).toEqual([]);
  return out;
}

/** The header a direct call of a worker's /internal/* route needs. */
const internal = (c: RunningCluster) => ({ [INTERNAL_TOKEN_HEADER]: c.internalToken });

/** A worker's Prometheus text. */
async function metricsOf(url: string): Promise<string> {
  return (await fetch(`${url}/metrics`)).text();
}

/** The value of a worker's airm_kv_leases_released_total for `reason` (0 when never counted). */
async function leasesEnded(url: string, reason: string): Promise<number> {
  const m = new RegExp(`^airm_kv_leases_released_total\\{[^}]*reason="${reason}"[^}]*\\} (\\d+)$`, "m").exec(await metricsOf(url));
  return Number(m?.[1] ?? 0);
}

// A decode worker stalled (SIGSTOP) while its request's KV lands, so that a test can break the KV
// after prefill published it and before decode reads it.

/**
 * Sends a request (`send`) with the decode worker stalled: once the worker holds no lease of an
 * earlier request, sends it, and stops the worker (SIGSTOP) as soon as it holds `leases` leases
 * (each request's decode waits for its KV from then on), before any new KV is published whole.
 * `resume()` continues it (also done after the test); `earlier` are the requests published before.
 */
async function stalled<T>(c: RunningCluster, send: () => Promise<T>, leases = 1): Promise<{ pending: Promise<T>; resume: () => void; earlier: string[] }> {
  const decode = c.part("decode");
  const outstanding = async () => (await health(decode.url)).leases.outstanding as number;
  await until(async () => (await outstanding()) === 0, "the decode worker to end its earlier leases", 10_000, 5);
  const earlier = publishedIds(c.clusterDir!);
  const pending = send();
  await until(async () => (await outstanding()) >= leases, "the decode worker to wait for the KV", 30_000, 2);
  decode.child.kill("SIGSTOP");
  const resume = () => void decode.child.kill("SIGCONT");
  cleanups.push(resume);
  if (leases === 1 && publishedIds(c.clusterDir!, earlier).length)
    throw new Error("the KV was published before the decode worker stopped: a fault cannot be placed before its pull");
  return { pending, resume, earlier };
}

/** The request folders under the shm root's keys/ whose manifest is published, other than `but`. */
function publishedIds(root: string, but: string[] = []): string[] {
  const keys = join(root, "keys");
  if (!existsSync(keys)) return [];
  // (a link names "slab:offset:length", not a path: look for it by name)
  const linked = (rid: string) => {
    try {
      return readdirSync(join(keys, rid)).includes("manifest");
    } catch {
      return false;
    }
  };
  return readdirSync(keys).filter((rid) => !but.includes(rid) && linked(rid));
}

/** Waits for one request's KV to be published whole (its manifest is the last push) and returns its id. */
async function published(root: string, but: string[] = []): Promise<string> {
  await until(() => publishedIds(root, but).length === 1, "a request's KV to be published", 30_000, 5);
  return publishedIds(root, but)[0];
}

/** The link of one blob: keys/<request>/<layer>+<k|v>, or keys/<request>/manifest. */
const linkOf = (root: string, rid: string, name: string) => join(root, "keys", rid, name);

/** Flips one byte of a published blob inside its slab file (where the link points). */
function flipByte(root: string, rid: string, name: string, at = 5): void {
  const [slab, offset] = readlinkSync(linkOf(root, rid, name)).split(":");
  const fd = openSync(join(root, slab), "r+");
  const b = Buffer.alloc(1);
  readSync(fd, b, 0, 1, Number(offset) + at);
  b[0] ^= 0xff;
  writeSync(fd, b, 0, 1, Number(offset) + at);
  closeSync(fd);
}

/** Points a blob's link at `target` (atomically, as the transport publishes). */
function pointAt(root: string, rid: string, name: string, target: string): void {
  const link = linkOf(root, rid, name);
  symlinkSync(target, `${link}.swap`);
  renameSync(`${link}.swap`, link);
}

describe("PD failures reported against peer projects", () => {
  it("vLLM #52234: a KV receive that gets bad bytes is a 502 kv_integrity_error and one that fails gets the whole answer, never 200 with wrong tokens or the previous prompt's answer", async () => {
    const pd = await started({ model: slow, maxModelLen: S, gatewayEnv: { AIRM_HEALTH_INTERVAL_MS: "60000" } });
    const id = await modelId(pd);
    const root = pd.clusterDir!;
    const last = `${(await health(pd.part("decode").url)).model.layers - 1}+v`;
    const [a, b, c] = [body(id, 1, 256), body(id, 2, 256), body(id, 3, 256)];
    const previous = answerOf(await complete(pd, a));

    // bad bytes: one byte of the last layer's V flipped after prefill published it, before decode read it
    const { pending, resume, earlier } = await stalled(pd, () => complete(pd, b));
    flipByte(root, await published(root, earlier), last);
    resume();
    const bad = await pending;
    expect(bad.status, JSON.stringify(bad.body)).toBe(502);
    expect(bad.body.error).toMatchObject({ code: "kv_integrity_error", param: "crc", type: "server_error" });
    const clean = answerOf(await complete(pd, b));
    expect(clean).not.toBe(previous);

    // a failed receive: the link names a slab whose producer is gone; the request moves and is served whole
    const failed = await stalled(pd, () => complete(pd, c));
    const rid = await published(root, failed.earlier);
    pointAt(root, rid, last, `slab-999999-gone-0:0:${readlinkSync(linkOf(root, rid, last)).split(":")[2]}`);
    failed.resume();
    const moved = answerOf(await failed.pending);
    expect(await metricsOf(pd.url)).toMatch(/^airm_migrations_total\{role="prefill",reason="kv_transport_error"\} 1$/m);
    expect(moved).toBe(answerOf(await complete(pd, c)));
    await expectNothingLeft(pd);
  });

  it("vLLM #53095: 128 concurrent requests whose prefill leases expire (TTL 0.5 s) while they wait for a decode slot each get their own tokens", async () => {
    // 4 decode slots, taken by 4 long generations: the burst's KV is pulled at once, then waits for a slot past the lease TTL
    const pd = await started({
      model: tiny,
      maxModelLen: 2048,
      prefill: [{ env: { AIRM_KV_LEASE_TTL_S: "0.5" } }],
      decode: [{ env: { AIRM_MAX_NUM_SEQS: "4" } }],
      // a KV that the busy decode worker pulls only after the TTL (rare) then costs 10 s and a new prefill, not 60 s
      gatewayEnv: { AIRM_DECODE_IDLE_TIMEOUT_MS: "10000" },
    });
    const id = await modelId(pd);
    const bodies = Array.from({ length: 128 }, (_, i) => body(id, i, 20 + (i % 13), 16));
    const calm = await calmRun(pd, bodies, 4);
    const blockers = Array.from({ length: 4 }, (_, i) => complete(pd, body(id, 200 + i, 8, 2000)));
    await until(async () => (await health(pd.part("decode").url)).requests.running === 4, "the long generations to hold every slot", 30_000, 5);
    const t0 = Date.now();
    const burst = (await Promise.all(bodies.map((b) => complete(pd, b)))).map(answerOf);
    expect(burst).toEqual(calm);
    expect(Date.now() - t0).toBeLessThan(60_000);
    for (const r of await Promise.all(blockers)) expect(r.status).toBe(200);
    // the leases did expire under the waiting requests (the condition of the test)
    expect((await health(pd.part("prefill").url)).leases.expired).toBeGreaterThan(64);
    await expectNothingLeft(pd);
  });

  it("vLLM PR #50754: a prefill worker that dies after answering, its KV never landing, ends the decode's wait with a typed error within its bound", async () => {
    const prefillMs = 5000;
    const kvMs = 1000;
    const pd = await started({
      model: slow,
      maxModelLen: S,
      // the prefill worker is not restarted here: no wait for it to come back (AIRM_WORKER_WAIT_S=0)
      gatewayEnv: { AIRM_HEALTH_INTERVAL_MS: "60000", AIRM_PREFILL_TIMEOUT_MS: String(prefillMs), AIRM_KV_TIMEOUT_MS: String(kvMs), AIRM_WORKER_WAIT_S: "0" },
    });
    const id = await modelId(pd);
    const t0 = Date.now();
    const send = () =>
      fetch(`${pd.url}/v1/completions`, { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify({ ...body(id, 4, 256), stream: true }) });
    const { pending, resume } = await stalled(pd, send);
    const r = await pending;
    expect(r.status).toBe(200);
    const events = sseEvents<any>(r.body!);
    // the prefill worker answered the first token, then dies; its KV is lost with it
    const first = await events.next();
    expect(first.value.choices[0].finish_reason).toBeNull();
    await pd.part("prefill").stop("SIGKILL");
    rmSync(join(pd.clusterDir!, "keys"), { recursive: true, force: true });
    resume();
    const rest: any[] = [];
    for await (const ev of events) rest.push(ev);
    const waited = Date.now() - t0;
    expect(waited).toBeLessThan(prefillMs + kvMs + 5000);
    const error = rest.at(-1).error;
    expect(error, JSON.stringify(rest)).toBeDefined();
    expect(["kv_timeout", "prefill_unreachable", "no_healthy_worker"]).toContain(error.code);
    await expectNothingLeft(pd);
  });

  it("vLLM PR #41269: a decode worker that refuses a request (too long for its context, or draining) has the prefill's lease and blocks released at once, not at the TTL", async () => {
    // decode serves a shorter context than prefill; the prefill's lease TTL is the default 120 s
    const pd = await started({
      model: slow,
      prefill: [{ env: { AIRM_MAX_MODEL_LEN: "512" } }],
      decode: [{ env: { AIRM_MAX_MODEL_LEN: "256", AIRM_DRAIN_S: "60" } }],
      gatewayEnv: { AIRM_HEALTH_INTERVAL_MS: "60000" },
    });
    const id = await modelId(pd);
    const prefill = pd.part("prefill").url;
    const t0 = Date.now();
    const long = await complete(pd, body(id, 5, 300, 4));
    expect(long.status, JSON.stringify(long.body)).toBe(400);
    expect(long.body.error).toMatchObject({ code: "context_overflow", type: "invalid_request_error" });
    expect(long.body.error.message).toMatch(/300 tokens on the decode worker/);
    await until(async () => (await health(prefill)).leases.outstanding === 0, "the prefill's lease to end", 5000);
    expect(Date.now() - t0).toBeLessThan(10_000);
    expect((await health(prefill)).leases.expired).toBe(0);

    // draining: a long request keeps the decode worker alive while it refuses new ones (503 worker_draining)
    const running = complete(pd, body(id, 6, 8, 240));
    await until(async () => (await health(pd.part("decode").url)).requests.running === 1, "decode to run", 30_000, 5);
    pd.part("decode").child.kill("SIGTERM");
    await until(async () => (await fetch(`${pd.part("decode").url}/health`)).status === 503, "decode to drain", 10_000, 5);
    const refused = await complete(pd, body(id, 7, 16, 4));
    expect(refused.status, JSON.stringify(refused.body)).toBe(503);
    expect(refused.body.error.code).toBe("worker_draining");
    // every prefill of it (the gateway moved it after each refusal) ended at once; the long request's lease is the one left
    await until(async () => (await health(prefill)).leases.outstanding === 1, "the refused request's prefill leases to end", 5000);
    expect(await leasesEnded(prefill, "decode_rejected")).toBeGreaterThan(0);
    expect((await health(prefill)).leases.expired).toBe(0);
    // the long request finishes on the draining worker, which then exits
    expect((await running).status).toBe(200);
    await pd.part("decode").exited;
    await expectNothingLeft(pd);
  });

  it("SGLang #30233: a prompt too long for prefill is a 400 context_overflow naming the limit; decode takes no KV and no block for it", async () => {
    const pd = await started({ model: tiny, maxModelLen: 128 });
    const id = await modelId(pd);
    const r = await complete(pd, body(id, 8, 200, 4));
    expect(r.status, JSON.stringify(r.body)).toBe(400);
    expect(r.body.error).toMatchObject({ code: "context_overflow", type: "invalid_request_error", param: "max_tokens" });
    expect(r.body.error.message).toMatch(/exceeds max_model_len of 128 tokens/);
    const chat = await postJson(`${pd.url}/v1/chat/completions`, { model: id, messages: [{ role: "user", content: "word ".repeat(200) }], max_tokens: 4 });
    expect(chat.status).toBe(400);
    expect(chat.body.error.code).toBe("context_overflow");
    // decode (called first, to wait for the KV) was released: it took no KV, no block, emitted nothing, counted no error
    const dm = await metricsOf(pd.part("decode").url);
    expect(dm).not.toMatch(/^airm_worker_requests_total\{[^}]*route="decode",outcome="ok"/m);
    expect(dm).toMatch(/^airm_kv_pulls_total(?:\{[^}]*\})? 0$/m);
    expect(dm).not.toMatch(/outcome="engine_error"/);
    await expectNothingLeft(pd);
  });

  it("SGLang PR #36926: a client that leaves during a chunked prefill (16-token chunks) leaves no KV block, lease or blob", async () => {
    const pd = await started({ model: slow, maxModelLen: S, prefill: [{ env: { AIRM_MAX_NUM_BATCHED_TOKENS: "16" } }] });
    const id = await modelId(pd);
    const prefill = pd.part("prefill").url;
    const ac = new AbortController();
    const gone = fetch(`${pd.url}/v1/completions`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({ ...body(id, 9, 400), stream: true }),
      signal: ac.signal,
    }).catch(() => null);
    await until(async () => (await health(prefill)).requests.running === 1, "the prefill to run", 30_000, 2);
    await sleep(50);
    ac.abort();
    await gone;
    // the lease ended while the prompt was still being prefilled, and nothing it computed was kept
    await until(async () => (await leasesEnded(prefill, "client_gone")) === 1, "the prefill's lease to end as client_gone", 10_000);
    const stopped = /^airm_worker_requests_total\{route="prefill",outcome="client_gone"[^}]*\} 1$/m;
    await until(async () => stopped.test(await metricsOf(prefill)), "the prefill to end as client_gone", 30_000);
    await expectNothingLeft(pd);
    // and the workers serve the next request
    expect((await complete(pd, body(id, 10, 16, 4))).status).toBe(200);
  });

  it("KV pull answered with another request's bytes (a blob or the manifest of another request): 502 kv_integrity_error on the CRC or the request id, never that request's tokens", async () => {
    const pd = await started({ model: slow, maxModelLen: S, gatewayEnv: { AIRM_HEALTH_INTERVAL_MS: "60000" } });
    const id = await modelId(pd);
    const root = pd.clusterDir!;
    const last = `${(await health(pd.part("decode").url)).model.layers - 1}+v`;
    // the other request: prefilled on its own (its lease keeps its blobs), same prompt length
    const other = "cmpl-other-request-1";
    const p = await postJson(`${pd.part("prefill").url}/internal/prefill`, { requestId: other, input: { promptTokenIds: body(id, 11, 256).prompt }, maxTokens: 8 }, internal(pd));
    expect(p.status).toBe(200);
    for (const [seed, name, field] of [
      [12, last, "crc"],
      [13, "manifest", "requestId"],
    ] as const) {
      const { pending, resume, earlier } = await stalled(pd, () => complete(pd, body(id, seed, 256)));
      const rid = await published(root, earlier);
      pointAt(root, rid, name, readlinkSync(linkOf(root, other, name)));
      resume();
      const r = await pending;
      expect(r.status, JSON.stringify(r.body)).toBe(502);
      expect(r.body.error).toMatchObject({ code: "kv_integrity_error", param: field });
    }
    await postJson(`${pd.part("prefill").url}/internal/release`, { requestId: other, reason: "done" }, internal(pd));
    await expectNothingLeft(pd);
  });

  it("128 concurrent requests with leases near their TTL (the decode worker stalled about that long): each is served whole, the ones whose KV expired first through a new prefill within the KV bound", async () => {
    const pd = await started({
      model: tiny,
      maxModelLen: 256,
      prefill: [{ env: { AIRM_KV_LEASE_TTL_S: "1" } }],
      gatewayEnv: { AIRM_HEALTH_INTERVAL_MS: "60000", AIRM_PREFILL_TIMEOUT_MS: "4000", AIRM_KV_TIMEOUT_MS: "1000" },
    });
    const id = await modelId(pd);
    const bodies = Array.from({ length: 128 }, (_, i) => body(id, 100 + i, 20 + (i % 13), 8));
    const calm = await calmRun(pd, bodies, 16);
    const t0 = Date.now();
    const { pending, resume } = await stalled(pd, () => Promise.all(bodies.map((b) => complete(pd, b))), 16);
    await sleep(1200);
    resume();
    expect((await pending).map(answerOf)).toEqual(calm);
    expect(Date.now() - t0).toBeLessThan(20_000);
    // some KV expired before the stalled decode pulled it: those requests were prefilled again
    expect(await metricsOf(pd.url)).toMatch(/^airm_migrations_total\{role="prefill",reason="kv_timeout"\} [1-9]\d*$/m);
    expect((await health(pd.part("prefill").url)).leases.expired).toBeGreaterThan(0);
    await expectNothingLeft(pd);
  });
});
