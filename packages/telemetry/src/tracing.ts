// Starts a part's OpenTelemetry SDK when its configuration asks for export: a NodeTracerProvider
// (async-hooks context, W3C traceparent and baggage propagation) with the sampler, resource and
// batch settings of TELEMETRY_CONFIG and the OTLP exporter of the chosen protocol, over TLS for an
// https:// endpoint (tls.ts: the OTEL_EXPORTER_OTLP_* certificate variables, else AIRM_TLS_DIR).
// A failed export is logged (once per reason, then at most once a minute with counts) and its
// spans dropped; the process goes on. Without an endpoint nothing is loaded: the spans the code
// starts are the API's no-ops and cost nothing.

import { hostname } from "node:os";
import { ConfigError, isTlsError } from "@airm/rm-core";
import type { ExportResult } from "@opentelemetry/core";
import type { ReadableSpan, Sampler, SpanExporter } from "@opentelemetry/sdk-trace-node";
import { TELEMETRY_CONFIG, type OtlpProtocol, type SamplerName } from "./telemetry-config.ts";
import { type ExportTls, exportTls, tlsNotes } from "./tls.ts";

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
  /** Where export failures and start-up notes go (a pino logger fits); default: JSON lines on stderr. */
  log?: TracingLog;
}

/** The part of a logger tracing writes to (pino's signature). */
export interface TracingLog {
  info(fields: Record<string, unknown>, msg: string): void;
  warn(fields: Record<string, unknown>, msg: string): void;
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
  /** With an https:// endpoint: the CA and client certificate (undefined: plaintext, http://). */
  tls: ExportTls | undefined;
  /** TLS settings that change nothing here, said at start (tls.ts tlsNotes). */
  notes: string[];
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
  const tls = exportTls(url, c, o.env);
  return {
    url,
    protocol,
    headers: { ...pairs(c.headers, "OTEL_EXPORTER_OTLP_HEADERS"), ...pairs(c.tracesHeaders, "OTEL_EXPORTER_OTLP_TRACES_HEADERS") },
    sampler: c.sampler,
    ratio: ratioSampler ? (c.samplerArg ?? 1) : undefined,
    resource,
    timeoutMs: c.timeoutMs,
    tls,
    notes: tlsNotes(url, protocol === "grpc", c),
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
  const log = o.log ?? stderrLog;
  for (const note of plan.notes) log.warn({ url: plan.url }, note);
  const sdk = await import("@opentelemetry/sdk-trace-node");
  const { resourceFromAttributes } = await import("@opentelemetry/resources");
  const exporter = new LoggedExporter(await makeExporter(plan), plan, log);
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
    description: `${plan.protocol} to ${plan.url}${plan.tls ? `, TLS: CA ${plan.tls.caFrom}, client certificate ${plan.tls.certFrom}` : ""}, sampler ${plan.sampler}${plan.ratio !== undefined ? ` ${plan.ratio}` : ""}, service ${plan.resource["service.name"]}`,
    forceFlush: () => provider.forceFlush(),
    async shutdown() {
      if (stopped) return;
      stopped = true;
      await provider.shutdown();
    },
  };
}

/**
 * The OTLP exporter of the plan's protocol. Its transport security is always given here (the
 * exporters would otherwise read the OTEL_EXPORTER_OTLP_* TLS variables from process.env
 * themselves, and only warn about a bad file): grpc gets insecure credentials for http:// and
 * createSsl(ca, key, cert) for https://; the HTTP protocols get the node agent's options.
 */
async function makeExporter(plan: ExportPlan): Promise<SpanExporter> {
  const timeoutMillis = plan.timeoutMs;
  const tls = plan.tls;
  if (plan.protocol === "grpc") {
    const { OTLPTraceExporter } = await import("@opentelemetry/exporter-trace-otlp-grpc");
    const { credentials, Metadata } = await import("@grpc/grpc-js");
    const metadata = new Metadata();
    for (const [k, v] of Object.entries(plan.headers)) metadata.set(k, v);
    const creds = tls ? credentials.createSsl(tls.ca ?? null, tls.key ?? null, tls.cert ?? null) : credentials.createInsecure();
    return new OTLPTraceExporter({ url: plan.url, metadata, timeoutMillis, credentials: creds });
  }
  const { OTLPTraceExporter } = plan.protocol === "http/json" ? await import("@opentelemetry/exporter-trace-otlp-http") : await import("@opentelemetry/exporter-trace-otlp-proto");
  const httpAgentOptions = tls ? { keepAlive: true, minVersion: "TLSv1.2" as const, ca: tls.ca, cert: tls.cert, key: tls.key } : { keepAlive: true };
  return new OTLPTraceExporter({ url: plan.url, headers: plan.headers, timeoutMillis, httpAgentOptions });
}

/** pino's shape of a log line (level 30 info, 40 warn), on stderr, for a part that passes no logger. */
const stderrLog: TracingLog = {
  info: (fields, msg) => writeLine(30, fields, msg),
  warn: (fields, msg) => writeLine(40, fields, msg),
};

function writeLine(level: number, fields: Record<string, unknown>, msg: string): void {
  process.stderr.write(`${JSON.stringify({ level, time: Date.now(), pid: process.pid, hostname: hostname(), name: "airm-telemetry", ...fields, msg })}\n`);
}

/** How often the same export failure is logged again (with the counts since the last line). */
const REPEAT_LOG_MS = 60_000;

/** The error of a failed export as one line, and whether it is a TLS refusal. */
function reasonOf(error: Error | undefined): { reason: string; tls: boolean } {
  if (!error) return { reason: "export failed", tls: false };
  const code = (error as NodeJS.ErrnoException).code;
  // OpenSSL's "<id>:error:<code>:SSL routines:<function>:<reason>:<source file>:<line>:SSL alert number <n>" as its reason.
  const message = error.message.split("\n")[0].replace(/[0-9A-F]+:error:[0-9A-F]+:SSL routines:[^:]*:([^:]+):[^:\s]*:\d+:(?:SSL alert number \d+)?/g, "$1");
  const text = `${typeof code === "string" ? `${code}: ` : ""}${message}`;
  return { reason: text, tls: isTlsError(error) || /SSL routines|certificate|handshake|\bTLS\b/i.test(error.message) };
}

/**
 * The exporter with its failures logged: the first of each reason at once, the same one again at
 * most once a minute (with how many exports and spans failed since), the recovery once. The
 * batch span processor drops the spans of a failed export; nothing here throws.
 */
class LoggedExporter implements SpanExporter {
  private last: string | undefined;
  private lastAt = 0;
  private failed = 0;
  private dropped = 0;

  constructor(
    private readonly inner: SpanExporter,
    private readonly plan: ExportPlan,
    private readonly log: TracingLog,
  ) {}

  export(spans: ReadableSpan[], done: (r: ExportResult) => void): void {
    this.inner.export(spans, (r) => {
      try {
        this.note(r, spans.length);
      } catch {
        // a logger that throws must not stop the export's callback
      }
      done(r);
    });
  }

  private note(r: ExportResult, n: number): void {
    const where = { url: this.plan.url, protocol: this.plan.protocol };
    if (r.code === 0 /* ExportResultCode.SUCCESS (core is not loaded until export is on) */) {
      if (this.last !== undefined) this.log.info({ ...where, failed_exports: this.failed, dropped_spans: this.dropped }, "trace export recovered");
      this.last = undefined;
      this.failed = this.dropped = 0;
      return;
    }
    this.failed++;
    this.dropped += n;
    const { reason, tls } = reasonOf(r.error);
    const now = Date.now();
    if (reason === this.last && now - this.lastAt < REPEAT_LOG_MS) return;
    const hint = tls ? " (a TLS failure: the collector refused this client's certificate, or this client the collector's; see docs/tls.md)" : "";
    this.log.warn({ ...where, err: reason, failed_exports: this.failed, dropped_spans: this.dropped }, `trace export failed, spans dropped: ${reason}${hint}`);
    this.last = reason;
    this.lastAt = now;
    this.failed = this.dropped = 0;
  }

  shutdown(): Promise<void> {
    return this.inner.shutdown();
  }

  forceFlush(): Promise<void> {
    return this.inner.forceFlush?.() ?? Promise.resolve();
  }
}
