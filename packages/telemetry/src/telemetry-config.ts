// What configures trace export: the OpenTelemetry specification's own variables (the names every
// OpenTelemetry SDK, vLLM's and llm-d's included, reads), declared here so that they are parsed,
// checked and documented like every other setting, and passed to the SDK explicitly (the exporters'
// own reading of process.env is overridden). Export is off unless an OTLP endpoint is set. TLS to
// the collector follows the endpoint's scheme; with https:// the CA and client certificate default
// to AIRM_TLS_DIR's files (tracing.ts, tls.ts).

import { defineConfig, flag, int, list, num, oneOf, opt, text } from "@airm/rm-core";

const PROTOCOLS = ["http/protobuf", "http/json", "grpc"] as const;
export type OtlpProtocol = (typeof PROTOCOLS)[number];

export const SAMPLERS = ["always_on", "always_off", "traceidratio", "parentbased_always_on", "parentbased_always_off", "parentbased_traceidratio"] as const;
export type SamplerName = (typeof SAMPLERS)[number];

const url = text({ label: "url", pattern: /^https?:\/\/[^\s/]+(\/\S*)?$/, hint: "an http:// or https:// URL, e.g. http://otel-collector:4318" });
/** A file, absolute or relative to the working directory. */
const path = text({ label: "path" });
/** `key=value`, the value percent-encoded (the specification's W3C-baggage-like format). */
const pair = text({ label: "key=value", pattern: /^[^=\s,]+=[^,]*$/, hint: "key=value (the value percent-encoded)" });

export const TELEMETRY_CONFIG = defineConfig("@airm/telemetry", {
  sdkDisabled: opt(flag(), {
    env: "OTEL_SDK_DISABLED",
    default: false,
    doc: "true turns trace export off even with an endpoint set.",
  }),
  tracesExporter: opt(oneOf(["otlp", "none"] as const), {
    env: "OTEL_TRACES_EXPORTER",
    default: "otlp",
    doc: "otlp exports spans once an endpoint is set; none turns export off. Other exporters (console, zipkin) are refused.",
  }),
  endpoint: opt(url, {
    env: "OTEL_EXPORTER_OTLP_ENDPOINT",
    defaultText: "unset: no export",
    doc: "The OTLP receiver (a collector, Jaeger, Tempo): http(s)://host:4318 for the HTTP protocols (spans go to its /v1/traces), host:4317 with http(s):// for grpc. Setting it (or the traces endpoint) turns export on.",
  }),
  tracesEndpoint: opt(url, {
    env: "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
    defaultText: "unset: OTEL_EXPORTER_OTLP_ENDPOINT + /v1/traces",
    doc: "The full URL spans are sent to (used as is); wins over OTEL_EXPORTER_OTLP_ENDPOINT.",
  }),
  protocol: opt(oneOf(PROTOCOLS), {
    env: "OTEL_EXPORTER_OTLP_PROTOCOL",
    default: "http/protobuf",
    doc: "The OTLP encoding and transport: http/protobuf, http/json or grpc.",
  }),
  tracesProtocol: opt(oneOf(PROTOCOLS), {
    env: "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
    defaultText: "OTEL_EXPORTER_OTLP_PROTOCOL",
    doc: "The protocol for spans; wins over OTEL_EXPORTER_OTLP_PROTOCOL.",
  }),
  headers: opt(list(pair), {
    env: "OTEL_EXPORTER_OTLP_HEADERS",
    defaultText: "none",
    doc: "Headers sent with each export, key=value pairs separated by commas, values percent-encoded (e.g. an API key of a hosted backend).",
  }),
  tracesHeaders: opt(list(pair), {
    env: "OTEL_EXPORTER_OTLP_TRACES_HEADERS",
    defaultText: "none",
    doc: "Headers for span exports, added to (and winning over) OTEL_EXPORTER_OTLP_HEADERS.",
  }),
  certificate: opt(path, {
    env: "OTEL_EXPORTER_OTLP_CERTIFICATE",
    defaultText: "ca.crt of AIRM_TLS_DIR, else the system's CAs",
    doc: "A PEM file of the CA certificate(s) that verify the collector's certificate (chain and host name) on an https:// endpoint, every protocol, instead of the system's CAs; wins over ca.crt of AIRM_TLS_DIR. Not read with an http:// endpoint. A missing or non-PEM file stops the part at start.",
  }),
  tracesCertificate: opt(path, {
    env: "OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE",
    defaultText: "OTEL_EXPORTER_OTLP_CERTIFICATE",
    doc: "The CA file for span exports; wins over OTEL_EXPORTER_OTLP_CERTIFICATE.",
  }),
  clientCertificate: opt(path, {
    env: "OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE",
    defaultText: "tls.crt of AIRM_TLS_DIR, else none",
    doc: "A PEM file of the certificate (intermediates may follow it) presented to a collector that asks for one (mutual TLS) on an https:// endpoint; set with OTEL_EXPORTER_OTLP_CLIENT_KEY, and the pair wins over tls.crt and tls.key of AIRM_TLS_DIR. A missing, non-PEM or expired file, or a key that is not its key, stops the part at start.",
  }),
  tracesClientCertificate: opt(path, {
    env: "OTEL_EXPORTER_OTLP_TRACES_CLIENT_CERTIFICATE",
    defaultText: "OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE",
    doc: "The client certificate for span exports; wins over OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE.",
  }),
  clientKey: opt(path, {
    env: "OTEL_EXPORTER_OTLP_CLIENT_KEY",
    defaultText: "tls.key of AIRM_TLS_DIR, else none",
    doc: "A PEM file of the private key of the client certificate; set with OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE.",
  }),
  tracesClientKey: opt(path, {
    env: "OTEL_EXPORTER_OTLP_TRACES_CLIENT_KEY",
    defaultText: "OTEL_EXPORTER_OTLP_CLIENT_KEY",
    doc: "The client key for span exports; wins over OTEL_EXPORTER_OTLP_CLIENT_KEY.",
  }),
  insecure: opt(flag(), {
    env: "OTEL_EXPORTER_OTLP_INSECURE",
    defaultText: "0",
    doc: "The specification's switch for a grpc endpoint given without a scheme. Every endpoint here has one, and the scheme decides (http:// plaintext, https:// TLS, as the specification says it takes precedence), so it changes nothing: 1 with an https:// grpc endpoint is logged at start as ignored.",
  }),
  tracesInsecure: opt(flag(), {
    env: "OTEL_EXPORTER_OTLP_TRACES_INSECURE",
    defaultText: "OTEL_EXPORTER_OTLP_INSECURE",
    doc: "The same for span exports; wins over OTEL_EXPORTER_OTLP_INSECURE.",
  }),
  timeoutMs: opt(int({ min: 1 }), {
    env: "OTEL_EXPORTER_OTLP_TIMEOUT",
    default: 10_000,
    doc: "How long one export may take (ms); a batch that takes longer is dropped and counted by the SDK, never retried forever.",
  }),
  serviceName: opt(text({ label: "name" }), {
    env: "OTEL_SERVICE_NAME",
    defaultText: "the part: airm-gateway, airm-worker",
    doc: "The service.name resource attribute of every span the process exports (wins over service.name in OTEL_RESOURCE_ATTRIBUTES). The part's role is in airm.role either way.",
  }),
  resourceAttributes: opt(list(pair), {
    env: "OTEL_RESOURCE_ATTRIBUTES",
    defaultText: "none",
    doc: "More resource attributes, key=value pairs separated by commas, values percent-encoded (e.g. deployment.environment.name=prod,k8s.pod.name=...).",
  }),
  sampler: opt(oneOf(SAMPLERS), {
    env: "OTEL_TRACES_SAMPLER",
    default: "parentbased_always_on",
    doc: "Which traces are kept: always_on, always_off, traceidratio (a share of trace ids), or the parentbased_ forms, which follow the caller's sampled flag in traceparent when there is one. Workers follow the gateway's decision with the default.",
  }),
  samplerArg: opt(num({ min: 0, max: 1 }), {
    env: "OTEL_TRACES_SAMPLER_ARG",
    defaultText: "1 for the ratio samplers",
    doc: "The share of traces kept by traceidratio and parentbased_traceidratio (0..1); refused with another sampler.",
  }),
  bspScheduleDelayMs: opt(int({ min: 1 }), {
    env: "OTEL_BSP_SCHEDULE_DELAY",
    default: 1000,
    doc: "How often the batch span processor exports (ms). 1 s rather than the specification's 5 s: a trace is visible soon after its request.",
  }),
  bspMaxQueueSize: opt(int({ min: 1 }), {
    env: "OTEL_BSP_MAX_QUEUE_SIZE",
    default: 2048,
    doc: "Finished spans held for export; past it new spans are dropped (the request is never slowed by a slow collector).",
  }),
  bspMaxExportBatchSize: opt(int({ min: 1 }), {
    env: "OTEL_BSP_MAX_EXPORT_BATCH_SIZE",
    default: 512,
    doc: "Most spans in one export (at most OTEL_BSP_MAX_QUEUE_SIZE).",
  }),
  bspExportTimeoutMs: opt(int({ min: 1 }), {
    env: "OTEL_BSP_EXPORT_TIMEOUT",
    default: 30_000,
    doc: "How long the batch span processor waits for one export (ms).",
  }),
});
