export { SAMPLERS, TELEMETRY_CONFIG, type OtlpProtocol, type SamplerName } from "./telemetry-config.ts";
export { exportPlan, startTracing, type ExportPlan, type TelemetryValues, type Tracing, type TracingLog, type TracingOptions } from "./tracing.ts";
export { exportTls, type ExportTls } from "./tls.ts";
