// @airm/internal-api: the gateway <-> worker contract (zod schemas and inferred types), the one
// API error type, the NDJSON framing, a typed worker client and its mutual-TLS dispatcher.
// docs/internal-api.md is checked against these schemas by a test.
export * from "./schemas.ts";
export { ApiError, ErrorBodySchema, OverloadedError, toApiError, invalidRequest, type ErrorBody } from "./api-error.ts";
export { WorkerClient, WorkerEventStream, keepIdleConnections, ROUTES, NDJSON, encodeEvent, readEvents, StreamIdleError, type CallOptions } from "./worker-client.ts";
export { tlsDispatcher, fetchVia } from "./tls-dispatcher.ts";
export { schemaTables, INTERNAL_API_SCHEMAS } from "./schema-docs.ts";
export { registerPrefixCacheInfo, registerVllmGauges, type PrefixCacheInfo, type ServingLoad, type CacheGeometry } from "./vllm-metrics.ts";
