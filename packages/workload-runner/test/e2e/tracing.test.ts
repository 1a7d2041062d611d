// OpenTelemetry: with an SDK registered in the gateway's process, one PD request yields a
// gateway.request span with prefill, kv and decode children in the same trace, and the KV
// figures as attributes. The workers are real processes.
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { rmSync } from "node:fs";
import { NodeTracerProvider } from "@opentelemetry/sdk-trace-node";
import { InMemorySpanExporter, SimpleSpanProcessor } from "@opentelemetry/sdk-trace-base";
import { startGateway, type RunningGateway } from "@airm/gateway";
import type { RunningCluster } from "../../src/index.ts";
import { cluster, postJson, tinyModel } from "../helpers/cluster.ts";

const exporter = new InMemorySpanExporter();
const provider = new NodeTracerProvider({ spanProcessors: [new SimpleSpanProcessor(exporter)] });
provider.register();

let model: string;
let workers: RunningCluster;
let gw: RunningGateway;

beforeAll(async () => {
  model = tinyModel();
  // the workers as processes; the gateway in this process, where the SDK is registered
  workers = await cluster({ model, maxModelLen: 128, gateway: false });
  gw = await startGateway({ port: 0, prefill: [workers.part("prefill").url], decode: [workers.part("decode").url], metricsPort: 0, internalToken: workers.internalToken });
});
afterAll(async () => {
  await gw?.close();
  await workers?.stop();
  await provider.shutdown();
  if (model) rmSync(model, { recursive: true, force: true });
});

describe("traces", () => {
  it("covers gateway -> prefill -> kv -> decode in one trace", async () => {
    const id = ((await (await fetch(`${gw.url}/v1/models`)).json()) as any).data[0].id;
    const r = await postJson(`${gw.url}/v1/completions`, { model: id, prompt: "trace me", max_tokens: 6, temperature: 0 });
    expect(r.status).toBe(200);
    const spans = exporter.getFinishedSpans();
    const root = spans.find((s) => s.name === "gateway.request")!;
    expect(root).toBeDefined();
    const children = spans.filter((s) => s.spanContext().traceId === root.spanContext().traceId && s !== root);
    expect(children.map((s) => s.name).sort()).toEqual(["decode", "kv", "prefill"]);
    for (const c of children) expect(c.parentSpanContext?.spanId).toBe(root.spanContext().spanId);
    const kv = children.find((s) => s.name === "kv")!;
    expect(kv.attributes["airm.kv_transport"]).toBe("shm");
    expect(typeof kv.attributes["airm.kv_load_ms"]).toBe("number");
    expect(children.find((s) => s.name === "prefill")!.attributes["airm.prompt_tokens"]).toBeGreaterThan(0);
    // the gateway's metrics endpoint saw the request too
    const m = await (await fetch(`http://127.0.0.1:${gw.metricsPort}/metrics`)).text();
    expect(m).toMatch(/^airm_gateway_requests_total\{route="\/v1\/completions",status="200"\} 1$/m);
  });
});
