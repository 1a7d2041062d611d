// Where a PD gateway runs a request that no endpoint picker placed: ship its KV from a prefill
// worker (PD), or run it whole on the decode worker (local: the worker was started with
// --local-prefill). The arithmetic is rm-core's decideDisaggregation; its inputs are what the
// workers measured on their own requests and report in /health (`estimates`), which the pools'
// probes keep.

import type { PromptInput, WorkerEstimates } from "@airm/internal-api";
import type { DisaggregationMode as DisaggregationModeName } from "@airm/routing";
import { decideDisaggregation, estimateTokens, type DisaggregationDecision } from "@airm/rm-core";
import type { EndpointPool } from "../endpoint-pool.ts";

/**
 * The shared mode names (@airm/routing) a gateway applies. auto: an endpoint picker's
 * x-prefiller-host-port wins; without it, the measured decision. always: every request ships its
 * KV. never: every request runs whole on the decode worker (a baseline). header: llm-d's sidecar
 * rule (the header ships, its absence runs locally). prompt-length is the endpoint picker's.
 */
export const DISAGGREGATION_MODES = ["auto", "always", "never", "header"] as const satisfies readonly DisaggregationModeName[];
export type DisaggregationMode = (typeof DISAGGREGATION_MODES)[number];

export type PathReason = DisaggregationDecision["reason"] | "header" | "forced";

export interface PathChoice {
  local: boolean;
  reason: PathReason;
  decision?: DisaggregationDecision;
  promptTokens?: number;
}

/** The prompt's tokens as the decision estimates them: token ids as they are, text at 4 characters a token. */
export function promptTokensOf(input: PromptInput): number {
  if ("promptTokenIds" in input) return input.promptTokenIds.length;
  if ("prompt" in input) return estimateTokens(input.prompt.length);
  // chat: the contents, and a few template tokens per turn
  return input.messages.reduce((a, m) => a + estimateTokens(m.content.length) + 4, 0);
}

/** The estimates of the healthy endpoint the pool would pick next (fewest outstanding), or null. */
export function estimatesOf(pool: EndpointPool | undefined): WorkerEstimates | null {
  const healthy = (pool?.endpoints ?? []).filter((e) => e.healthy && e.health?.estimates);
  if (!healthy.length) return null;
  const least = healthy.reduce((a, e) => (e.outstanding < a.outstanding ? e : a));
  return least.health!.estimates!;
}

/**
 * The path of a request without a placement. `localPath`: the decode workers prefill whole
 * requests (--local-prefill); without it every request ships its KV. `heldTokens`: prompt
 * positions a decode worker holds already (prefix routing's index), which neither cross nor
 * are computed on the local path.
 */
export function choosePath(
  mode: DisaggregationMode,
  localPath: boolean,
  placed: boolean,
  input: PromptInput,
  pools: { prefill?: EndpointPool; decode?: EndpointPool },
  heldTokens = 0,
): PathChoice {
  if (!localPath || mode === "always") return { local: false, reason: placed ? "header" : "forced" };
  if (mode === "never") return { local: true, reason: "forced" };
  if (placed) return { local: false, reason: "header" };
  if (mode === "header") return { local: true, reason: "header" };
  const dec = estimatesOf(pools.decode);
  const pre = estimatesOf(pools.prefill);
  const promptTokens = promptTokensOf(input);
  const decision = decideDisaggregation({
    promptTokens,
    bandwidth: dec?.kvBandwidth ?? null,
    kvBytes: dec?.kvBytes ?? null,
    kvBytesPerToken: dec?.kvBytesPerToken ?? null,
    remote: pre?.prefill ?? null,
    local: dec?.prefill ?? null,
    heldTokens,
  });
  return { local: !decision.ship, reason: decision.reason, decision, promptTokens };
}
