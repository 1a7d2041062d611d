// @airm/epp: an Envoy endpoint picker (ext_proc, as GIE v1.5.0's EPP speaks it) that picks a
// decode endpoint and, for prefill/decode disaggregation, a prefill endpoint per request from the
// endpoints' live vLLM metrics. The bin is airm-epp. The pool's members, endpoints and scores
// are @airm/routing's, which the gateway shares.
export { startEpp, type Epp, type EppOptions } from "./epp-server.ts";
export { EPP_CONFIG } from "./epp-config.ts";
export { EPP_COMMAND, main } from "./epp-cli.ts";
export { DESTINATION_HEADER, DESTINATION_NAMESPACE, PREFILLER_HEADER } from "./ext-proc-messages.ts";
export { StaticEndpoints, EndpointsFileError, EndpointsFileSchema, parseEndpointsFile, type StaticEndpointsOptions } from "./static-endpoints.ts";
export { DISAGGREGATION_MODES, Picker, PICKER_ROUTINGS, type Picked, type PickerOptions, type PickerRouting, type Refusal } from "./picker.ts";
export { PrefixEvents, type PrefixEventsOptions } from "./prefix-events.ts";
export { PrefixIndex, promptBlockHashes, type PrefixOptions } from "./prefix-index.ts";
export { MetricsScraper, isFresh, pendingPicks, type EndpointState, type ScraperOptions } from "./metrics-scraper.ts";
export { parseServerLoad, LOAD_METRICS, type ServerLoad } from "./prometheus-text.ts";
export { parseInferenceBody, BadRequestBody, type InferenceRequest } from "./request-body.ts";
export { PickingRouter, FAILURE_MODES, type FailureMode } from "./request-router.ts";
export { HealthService, SERVING_STATUS } from "./health-service.ts";
export { PROTO_DIR, protos } from "./protos.ts";
