// The load a gateway reports for its pod as the vllm:* gauges an endpoint picker scores
// (docs/llm-d.md): from the requests this gateway holds right now (no scrape lag) and the batch
// width its decode (or solo) workers last reported.
//   running  = min(streaming, slots)
//   waiting  = before-first + max(0, streaming - slots)
//   KV usage = running / slots
// where streaming counts requests past their first token, before-first those queued or in
// prefill (the prefill worker's load shows here), and slots is the sum over the decode (or solo)
// endpoints of the batch width each reported in /health (1 until it has). Each slot holds one
// request's full-context KV, so KV usage is the share of the KV the pod will admit.

import { slotGeometry, type CacheGeometry, type ServingLoad } from "@airm/internal-api";
import type { EndpointPool } from "./endpoint-pool.ts";

export function decodeSlots(pool: EndpointPool): number {
  return pool.endpoints.reduce((a, e) => a + (e.health?.requests.slots ?? 1), 0);
}

export function podLoad(inFlight: { beforeFirst: number; streaming: number }, slots: number): ServingLoad {
  const running = Math.min(inFlight.streaming, slots);
  return { running, waiting: inFlight.beforeFirst + (inFlight.streaming - running), kvUsage: slots > 0 ? running / slots : 0 };
}

/** The pod's KV geometry: its slots at the largest context the workers reported (null before any did). */
export function podGeometry(pool: EndpointPool): CacheGeometry | null {
  const ctx = pool.served().maxContext;
  return ctx === undefined ? null : slotGeometry(decodeSlots(pool), ctx);
}
