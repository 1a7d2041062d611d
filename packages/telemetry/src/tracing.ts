// Starts a part's OpenTelemetry SDK when its configuration asks for export: a NodeTracerProvider
// (async-hooks context, W3C traceparent and baggage propagation) with the sampler, resource and
// batch settings of TELEMETRY_CONFIG and the OTLP exporter of the chosen protocol. Without an
// endpoint nothing is loaded: the spans the code starts are the API's no-ops and cost nothing.

import { hostname } from "node:os";
import { ConfigError } from "@airm/rm-core";
import type { Sampler } from "@opentelemetry/sdk-trace-node";
import { TELEMETRY_CONFIG, type OtlpProtocol, type SamplerName } from "./telemetry-config.ts";

export type TelemetryValues = ReturnType<typeof TELEMETRY_CONFIG.resolve>;

export interface TracingOptions {
  /** The part's default service.name (airm-gateway, airm-worker); OTEL_SERVICE_NAME wins. */
  service: string;
  /** The environment the settings are read from. */
  env: Record<string, string | undefined>;
  /** Resource attributes of the part (airm.role, ...); OTEL_RESOURCE_ATTRIBUTES adds to them. */
  attributes?: Record<string, string | number | boolean>;
  /** Settings given in code (a CLI flag); they win over the environment. */
  options?: Partial<TelemetryValues>;
}

export interface Tracing {
  /** Whether spans are exported. */
  readonly enabled: boolean;
  /** Where and how, for the part's start-up log ("off" when not exporting). */
  readonly description: string;
  /** Exports what is buffered now (a test reading a collector's output, a part about to exit). */
  forceFlush(): Promise<void>;
  /** Exports what is buffered and stops the SDK (call once, at exit). */
  shutdown(): Promise<void>;
}

export interface ExportPlan {
  url: string;
  protocol: OtlpProtocol;
  headers: Record<string, string>;
  sampler: SamplerName;
  ratio: number | undefined;
  resource: Record<string, string | number | boolean>;
  /** One export's bound (ms). */
  timeoutMs: number;
  /** The batch span processor's settings. */
  batch: { scheduledDelayMillis: number; maxQueueSize: number; maxExportBatchSize: number; exportTimeoutMillis: number };
}

const OFF: Tracing = { enabled: false, description: "off", forceFlush: async () => {}, shutdown: async () => {} };

/** `key=value` pairs (values percent-encoded) as a record; the variable's name goes in the error. */
function pairs(items: string[] | undefined, variable: string): Record<string, string> {
  const out: Record<string, string> = {};
  for (const item of items ?? []) {
    const eq = item.indexOf("=");
    const key = item.slice(0, eq).trim();
    try {
      out[key] = decodeURIComponent(item.slice(eq + 1).trim());
    } catch {
      throw new ConfigError(variable, `the value of ${JSON.stringify(key)} is not valid percent-encoding`);
    }
  }
  return out;
}

/**
 * What export the settings ask for, or null when none (no endpoint, OTEL_TRACES_EXPORTER=none,
 * OTEL_SDK_DISABLED=true). Throws ConfigError naming the variable for a contradiction.
 */
export function exportPlan(o: TracingOptions): ExportPlan | null {
  const c = TELEMETRY_CONFIG.resolve({ env: o.env, options: o.options });
  const ratioSampler = c.sampler === "traceidratio" || c.sampler === "parentbased_traceidratio";
  if (c.samplerArg !== undefined && !ratioSampler) {
    throw new ConfigError(
      "OTEL_TRACES_SAMPLER_ARG",
      `is the share of traces kept by traceidratio and parentbased_traceidratio; OTEL_TRACES_SAMPLER is ${c.sampler}, which takes none: unset it or choose a ratio sampler`,
    );
  }
  if (c.bspMaxExportBatchSize > c.bspMaxQueueSize) {
    throw new ConfigError("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", `${c.bspMaxExportBatchSize} is larger than OTEL_BSP_MAX_QUEUE_SIZE (${c.bspMaxQueueSize})`);
  }
  if (c.sdkDisabled || c.tracesExporter === "none" || (!c.endpoint && !c.tracesEndpoint)) return null;
  const protocol = c.tracesProtocol ?? c.protocol;
  const base = c.endpoint?.replace(/\/+$/, "");
  const url = c.tracesEndpoint ?? (protocol === "grpc" ? base! : `${base}/v1/traces`);
  const fromEnv = pairs(c.resourceAttributes, "OTEL_RESOURCE_ATTRIBUTES");
  const resource: Record<string, string | number | boolean> = {
    "service.name": o.service,
    "service.instance.id": `${hostname()}/${process.pid}`,
    "process.pid": process.pid,
    "process.runtime.name": "nodejs",
    "process.runtime.version": process.versions.node,
    ...(o.attributes ?? {}),
    ...fromEnv,
  };
  if (c.serviceName) resource["service.name"] = c.serviceName;
  return {
    url,
    protocol,
    headers: { ...pairs(c.headers, "OTEL_EXPORTER_OTLP_HEADERS"), ...pairs(c.tracesHeaders, "OTEL_EXPORTER_OTLP_TRACES_HEADERS") },
    sampler: c.sampler,
    ratio: ratioSampler ? (c.samplerArg ?? 1) : undefined,
    resource,
    timeoutMs: c.timeoutMs,
    batch: {
      scheduledDelayMillis: c.bspScheduleDelayMs,
      maxQueueSize: c.bspMaxQueueSize,
      maxExportBatchSize: c.bspMaxExportBatchSize,
      exportTimeoutMillis: c.bspExportTimeoutMs,
    },
  };
}

/**
 * Starts the SDK and registers it globally when the settings ask for export; else returns a
 * Tracing that does nothing. Throws ConfigError for a bad setting (whether or not export is on).
 */
export async function startTracing(o: TracingOptions): Promise<Tracing> {
  const plan = exportPlan(o);
  if (!plan) return OFF;
  const sdk = await import("@opentelemetry/sdk-trace-node");
  const { resourceFromAttributes } = await import("@opentelemetry/resources");
  const exporter = await makeExporter(plan);
  const ratio = plan.ratio ?? 1;
  const samplers: Record<SamplerName, () => Sampler> = {
    always_on: () => new sdk.AlwaysOnSampler(),
    always_off: () => new sdk.AlwaysOffSampler(),
    traceidratio: () => new sdk.TraceIdRatioBasedSampler(ratio),
    parentbased_always_on: () => new sdk.ParentBasedSampler({ root: new sdk.AlwaysOnSampler() }),
    parentbased_always_off: () => new sdk.ParentBasedSampler({ root: new sdk.AlwaysOffSampler() }),
    parentbased_traceidratio: () => new sdk.ParentBasedSampler({ root: new sdk.TraceIdRatioBasedSampler(ratio) }),
  };
  const processor = new sdk.BatchSpanProcessor(exporter, plan.batch);
  const provider = new sdk.NodeTracerProvider({ resource: resourceFromAttributes(plan.resource), sampler: samplers[plan.sampler](), spanProcessors: [processor] });
  provider.register();
  let stopped = false;
  return {
    enabled: true,
    description: `${plan.protocol} to ${plan.url}, sampler ${plan.sampler}${plan.ratio !== undefined ? ` ${plan.ratio}` : ""}, service ${plan.resource["service.name"]}`,
    forceFlush: () => provider.forceFlush(),
    async shutdown() {
      if (stopped) return;
      stopped = true;
      await provider.shutdown();
    },
  };
}

async function makeExporter(plan: ExportPlan) {
  const timeoutMillis = plan.timeoutMs;
  if (plan.protocol === "grpc") {
    const { OTLPTraceExporter } = await import("@opentelemetry/exporter-trace-otlp-grpc");
    const { Metadata } = await import("@grpc/grpc-js");
    const metadata = new Metadata();
    for (const [k, v] of Object.entries(plan.headers)) metadata.set(k, v);
    return new OTLPTraceExporter({ url: plan.url, metadata, timeoutMillis });
  }
  const { OTLPTraceExporter } = plan.protocol === "http/json" ? await import("@opentelemetry/exporter-trace-otlp-http") : await import("@opentelemetry/exporter-trace-otlp-proto");
  return new OTLPTraceExporter({ url: plan.url, headers: plan.headers, timeoutMillis });
}
