// The worker's Prometheus figures (prom-client): the vllm:* gauges a stock llm-d endpoint picker
// scores, and airm_* timings, lease and request counters. Values are pulled from the worker's
// live state at scrape time; timings are observed by the routes.

import { Counter, Gauge, Histogram, Registry, collectDefaultMetrics } from "prom-client";
import { registerPrefixCacheInfo, registerVllmGauges, type CacheGeometry, type PrefixCacheInfo } from "@airm/internal-api";
import type { GrammarEngineStats } from "@airm/grammar";
import type { WorkerEstimates } from "@airm/internal-api";
import { DRAINING_GAUGE, ESTIMATE_GAUGES } from "@airm/rm-core";
import type { LeaseCounters } from "./kv-leases.ts";

export interface WorkerState {
  waiting(): number;
  running(): number;
  /** Share of the KV cache's blocks in use, 0-1. */
  kvUsage(): number;
  /** KV geometry (block size, blocks), null while loading. */
  geometry(): CacheGeometry | null;
  /** Streams preempted so far (their blocks taken back, their KV recomputed). */
  preemptions(): number;
  leases(): LeaseCounters;
  /** The engine's prompt-prefix reuse in tokens (queried: prompt tokens of prefills that looked; hit: tokens reused), when it has one. */
  prefixCache(): {
    queriedTokens: number;
    hitTokens: number;
    blocks: number;
    evictions: number;
    heldPositions: number;
    kvSkippedBytes: number;
    kvPulledBytes: number;
    kvPulls: number;
    eventBatches: number;
    events: number;
  } | null;
  /** The grammar engine's work (structured outputs), null while loading or without one. */
  grammar(): GrammarEngineStats | null;
  /** The disaggregation decision's inputs measured here. */
  estimates(): WorkerEstimates;
  /** How its blocks are named, and its process (null while loading or with prefix caching off). */
  prefixInfo(): PrefixCacheInfo | null;
  /** It drains (a signal or POST /internal/drain): it admits nothing new. */
  draining(): boolean;
  /** The resident limit and the adapters of running and waiting requests (undefined: no adapters served). */
  lora(): { maxLoras: number; running: string[]; waiting: string[] } | undefined;
}

const MS_BUCKETS = [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 30000, 60000];

export class WorkerMetrics {
  readonly registry = new Registry();
  readonly prefillMs: Histogram;
  readonly decodeMs: Histogram;
  readonly kvPushMs: Histogram;
  readonly kvLoadMs: Histogram;
  readonly decodeBatch: Histogram;
  readonly requests: Counter<"route" | "outcome">;
  readonly leaseEnds: Counter<"reason">;
  /** vLLM's: prompt tokens this worker prefilled (each request's whole prompt, cached tokens included). */
  readonly promptTokens: Counter;
  /** vLLM's: tokens this worker generated (a prefill's first tokens, then each decode step's). */
  readonly generationTokens: Counter;
  /** prefill role: KV bytes pushed into the transport (each request's blobs as they crossed; held blocks do not). */
  readonly kvPushedBytes: Counter;

  constructor(state: WorkerState, labels: Record<string, string>) {
    this.registry.setDefaultLabels(labels);
    collectDefaultMetrics({ register: this.registry });
    const r = [this.registry];
    registerVllmGauges(this.registry, () => ({ waiting: state.waiting(), running: state.running(), kvUsage: state.kvUsage(), lora: state.lora() }), state.geometry);
    registerPrefixCacheInfo(this.registry, state.prefixInfo);
    new Gauge({
      name: DRAINING_GAUGE,
      help: "1 while this worker drains (it admits no new request: 503 worker_draining), else 0",
      registers: r,
      collect() {
        this.set(state.draining() ? 1 : 0);
      },
    });
    new Counter({
      name: "vllm:num_preemptions_total",
      help: "streams preempted: their KV blocks taken back for older streams when the cache ran out, their KV recomputed later",
      registers: r,
      collect() {
        this.reset();
        this.inc(state.preemptions());
      },
    });
    new Gauge({
      name: "airm_kv_leases_outstanding",
      help: "KV leases open on this worker",
      registers: r,
      collect() {
        this.set(state.leases().outstanding);
      },
    });
    new Counter({
      name: "airm_kv_leases_expired_total",
      help: "KV leases that reached their TTL and were released by expiry",
      registers: r,
      collect() {
        this.reset();
        this.inc(state.leases().expired);
      },
    });
    registerPrefixCacheMetrics(r, state);
    const grammarCounter = (name: string, help: string, value: (g: GrammarEngineStats) => number) =>
      new Counter({
        name,
        help,
        registers: r,
        collect() {
          this.reset();
          const g = state.grammar();
          if (g) this.inc(value(g));
        },
      });
    grammarCounter("airm_grammar_compiles_total", "structured-output grammars compiled (a cached one is not counted)", (g) => g.compiles);
    grammarCounter("airm_grammar_compile_seconds_total", "time the grammar thread spent compiling them", (g) => g.compileMs / 1000);
    grammarCounter("airm_grammar_masks_total", "token masks the sampler applied (one per constrained token)", (g) => g.masks);
    grammarCounter("airm_grammar_mask_seconds_total", "time the grammar thread spent computing those masks (while the forward pass ran)", (g) => g.maskFillUs / 1e6);
    grammarCounter("airm_grammar_mask_wait_seconds_total", "time samplers waited for a mask that was not ready: what constraints added to decode steps", (g) => g.maskWaitUs / 1e6);
    const estimate = (name: string, help: string, read: (e: WorkerEstimates) => number | null | undefined) =>
      new Gauge({
        name,
        help,
        registers: r,
        collect() {
          this.set(read(state.estimates()) ?? Number.NaN);
        },
      });
    estimate(ESTIMATE_GAUGES.kvBandwidth, "decode: bytes/s of this worker's KV pulls while the bytes moved (EWMA; NaN until its first PD request)", (e) => e.kvBandwidth);
    estimate(ESTIMATE_GAUGES.kvBytes, "decode: KV bytes per request received, the prompt's blocks (EWMA; NaN until its first PD request)", (e) => e.kvBytes);
    estimate(
      ESTIMATE_GAUGES.kvBytesPerToken,
      "decode: KV bytes received per prompt token, block rounding included (EWMA; NaN until its first PD request)",
      (e) => e.kvBytesPerToken,
    );
    estimate(ESTIMATE_GAUGES.prefillFixed, "this worker's prefill time model: fixed part (s; least squares over its last 64 prefills, NaN before the first)", (e) =>
      e.prefill ? e.prefill.fixedMs / 1000 : null,
    );
    estimate(ESTIMATE_GAUGES.prefillPerToken, "this worker's prefill time model: seconds per computed prompt token (NaN before the first prefill)", (e) =>
      e.prefill ? e.prefill.msPerToken / 1000 : null,
    );
    estimate(ESTIMATE_GAUGES.localPrefill, "1 when this decode worker also prefills whole requests (--local-prefill): both paths exist", (e) => (e.localPrefill ? 1 : 0));
    this.leaseEnds = new Counter({ name: "airm_kv_leases_released_total", help: "KV leases ended, by reason", labelNames: ["reason"], registers: r });
    this.kvPushedBytes = new Counter({
      name: "airm_kv_pushed_bytes_total",
      help: "prefill role: KV bytes pushed into the transport (every handoff's blobs; blocks decode held do not cross)",
      registers: r,
    });
    this.promptTokens = new Counter({
      name: "vllm:prompt_tokens_total",
      help: "prompt tokens prefilled here (each request's whole prompt, prefix-cache hits included; a PD decode worker prefills none)",
      registers: r,
    });
    this.generationTokens = new Counter({
      name: "vllm:generation_tokens_total",
      help: "tokens generated here: a prefill's first token of each choice, then one per stream per decode step (an end-of-sequence token included)",
      registers: r,
    });
    this.decodeBatch = new Histogram({
      name: "airm_worker_decode_batch_size",
      help: "streams per engine decode step (continuous batching: running requests step together)",
      buckets: [1, 2, 4, 8, 16, 32, 64],
      registers: r,
    });
    this.prefillMs = new Histogram({ name: "airm_worker_prefill_ms", help: "engine prefill time per request (ms)", buckets: MS_BUCKETS, registers: r });
    this.decodeMs = new Histogram({ name: "airm_worker_decode_ms", help: "decode time per request after the KV import (ms)", buckets: MS_BUCKETS, registers: r });
    this.kvPushMs = new Histogram({ name: "airm_worker_kv_push_ms", help: "KV push time per request not hidden by prefill (ms)", buckets: MS_BUCKETS, registers: r });
    this.kvLoadMs = new Histogram({
      name: "airm_worker_kv_load_ms",
      help: "KV pull + check + import per request after the last blob arrived (ms)",
      buckets: MS_BUCKETS,
      registers: r,
    });
    this.requests = new Counter({ name: "airm_worker_requests_total", help: "internal requests by route and outcome", labelNames: ["route", "outcome"], registers: r });
  }
}

/** vLLM's prefix-cache counters (in tokens) and what the cache keeps and gives back. */
function registerPrefixCacheMetrics(r: Registry[], state: WorkerState): void {
  new Counter({
    name: "vllm:prefix_cache_queries_total",
    help: "prompt tokens of prefills that looked up the prefix cache",
    registers: r,
    collect() {
      this.reset();
      this.inc(state.prefixCache()?.queriedTokens ?? 0);
    },
  });
  new Counter({
    name: "vllm:prefix_cache_hits_total",
    help: "prompt tokens whose KV came from the prefix cache",
    registers: r,
    collect() {
      this.reset();
      this.inc(state.prefixCache()?.hitTokens ?? 0);
    },
  });
  new Gauge({
    name: "airm_prefix_cache_blocks",
    help: "full KV blocks kept under their block hash (in use by requests or evictable)",
    registers: r,
    collect() {
      this.set(state.prefixCache()?.blocks ?? 0);
    },
  });
  new Counter({
    name: "airm_prefix_cache_evictions_total",
    help: "kept KV blocks given back (least recently used first) because the pool needed room",
    registers: r,
    collect() {
      this.reset();
      this.inc(state.prefixCache()?.evictions ?? 0);
    },
  });
  new Counter({
    name: "airm_kv_held_positions_total",
    help: "decode role: prompt positions held from the prefix cache for handoffs (kv-hold), which the prefill side did not send",
    registers: r,
    collect() {
      this.reset();
      this.inc(state.prefixCache()?.heldPositions ?? 0);
    },
  });
  new Counter({
    name: "airm_kv_skipped_bytes_total",
    help: "decode role: KV bytes that did not cross because this worker held those blocks",
    registers: r,
    collect() {
      this.reset();
      this.inc(state.prefixCache()?.kvSkippedBytes ?? 0);
    },
  });
  new Counter({
    name: "airm_kv_pulled_bytes_total",
    help: "decode role: KV bytes that crossed into this worker (every handoff's blobs)",
    registers: r,
    collect() {
      this.reset();
      this.inc(state.prefixCache()?.kvPulledBytes ?? 0);
    },
  });
  new Counter({
    name: "airm_kv_events_published_total",
    help: "KV event batches published (--kv-events-config): each a KVEventBatch message on the ZMQ PUB socket",
    registers: r,
    collect() {
      this.reset();
      this.inc(state.prefixCache()?.eventBatches ?? 0);
    },
  });
  new Counter({
    name: "airm_kv_pulls_total",
    help: "decode role: handoffs whose KV this worker imported",
    registers: r,
    collect() {
      this.reset();
      this.inc(state.prefixCache()?.kvPulls ?? 0);
    },
  });
}
