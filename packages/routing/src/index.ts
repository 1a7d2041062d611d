// @airm/routing: what the gateway and the endpoint picker share to choose a worker, and to know
// an InferencePool's members.
export { BlockIndex, type BlockIds } from "./block-index.ts";
export { applyEvents, blockIdOf, decodeBatch, KvEventSubscriber, kvEventOf, type KvEvent, type SubscriberOptions } from "./kv-event-subscriber.ts";
export { DISAGGREGATION_MODES, type DisaggregationMode, modeError, ROUTINGS, type Routing } from "./modes.ts";
export { promptBlockIds } from "./prompt-blocks.ts";
export {
  type Candidate,
  type Choice,
  choose,
  DEFAULT_SATURATION,
  DEFAULT_WEIGHTS,
  isSaturated,
  type Load,
  lowerIsBetter,
  type PickReason,
  type SaturationLimits,
  scores,
  type Weights,
} from "./scoring.ts";
export { decodes, type Endpoint, hostPortOf, ROLES, type Role } from "./pool/endpoint.ts";
export { ChangeListeners, type EndpointSource, sameEndpoints } from "./pool/endpoint-source.ts";
export { type Log as PoolLog, silentLog } from "./pool/log.ts";
export { INFERENCE_POOL, labelSelectorText, type PodLike, podEndpoints, podIsServing, type PoolSpec, poolSpecOf, ROLE_LABEL, roleOfPod } from "./pool/pod-endpoints.ts";
export { InferencePoolMembers, kubeApi, type PoolApi, type PoolMembersOptions, PoolUnavailableError } from "./pool/pool-members.ts";
