// The picker over real gRPC on 127.0.0.1, with a client playing Envoy (headers, then the body in
// chunks) and real HTTP servers standing in for model servers' /metrics.

import { mkdtempSync, renameSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { credentials } from "@grpc/grpc-js";
import { afterEach, expect, test } from "vitest";
import type { Endpoint } from "@airm/routing";
import { PrefixIndex, protos, startEpp, StaticEndpoints, type Epp, type EppOptions } from "../src/index.ts";
import { EnvoyStub, startFakeModelServer, type FakeModelServer } from "../src/testing/index.ts";

const cleanup: (() => Promise<void> | void)[] = [];
afterEach(async () => {
  while (cleanup.length) await cleanup.pop()!();
});

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

async function pods(...loads: { waiting?: number; running?: number; kvUsage?: number }[]): Promise<FakeModelServer[]> {
  const out = await Promise.all(loads.map((l) => startFakeModelServer(l)));
  for (const p of out) cleanup.push(() => p.close());
  return out;
}

/** An endpoints file, a picker over it (scraping every 20 ms), and a stub Envoy. */
async function picker(endpoints: Endpoint[], options: Partial<EppOptions> = {}): Promise<{ epp: Epp; envoy: EnvoyStub; file: string }> {
  const dir = mkdtempSync(join(tmpdir(), "airm-epp-"));
  cleanup.push(() => rmSync(dir, { recursive: true, force: true }));
  const file = join(dir, "endpoints.json");
  writeFileSync(file, JSON.stringify(endpoints));
  const epp = await startEpp({ source: new StaticEndpoints(file, { pollMs: 25 }), grpcPort: 0, metricsPort: 0, healthPort: 0, scrapeIntervalMs: 20, ...options });
  cleanup.push(() => epp.close());
  await epp.scraper.settled();
  const envoy = new EnvoyStub(epp.address);
  cleanup.push(() => envoy.close());
  return { epp, envoy, file };
}

const chat = (text: string) => ({ model: "tiny", messages: [{ role: "user", content: text }], max_tokens: 8 });

test("the less loaded pod wins; the answer carries the destination header, envoy.lb metadata and the body back", async () => {
  const [busy, idle] = await pods({ waiting: 4, running: 8, kvUsage: 0.6 }, { waiting: 0, running: 1, kvUsage: 0.1 });
  const { envoy } = await picker([busy.endpoint("decode", "busy"), idle.endpoint("decode", "idle")]);
  const body = JSON.stringify({ model: "tiny", prompt: "x".repeat(150_000) });
  const a = await envoy.request({ body, chunkBytes: 16_384, headers: { "x-prefiller-host-port": "1.2.3.4:5" } });
  const dest = `127.0.0.1:${idle.port}`;
  expect(a.immediate).toBeUndefined();
  expect(a.setHeaders["x-gateway-destination-endpoint"]).toBe(dest);
  expect(a.setHeaders["content-length"]).toBe(String(body.length));
  expect(a.lbDestination).toBe(dest);
  expect(a.clearRouteCache).toBe(true);
  // No prefill pods: a client's x-prefiller-host-port is removed, not passed on.
  expect(a.setHeaders["x-prefiller-host-port"]).toBeUndefined();
  expect(a.removeHeaders).toEqual(["x-prefiller-host-port"]);
  expect(a.body.toString()).toBe(body);
  expect(a.bodyEnded).toBe(true);
});

test("PD: a decode destination and the prefill pod in x-prefiller-host-port; a shared prompt prefix keeps its prefill pod", async () => {
  const [dec, preA, preB] = await pods({}, { waiting: 1 }, { waiting: 0 });
  const { envoy, epp } = await picker([dec.endpoint("decode", "dec"), preA.endpoint("prefill", "pre-a"), preB.endpoint("prefill", "pre-b")]);
  const system = "You are a careful assistant. ".repeat(60);
  const first = await envoy.request({ body: chat(`${system} question one`) });
  expect(first.setHeaders["x-gateway-destination-endpoint"]).toBe(`127.0.0.1:${dec.port}`);
  expect(first.setHeaders["x-prefiller-host-port"]).toBe(`127.0.0.1:${preB.port}`);
  expect(first.removeHeaders).toEqual([]);
  // pre-b becomes the busier prefill pod, yet the prompts that share its prefix stay with it.
  preB.setLoad({ waiting: 4, running: 6, kvUsage: 0.7 });
  preA.setLoad({ waiting: 0 });
  await sleep(120);
  for (const q of ["two", "three", "four"]) {
    const a = await envoy.request({ body: chat(`${system} question ${q}`) });
    expect(a.setHeaders["x-prefiller-host-port"]).toBe(`127.0.0.1:${preB.port}`);
  }
  // An unrelated prompt goes to the less loaded prefill pod.
  const other = await envoy.request({ body: chat("Translate to French: ".repeat(40)) });
  expect(other.setHeaders["x-prefiller-host-port"]).toBe(`127.0.0.1:${preA.port}`);
  const text = await (await fetch(`http://127.0.0.1:${epp.metricsPort}/metrics`)).text();
  expect(text).toMatch(/^airm_epp_picks_total\{reason="prefix_affinity",role="prefill"\} 3$/m);
  expect(text).toMatch(/^airm_epp_picks_total\{reason="least_loaded",role="prefill"\} 2$/m);
  expect(text).toMatch(/^airm_epp_picks_total\{reason="only_candidate",role="decode"\} 5$/m);
  expect(text).toMatch(/^airm_epp_decision_duration_ms_count 5$/m);
});

test("a stale or failing pod is skipped; all of them down is a 503 with an OpenAI error body", async () => {
  const [a, b] = await pods({ waiting: 0 }, { waiting: 3 });
  const { envoy, epp } = await picker([a.endpoint("both", "a"), b.endpoint("both", "b")], { staleAfterMs: 300 });
  a.setStatus(500);
  await sleep(100);
  const r = await envoy.request({ body: { model: "tiny", prompt: "hi" } });
  expect(r.setHeaders["x-gateway-destination-endpoint"]).toBe(`127.0.0.1:${b.port}`);
  // b stops answering at all: its last figures go stale after 300 ms.
  await b.close();
  await sleep(450);
  const down = await envoy.request({ body: { model: "tiny", prompt: "hi" } });
  expect(down.immediate?.status).toBe(503);
  expect(down.immediate?.headers["content-type"]).toBe("application/json");
  const err = JSON.parse(down.immediate!.body).error;
  expect(err).toMatchObject({ type: "server_error", param: null, code: "no_ready_endpoints" });
  expect(err.message).toMatch(/no decode endpoint is ready/);
  const text = await (await fetch(`http://127.0.0.1:${epp.metricsPort}/metrics`)).text();
  expect(text).toMatch(/^airm_epp_immediate_responses_total\{status="503",code="no_ready_endpoints"\} 1$/m);
  expect(text).toMatch(/^airm_epp_endpoints_ready\{role="both"\} 0$/m);
  expect(text).toMatch(/^airm_epp_endpoints\{role="both"\} 2$/m);
});

test("every pod saturated is a 429; a body that is not JSON or has no model is a 400", async () => {
  const [a, b] = await pods({ waiting: 9 }, { kvUsage: 0.95 });
  const { envoy } = await picker([a.endpoint("decode"), b.endpoint("decode")]);
  const busy = await envoy.request({ body: chat("hello") });
  expect(busy.immediate?.status).toBe(429);
  expect(JSON.parse(busy.immediate!.body).error).toMatchObject({ type: "invalid_request_error", code: "all_endpoints_saturated" });
  const bad = await envoy.request({ body: "{not json", chunkBytes: 3 });
  expect(bad.immediate?.status).toBe(400);
  expect(JSON.parse(bad.immediate!.body).error).toMatchObject({ code: "invalid_request", param: null });
  const noModel = await envoy.request({ body: { prompt: "hi" } });
  expect(JSON.parse(noModel.immediate!.body).error).toMatchObject({ code: "invalid_request", param: "model", message: "model not found in request body" });
});

test("changes to the endpoints file are picked up, also when the file is replaced", async () => {
  const [a, b] = await pods({ waiting: 0 }, { waiting: 0 });
  const { envoy, file } = await picker([a.endpoint("decode", "a")]);
  expect((await envoy.request({ body: chat("x") })).setHeaders["x-gateway-destination-endpoint"]).toBe(`127.0.0.1:${a.port}`);
  writeFileSync(`${file}.new`, JSON.stringify([b.endpoint("decode", "b")]));
  renameSync(`${file}.new`, file);
  let dest = "";
  for (let i = 0; i < 100 && dest !== `127.0.0.1:${b.port}`; i++) {
    await sleep(20);
    dest = (await envoy.request({ body: chat("x") })).setHeaders["x-gateway-destination-endpoint"] ?? "";
  }
  expect(dest).toBe(`127.0.0.1:${b.port}`);
});

test("a request without a body is routed at once; response phases pass through", async () => {
  const [a] = await pods({});
  const { envoy } = await picker([a.endpoint("both")]);
  const get = await envoy.request({ body: null, headers: { ":method": "GET", ":path": "/v1/models" } });
  expect(get.setHeaders["x-gateway-destination-endpoint"]).toBe(`127.0.0.1:${a.port}`);
  expect(get.setHeaders["content-length"]).toBeUndefined();
  const s = envoy.open();
  s.send({ request_headers: { headers: { headers: [{ key: ":method", raw_value: Buffer.from("POST") }] } } });
  s.send({ request_body: { body: Buffer.from(JSON.stringify(chat("hi"))), end_of_stream: true } });
  expect((await s.next())?.request_headers).toBeDefined();
  expect((await s.next())?.request_body).toBeDefined();
  s.send({ response_headers: { headers: { headers: [{ key: ":status", raw_value: Buffer.from("200") }] } } });
  const rh = (await s.next())?.response_headers as any;
  expect(rh.response.header_mutation.set_headers[0].header.key).toBe("x-went-into-resp-headers");
  s.send({ response_body: { body: Buffer.from("data: 1\n\n"), end_of_stream: false } });
  s.send({ response_body: { body: Buffer.from("data: [DONE]\n\n"), end_of_stream: true } });
  const parts = [(await s.next())?.response_body as any, (await s.next())?.response_body as any].map((r) => r.response.body_mutation.streamed_response);
  expect(parts.map((p) => [Buffer.from(p.body).toString(), p.end_of_stream ?? false])).toEqual([
    ["data: 1\n\n", false],
    ["data: [DONE]\n\n", true],
  ]);
  s.send({ response_trailers: {} });
  expect((await s.next())?.response_trailers).toBeDefined();
  s.end();
  expect(await s.next()).toBeNull();
});

test("FailOpen routes to an endpoint when the picker fails; FailClose answers 500", async () => {
  const [a, b] = await pods({}, {});
  // A prefix index that throws stands for any internal failure of the picker.
  const broken = (failureMode: "FailOpen" | "FailClose"): Partial<EppOptions> => ({
    failureMode,
    picker: {
      prefix: Object.assign(new PrefixIndex(), {
        hashes(): number[] {
          throw new Error("boom");
        },
      }),
    },
  });
  const open = await picker([a.endpoint("decode"), b.endpoint("decode")], broken("FailOpen"));
  const dests = new Set<string>();
  for (let i = 0; i < 4; i++) dests.add((await open.envoy.request({ body: chat("x") })).setHeaders["x-gateway-destination-endpoint"]);
  expect([...dests].sort()).toEqual([`127.0.0.1:${a.port}`, `127.0.0.1:${b.port}`].sort());
  const text = await (await fetch(`http://127.0.0.1:${open.epp.metricsPort}/metrics`)).text();
  expect(text).toMatch(/^airm_epp_picks_total\{reason="fail_open",role="decode"\} 4$/m);
  const closed = await picker([a.endpoint("decode"), b.endpoint("decode")], broken("FailClose"));
  const c = await closed.envoy.request({ body: chat("x") });
  expect(c.immediate?.status).toBe(500);
  expect(JSON.parse(c.immediate!.body).error).toMatchObject({ code: "picker_error", type: "server_error", message: "the endpoint picker failed: boom" });
});

test("grpc.health.v1 answers SERVING on the ext_proc port and on the health port", async () => {
  const [a] = await pods({});
  const { epp } = await picker([a.endpoint("both")]);
  for (const port of [epp.grpcPort, epp.healthPort!]) {
    const Health = protos().health;
    const client = new Health(`127.0.0.1:${port}`, credentials.createInsecure()) as any;
    const check = (service: string) =>
      new Promise<{ status?: number; code?: number }>((resolve) => client.Check({ service }, (err: any, res: any) => resolve(err ? { code: err.code } : { status: res.status })));
    expect(await check("")).toEqual({ status: 1 });
    expect(await check("envoy.service.ext_proc.v3.ExternalProcessor")).toEqual({ status: 1 });
    expect(await check("nope")).toEqual({ code: 5 });
    client.close();
  }
});
