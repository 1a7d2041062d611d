// @airm/gateway: the OpenAI-compatible front door (hono) that runs each request through a
// prefill and a decode worker (or a solo worker), with balancing, metrics and traces.
export { startGateway, type GatewayOptions, type RunningGateway } from "./gateway-server.ts";
export { createGatewayApp, type GatewayAppOptions } from "./gateway-app.ts";
export { Orchestrator, newRequestId, type GenEvent, type OrchestratorOptions } from "./pd-orchestrator.ts";
export { EndpointPool, type Endpoint, type WorkerHealth } from "./endpoint-pool.ts";
export { parseGenerationRequest, type GenerationRequest, type PromptInput, MAX_TOKENS_CEILING } from "./openai-requests.ts";
export { ApiError } from "./openai-errors.ts";
export { StopStringFilter } from "./stop-strings.ts";
export { GatewayMetrics, quantile, WINDOW, type RequestRecord } from "./gateway-metrics.ts";
