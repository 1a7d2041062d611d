// Trace export settings and the SDK they start: the standard OTEL_* variables are parsed and
// checked with their names in the errors; with an endpoint a span reaches a real HTTP server in
// OTLP/JSON (or OTLP/protobuf) with the resource the settings describe; without one nothing is
// exported. (The collector test, test/otel-collector.test.ts, checks a real OpenTelemetry
// Collector and a whole PD trace.)
import { createServer, type IncomingHttpHeaders } from "node:http";
import type { AddressInfo } from "node:net";
import { ConfigError } from "@airm/rm-core";
import { trace } from "@opentelemetry/api";
import { afterAll, describe, expect, it } from "vitest";
import { exportPlan, startTracing } from "../src/index.ts";

const got: { path: string; headers: IncomingHttpHeaders; body: Buffer }[] = [];
const server = createServer((req, res) => {
  const chunks: Buffer[] = [];
  req.on("data", (c) => chunks.push(c));
  req.on("end", () => {
    got.push({ path: req.url ?? "", headers: req.headers, body: Buffer.concat(chunks) });
    res.writeHead(200, { "content-type": req.headers["content-type"] ?? "application/json" }).end(req.headers["content-type"]?.includes("json") ? "{}" : "");
  });
});
await new Promise<void>((r) => server.listen(0, "127.0.0.1", r));
const base = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
afterAll(() => server.close());

const errorOf = (f: () => unknown) => {
  try {
    f();
  } catch (e) {
    return e as ConfigError;
  }
  throw new Error("no error");
};

describe("trace export settings", () => {
  it("is off without an endpoint, with OTEL_TRACES_EXPORTER=none and with OTEL_SDK_DISABLED=true", async () => {
    expect(exportPlan({ service: "airm-gateway", env: {} })).toBeNull();
    expect(exportPlan({ service: "airm-gateway", env: { OTEL_EXPORTER_OTLP_ENDPOINT: base, OTEL_TRACES_EXPORTER: "none" } })).toBeNull();
    expect(exportPlan({ service: "airm-gateway", env: { OTEL_EXPORTER_OTLP_ENDPOINT: base, OTEL_SDK_DISABLED: "true" } })).toBeNull();
    const t = await startTracing({ service: "airm-gateway", env: {} });
    expect(t.enabled).toBe(false);
    expect(t.description).toBe("off");
  });

  it("builds the URL, headers, sampler and resource from the standard variables", () => {
    const p = exportPlan({
      service: "airm-worker",
      env: {
        OTEL_EXPORTER_OTLP_ENDPOINT: `${base}/`,
        OTEL_EXPORTER_OTLP_HEADERS: "x-api-key=a%20b,x-team=infra",
        OTEL_EXPORTER_OTLP_TRACES_HEADERS: "x-team=serving",
        OTEL_RESOURCE_ATTRIBUTES: "deployment.environment.name=ci,service.name=from-attrs",
        OTEL_TRACES_SAMPLER: "parentbased_traceidratio",
        OTEL_TRACES_SAMPLER_ARG: "0.25",
      },
      attributes: { "airm.role": "decode" },
    })!;
    expect(p.url).toBe(`${base}/v1/traces`);
    expect(p.protocol).toBe("http/protobuf");
    expect(p.headers).toEqual({ "x-api-key": "a b", "x-team": "serving" });
    expect(p.sampler).toBe("parentbased_traceidratio");
    expect(p.ratio).toBe(0.25);
    expect(p.resource).toMatchObject({ "service.name": "from-attrs", "airm.role": "decode", "deployment.environment.name": "ci", "process.pid": process.pid });
    const named = exportPlan({
      service: "airm-worker",
      env: { OTEL_EXPORTER_OTLP_TRACES_ENDPOINT: `${base}/custom`, OTEL_SERVICE_NAME: "pd", OTEL_RESOURCE_ATTRIBUTES: "service.name=x", OTEL_EXPORTER_OTLP_PROTOCOL: "grpc" },
    })!;
    expect(named.url).toBe(`${base}/custom`);
    expect(named.resource["service.name"]).toBe("pd");
    expect(named.protocol).toBe("grpc");
    expect(
      exportPlan({ service: "s", env: { OTEL_EXPORTER_OTLP_ENDPOINT: "http://c:4317", OTEL_EXPORTER_OTLP_TRACES_PROTOCOL: "grpc", OTEL_EXPORTER_OTLP_PROTOCOL: "http/json" } })!
        .url,
    ).toBe("http://c:4317");
  });

  it("refuses bad settings by name", () => {
    const cases: [Record<string, string>, string, RegExp][] = [
      [{ OTEL_TRACES_SAMPLER: "jaeger_remote" }, "OTEL_TRACES_SAMPLER", /expected one of always_on/],
      [{ OTEL_TRACES_SAMPLER_ARG: "0.5" }, "OTEL_TRACES_SAMPLER_ARG", /parentbased_always_on, which takes none/],
      [{ OTEL_TRACES_SAMPLER: "traceidratio", OTEL_TRACES_SAMPLER_ARG: "1.5" }, "OTEL_TRACES_SAMPLER_ARG", /1/],
      [{ OTEL_EXPORTER_OTLP_PROTOCOL: "thrift" }, "OTEL_EXPORTER_OTLP_PROTOCOL", /http\/protobuf, http\/json, grpc/],
      [{ OTEL_EXPORTER_OTLP_ENDPOINT: "collector:4318" }, "OTEL_EXPORTER_OTLP_ENDPOINT", /http:\/\/ or https:\/\/ URL/],
      [{ OTEL_TRACES_EXPORTER: "console" }, "OTEL_TRACES_EXPORTER", /otlp, none/],
      [{ OTEL_RESOURCE_ATTRIBUTES: "novalue" }, "OTEL_RESOURCE_ATTRIBUTES", /key=value/],
      [{ OTEL_EXPORTER_OTLP_ENDPOINT: base, OTEL_RESOURCE_ATTRIBUTES: "a=%zz" }, "OTEL_RESOURCE_ATTRIBUTES", /percent-encoding/],
      [{ OTEL_BSP_MAX_QUEUE_SIZE: "10", OTEL_BSP_MAX_EXPORT_BATCH_SIZE: "20" }, "OTEL_BSP_MAX_EXPORT_BATCH_SIZE", /larger than OTEL_BSP_MAX_QUEUE_SIZE/],
    ];
    for (const [env, name, message] of cases) {
      const e = errorOf(() => exportPlan({ service: "s", env }));
      expect(e, JSON.stringify(env)).toBeInstanceOf(ConfigError);
      expect(e.message, JSON.stringify(env)).toContain(name);
      expect(e.message, JSON.stringify(env)).toMatch(message);
    }
  });
});

describe("export to a real HTTP receiver", () => {
  it("sends a finished span as OTLP/JSON with the resource and the headers", async () => {
    const t = await startTracing({
      service: "airm-gateway",
      env: { OTEL_EXPORTER_OTLP_ENDPOINT: base, OTEL_EXPORTER_OTLP_PROTOCOL: "http/json", OTEL_EXPORTER_OTLP_HEADERS: "x-api-key=k1", OTEL_SERVICE_NAME: "pd-test" },
      attributes: { "airm.role": "gateway" },
    });
    expect(t.enabled).toBe(true);
    expect(t.description).toBe(`http/json to ${base}/v1/traces, sampler parentbased_always_on, service pd-test`);
    const span = trace.getTracer("test").startSpan("gateway.request", { attributes: { "airm.request_id": "cmpl-1" } });
    span.end();
    await t.forceFlush();
    const req = got.find((g) => g.path === "/v1/traces")!;
    expect(req.headers["x-api-key"]).toBe("k1");
    expect(req.headers["content-type"]).toMatch(/application\/json/);
    const body = JSON.parse(req.body.toString());
    const rs = body.resourceSpans[0];
    const attr = (list: { key: string; value: Record<string, unknown> }[], k: string) => Object.values(list.find((a) => a.key === k)?.value ?? {})[0];
    expect(attr(rs.resource.attributes, "service.name")).toBe("pd-test");
    expect(attr(rs.resource.attributes, "airm.role")).toBe("gateway");
    const s = rs.scopeSpans[0].spans[0];
    expect(s.name).toBe("gateway.request");
    expect(attr(s.attributes, "airm.request_id")).toBe("cmpl-1");
    expect(s.traceId).toBe(span.spanContext().traceId);
    await t.shutdown();
  });
});
