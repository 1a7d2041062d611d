// The mode names the gateway and the endpoint picker share: how a worker is chosen among equals
// of one role (routing), and whether a decode worker's request gets a prefill worker
// (disaggregation). A part given a mode it has no use for refuses it by name (modeError).

import { ConfigError } from "@airm/rm-core";

/**
 * prefix (default): a score of load and the prompt's prefix already held by the worker, the
 * prefix read from the KV block index that the workers' KV events feed (precise: the same block
 * hashes the workers keep). approx-prefix: the endpoint picker's older rule, the prompt text's
 * first characters hashed, remembering which pod took them last (no events needed). load: the
 * least loaded. random: any, uniformly (a baseline).
 */
export const ROUTINGS = ["prefix", "approx-prefix", "load", "random"] as const;
export type Routing = (typeof ROUTINGS)[number];

/**
 * auto (default): the measured decision (rm-core's decideDisaggregation) for a decode worker that
 * also prefills; always: every request ships its KV from a prefill worker; never: every request
 * runs whole on its decode worker; header: llm-d's sidecar rule, a gateway behind a picker ships
 * when the picker named a prefill worker (x-prefiller-host-port); prompt-length: prompts estimated
 * at most a set number of tokens stay on their decode worker.
 */
export const DISAGGREGATION_MODES = ["auto", "always", "never", "header", "prompt-length"] as const;
export type DisaggregationMode = (typeof DISAGGREGATION_MODES)[number];

/** The ConfigError for a shared mode name that this part (`who`) does not apply, and why. */
export function modeError(flag: string, mode: string, who: string, why: string): ConfigError {
  return new ConfigError(flag, `${mode} is not a mode of ${who}: ${why}`);
}
