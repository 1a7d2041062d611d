// @airm/routing: what the gateway and the endpoint picker share to choose a worker.
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
