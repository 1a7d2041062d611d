// The vLLM-named gauges an llm-d / Gateway API Inference Extension endpoint picker reads from a
// model server's /metrics (GIE v1.5.0's core metrics extractor): the queue, the running requests,
// the KV usage, and the two info gauges it parses for LoRA and cache geometry. Workers and the
// gateway both export them, each from its own view of the load (docs/llm-d.md has the formulas).

import { Gauge, type Registry } from "prom-client";

export interface ServingLoad {
  waiting: number;
  running: number;
  /** Share of the KV capacity the server will admit that is in use, 0-1. */
  kvUsage: number;
  /** LoRA adapters (--enable-lora): the resident limit and the adapters of running and waiting requests (absent: none served). */
  lora?: { maxLoras: number; running: string[]; waiting: string[] };
}

export interface CacheGeometry {
  /** Tokens per KV block (the picker's prefix-hash granularity when it auto-tunes). */
  blockSize: number;
  /** KV blocks of the server's paged cache. */
  numBlocks: number;
}

/**
 * Registers vllm:num_requests_waiting, vllm:num_requests_running, vllm:kv_cache_usage_perc,
 * vllm:lora_requests_info (max_lora and the adapters of running and waiting requests, comma-separated
 * as vLLM writes them, the value the time of the scrape; without adapters max_lora 0) and
 * vllm:cache_config_info (omitted while `geometry()` is null, e.g. before the engine loaded).
 * Values are read at scrape time.
 */
export function registerVllmGauges(registry: Registry, load: () => ServingLoad, geometry: () => CacheGeometry | null): void {
  const registers = [registry];
  new Gauge({
    name: "vllm:num_requests_waiting",
    help: "requests waiting to be scheduled",
    registers,
    collect() {
      this.set(load().waiting);
    },
  });
  new Gauge({
    name: "vllm:num_requests_running",
    help: "requests being served (holding a slot)",
    registers,
    collect() {
      this.set(load().running);
    },
  });
  new Gauge({
    name: "vllm:kv_cache_usage_perc",
    help: "share of the paged KV cache's blocks in use (0-1): blocks held by requests and set aside for admitted ones, over all blocks",
    registers,
    collect() {
      this.set(load().kvUsage);
    },
  });
  new Gauge({
    name: "vllm:lora_requests_info",
    help: "LoRA adapters of running and waiting requests (labels, comma-separated) and max_lora; the value is the time of the scrape (unix s), as vLLM's",
    labelNames: ["max_lora", "running_lora_adapters", "waiting_lora_adapters"],
    registers,
    collect() {
      this.reset();
      const l = load().lora;
      const names = (xs: string[] | undefined) => [...new Set(xs ?? [])].sort().join(",");
      this.set({ max_lora: String(l?.maxLoras ?? 0), running_lora_adapters: names(l?.running), waiting_lora_adapters: names(l?.waiting) }, Date.now() / 1000);
    },
  });
  new Gauge({
    name: "vllm:cache_config_info",
    help: "KV cache geometry: block_size tokens per block, num_gpu_blocks blocks in the paged cache",
    labelNames: ["block_size", "num_gpu_blocks"],
    registers,
    collect() {
      this.reset();
      const g = geometry();
      if (g) this.set({ block_size: String(g.blockSize), num_gpu_blocks: String(g.numBlocks) }, 1);
    },
  });
}

/** How a server names its KV blocks (rm-core block-hash.ts's root), and its process, for a prefix-aware picker. */
export interface PrefixCacheInfo {
  modelFingerprint: string;
  numericsFingerprint: string;
  blockSize: number;
  /** The worker process's id: a picker that sees it change drops what it indexed there. */
  instance: string;
}

/**
 * Registers airm_prefix_cache_info (value 1; omitted while `info()` is null, e.g. while loading or
 * with prefix caching off): the labels model_fingerprint, numerics_fingerprint, block_size and
 * instance let an endpoint picker that scrapes /metrics name a prompt's blocks as the server does.
 */
export function registerPrefixCacheInfo(registry: Registry, info: () => PrefixCacheInfo | null): void {
  new Gauge({
    name: "airm_prefix_cache_info",
    help: "how this server names its KV blocks (block hash root) and its worker process, for prefix-aware routing; 1 while prefix caching is on",
    labelNames: ["model_fingerprint", "numerics_fingerprint", "block_size", "instance"],
    registers: [registry],
    collect() {
      this.reset();
      const i = info();
      if (i) this.set({ model_fingerprint: i.modelFingerprint, numerics_fingerprint: i.numericsFingerprint, block_size: String(i.blockSize), instance: i.instance }, 1);
    },
  });
}
