// @airm/epp: an Envoy endpoint picker (ext_proc, as GIE v1.5.0's EPP speaks it) that picks a
// decode endpoint and, for prefill/decode disaggregation, a prefill endpoint per request from the
// endpoints' live vLLM metrics. The bin is airm-epp; the pool watcher is reusable on its own.
export { startEpp, type Epp, type EppOptions } from "./epp-server.ts";
export { EPP_CONFIG } from "./epp-config.ts";
export { EPP_COMMAND, main } from "./epp-cli.ts";
export { DESTINATION_HEADER, DESTINATION_NAMESPACE, PREFILLER_HEADER, ROLES, decodes, hostPortOf, type Endpoint, type Role } from "./endpoint.ts";
export type { EndpointSource } from "./endpoint-source.ts";
export { StaticEndpoints, EndpointsFileError, EndpointsFileSchema, parseEndpointsFile, type StaticEndpointsOptions } from "./static-endpoints.ts";
export { InferencePoolMembers, PoolUnavailableError, kubeApi, type PoolApi, type PoolMembersOptions } from "./pool-members.ts";
export { ROLE_LABEL, INFERENCE_POOL, podEndpoints, podIsServing, roleOfPod, poolSpecOf, labelSelectorText, type PodLike, type PoolSpec } from "./pod-endpoints.ts";
export { DISAGGREGATION_MODES, Picker, PICKER_ROUTINGS, type Picked, type PickerOptions, type PickerRouting, type Refusal } from "./picker.ts";
export { PrefixEvents, type PrefixEventsOptions } from "./prefix-events.ts";
export {
  DEFAULT_SATURATION,
  DEFAULT_WEIGHTS,
  choose,
  isSaturated,
  lowerIsBetter,
  scores,
  type Candidate,
  type PickReason,
  type SaturationLimits,
  type Weights,
} from "@airm/routing";
export { PrefixIndex, promptBlockHashes, type PrefixOptions } from "./prefix-index.ts";
export { MetricsScraper, isFresh, pendingPicks, type EndpointState, type ScraperOptions } from "./metrics-scraper.ts";
export { parseServerLoad, LOAD_METRICS, type ServerLoad } from "./prometheus-text.ts";
export { parseInferenceBody, BadRequestBody, type InferenceRequest } from "./request-body.ts";
export { PickingRouter, FAILURE_MODES, type FailureMode } from "./request-router.ts";
export { HealthService, SERVING_STATUS } from "./health-service.ts";
export { PROTO_DIR, protos } from "./protos.ts";
