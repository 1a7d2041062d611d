export { SAMPLERS, TELEMETRY_CONFIG, type OtlpProtocol, type SamplerName } from "./telemetry-config.ts";
export { exportPlan, startTracing, type ExportPlan, type TelemetryValues, type Tracing, type TracingOptions } from "./tracing.ts";
