// Trace export to a real OpenTelemetry Collector (scripts/otel/build-collector.sh: core v0.165.0
// with contrib's file exporter), on loopback. A PD cluster as airm up runs it, with the standard
// OTEL_* variables: the gateway exports over OTLP/HTTP protobuf, the prefill worker over OTLP/HTTP
// JSON, the decode worker over OTLP/gRPC. One streamed completion gives one trace id across the
// three processes, read back from the collector's file output: gateway.request with prefill, kv
// and decode children; the prefill worker's worker.prefill (with kv.push) under the gateway's
// prefill span, the decode worker's worker.decode (with kv.pull) under its decode span; and the
// attributes an operator looks for (request id, model, token counts, transport, KV bytes and
// time, queue wait, decode batch size per step, the endpoint picked and why).
import { rmSync } from "node:fs";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { attrsOf, type Collector, type ExportedSpan as Span, spanTree, startCollector } from "../../../../scripts/otel/collector.ts";
import type { RunningCluster } from "../../src/index.ts";
import { cluster, modelId, readSse, tinyModel } from "../helpers/cluster.ts";

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
let col: Collector;
let model: string;
let c: RunningCluster;

beforeAll(async () => {
  // The collector is built once per version (CI builds it before the tests; cold ~6 min on 2 cores).
  col = await startCollector();
  model = tinyModel({ arch: "llama", layers: 2 });
  c = await cluster({
    model,
    maxModelLen: 128,
    prefill: [{ env: { OTEL_EXPORTER_OTLP_ENDPOINT: col.http, OTEL_EXPORTER_OTLP_PROTOCOL: "http/json" } }],
    decode: [{ env: { OTEL_EXPORTER_OTLP_TRACES_ENDPOINT: col.grpc, OTEL_EXPORTER_OTLP_TRACES_PROTOCOL: "grpc" } }],
    env: { OTEL_BSP_SCHEDULE_DELAY: "100", OTEL_RESOURCE_ATTRIBUTES: "deployment.environment.name=ci" },
    gatewayEnv: { OTEL_EXPORTER_OTLP_ENDPOINT: col.http, OTEL_SERVICE_NAME: "airm-gateway-ci" },
  });
}, 600_000);

afterAll(async () => {
  await c?.stop();
  await col?.stop();
  if (model) rmSync(model, { recursive: true, force: true });
});

describe("traces exported to a real OpenTelemetry Collector", () => {
  it("one PD request: one trace across the gateway, prefill and decode processes, with the expected shape and attributes", async () => {
    const id = await modelId(c);
    const r = await fetch(`${c.url}/v1/completions`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({ model: id, prompt: "trace this request", max_tokens: 8, ignore_eos: true, temperature: 0, stream: true, stream_options: { include_usage: true } }),
    });
    expect(r.status).toBe(200);
    const events = await readSse(r);
    const usage = (events.at(-2) as { usage: { prompt_tokens: number; completion_tokens: number } }).usage;
    expect(usage.completion_tokens).toBe(8);

    const names = ["gateway.request", "prefill", "kv", "decode", "worker.prefill", "kv.push", "worker.decode", "kv.pull"];
    let spans: Span[] = [];
    let root: Span | undefined;
    for (let i = 0; i < 200; i++) {
      const all = col.spans();
      root = all.find((s) => s.name === "gateway.request");
      spans = root ? all.filter((s) => s.traceId === root!.traceId) : [];
      if (names.every((n) => spans.some((s) => s.name === n))) break;
      await sleep(100);
    }
    expect(root, "a gateway.request span reached the collector").toBeDefined();
    expect(spans.map((s) => s.name).sort()).toEqual([...names].sort());
    console.log(`one PD trace (${root!.traceId}) as the collector wrote it:\n${spanTree(spans, root!)}`);

    const one = (name: string) => spans.find((s) => s.name === name)!;
    // One trace id across three processes, each with its own resource.
    expect(new Set(spans.map((s) => `${s.service}/${s.role}`))).toEqual(new Set(["airm-gateway-ci/gateway", "airm-worker/prefill", "airm-worker/decode"]));
    expect(one("worker.prefill").role).toBe("prefill");
    expect(one("worker.decode").role).toBe("decode");
    // The shape.
    expect(root!.parentSpanId ?? "").toBe("");
    for (const n of ["prefill", "kv", "decode"]) expect(one(n).parentSpanId, n).toBe(root!.spanId);
    expect(one("worker.prefill").parentSpanId).toBe(one("prefill").spanId);
    expect(one("kv.push").parentSpanId).toBe(one("worker.prefill").spanId);
    expect(one("worker.decode").parentSpanId).toBe(one("decode").spanId);
    expect(one("kv.pull").parentSpanId).toBe(one("worker.decode").spanId);

    // What an operator looks for.
    const rid = root!.attrs["airm.request_id"];
    expect(rid).toMatch(/^cmpl-[0-9a-f]{24}$/);
    for (const s of spans.filter((x) => x !== root)) expect(s.attrs["airm.request_id"], s.name).toBe(rid);
    expect(root!.attrs).toMatchObject({
      "gen_ai.request.model": id,
      "gen_ai.usage.input_tokens": usage.prompt_tokens,
      "gen_ai.usage.output_tokens": 8,
      "gen_ai.response.finish_reasons": ["length"],
      "airm.kv_transport": "shm",
      "airm.stream": true,
    });
    expect(root!.attrs["airm.ttft_ms"]).toBeGreaterThan(0);
    expect(root!.attrs["airm.tpot_ms"]).toBeGreaterThan(0);
    const dispatch = root!.events?.find((e) => e.name === "airm.dispatch");
    expect(attrsOf(dispatch?.attributes)).toMatchObject({ "airm.path": "pd", "airm.request_id": rid });
    expect(one("prefill").attrs["airm.pick.reason"]).toBe("the only healthy prefill worker");
    expect(one("decode").attrs["airm.pick.reason"]).toBe("the only healthy decode worker");
    expect(one("kv").attrs["airm.kv_bytes"]).toBeGreaterThan(0);
    expect(one("kv").attrs["airm.kv_load_ms"]).toBeGreaterThanOrEqual(0);
    const pre = one("worker.prefill").attrs;
    expect(pre["airm.prompt_tokens"]).toBe(usage.prompt_tokens);
    expect(pre["airm.queue_wait_ms"]).toBeGreaterThanOrEqual(0);
    expect(pre["airm.kv_bytes"]).toBe(one("kv").attrs["airm.kv_bytes"]);
    expect(pre["airm.kv_transport"]).toBe("shm");
    expect(one("kv.push").attrs["airm.kv_bytes"]).toBe(pre["airm.kv_bytes"]);
    const dec = one("worker.decode");
    expect(dec.attrs).toMatchObject({
      "airm.kv_transport": "shm",
      "airm.prompt_tokens": usage.prompt_tokens,
      "airm.finish": "done",
      "airm.decode.steps": 7,
      "airm.decode.batch_size.max": 1,
    });
    expect(dec.attrs["airm.queue_wait_ms"]).toBeGreaterThanOrEqual(0);
    expect(dec.attrs["airm.kv_wait_ms"]).toBeGreaterThanOrEqual(0);
    const batch = dec.events?.filter((e) => e.name === "airm.decode.batch_size") ?? [];
    expect(batch.length).toBeGreaterThanOrEqual(1);
    expect(attrsOf(batch[0].attributes)).toEqual({ "airm.batch_size": 1, "airm.step": 1 });
    // Spans nest in time: every span starts within the request; the gateway's own end before it
    // (a worker's span may end just after, once it has released the request's lease).
    for (const s of spans) expect(BigInt(s.startTimeUnixNano) >= BigInt(root!.startTimeUnixNano), s.name).toBe(true);
    for (const s of spans.filter((x) => x.role === "gateway")) expect(BigInt(s.endTimeUnixNano) <= BigInt(root!.endTimeUnixNano), s.name).toBe(true);
  });
});
