// @airm/gateway: the OpenAI-compatible front door (hono) that runs each request through a
// prefill and a decode worker (or a solo worker), with balancing, metrics and traces.
export { startGateway, type GatewayOptions, type RunningGateway } from "./gateway-server.ts";
export { createGatewayApp, type GatewayAppOptions } from "./app.ts";
export { GATEWAY_CONFIG, type GatewayConfig } from "./gateway-config.ts";
export { GATEWAY_COMMAND } from "./cli.ts";
export { Orchestrator, newRequestId, type GenEvent, type OrchestratorOptions } from "./orchestrator/index.ts";
export { DRAINING_RETRIES, EndpointPool, type Endpoint } from "./endpoint-pool.ts";
export { parseGenerationRequest } from "./openai/parse.ts";
export { type GenerationRequest, MAX_TOKENS_CEILING } from "./openai/request-common.ts";
export { REQUEST_FIELDS, requestFieldTable, type RequestField } from "./openai/request-fields.ts";
export { GatewayMetrics, quantile, WINDOW, type RequestRecord } from "./gateway-metrics.ts";
