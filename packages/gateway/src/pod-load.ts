// The load a gateway reports for its pod as the vllm:* gauges an endpoint picker scores
// (docs/llm-d.md): the requests from what this gateway holds right now (no scrape lag), the KV
// from what its decode (or solo) workers last reported in /health.
//   running  = min(streaming, slots)
//   waiting  = before-first + max(0, streaming - slots)
//   KV usage = sum of used blocks / sum of blocks over the decode (or solo) endpoints
// where streaming counts requests past their first token, before-first those queued or in
// prefill (the prefill worker's load shows here), and slots is the sum over the decode (or solo)
// endpoints of the requests each runs at once (max_num_seqs; 1 until it has reported).

import type { CacheGeometry, ServingLoad } from "@airm/internal-api";
import type { EndpointPool } from "./endpoint-pool.ts";

export function decodeSlots(pool: EndpointPool): number {
  return pool.endpoints.reduce((a, e) => a + (e.health?.requests.slots ?? 1), 0);
}

/** The decode (or solo) endpoints' KV blocks, used and in all, from their last /health (null before any reported). */
export function podBlocks(pool: EndpointPool): { blockSize: number; used: number; total: number } | null {
  let used = 0;
  let total = 0;
  let blockSize = 0;
  for (const e of pool.endpoints) {
    const kv = e.health?.kvCache;
    if (!kv) continue;
    used += kv.usedBlocks;
    total += kv.totalBlocks;
    blockSize = kv.blockSize;
  }
  return total > 0 ? { blockSize, used, total } : null;
}

export function podLoad(inFlight: { beforeFirst: number; streaming: number }, slots: number, blocks: { used: number; total: number } | null): ServingLoad {
  const running = Math.min(inFlight.streaming, slots);
  return { running, waiting: inFlight.beforeFirst + (inFlight.streaming - running), kvUsage: blocks ? blocks.used / blocks.total : 0 };
}

/**
 * The pod's LoRA adapters for vllm:lora_requests_info: those its decode (or solo) workers have
 * loaded, as active (running_lora_adapters: the inference extension's protocol reads it as the
 * adapters a server has loaded and can serve), and the smallest max_lora; undefined when they
 * serve none.
 */
export function podLora(pool: EndpointPool): ServingLoad["lora"] {
  const withLora = pool.endpoints.map((e) => e.health?.lora).filter((l) => l !== undefined);
  if (withLora.length === 0) return undefined;
  const names = new Set(withLora.flatMap((l) => l.adapters.map((a) => a.name)));
  return { maxLoras: Math.min(...withLora.map((l) => l.maxLoras)), running: [...names], waiting: [] };
}

/** The pod's KV geometry: the decode (or solo) endpoints' blocks (null before any reported). */
export function podGeometry(pool: EndpointPool): CacheGeometry | null {
  const b = podBlocks(pool);
  return b ? { blockSize: b.blockSize, numBlocks: b.total } : null;
}
