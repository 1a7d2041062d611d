// @airm/worker: the rngd-pd worker process (prefill / decode / solo) over an engine and a KV
// transport chosen by name through the rm-core registry. Contract: @airm/internal-api.
export { startWorker, type WorkerOptions, type RunningWorker } from "./worker-server.ts";
export { createWorkerApp } from "./app.ts";
export { WorkerRuntime, type Serving, type RuntimeOptions } from "./runtime.ts";
export { WORKER_CONFIG, type WorkerConfig } from "./worker-config.ts";
export { WORKER_COMMAND } from "./cli.ts";
export { loadServingEngine, type ServingEngine, type EngineStream } from "./serving-engine.ts";
export { LeaseTable, LEASE_END_REASONS, type LeaseEnd, type LeaseCounters } from "./kv-leases.ts";
export { Admission, type Admitted, type BlockSource } from "./admission.ts";
export { DecodeBatcher } from "./decode-batcher.ts";
export { KVPusher, pullKV, type PulledKV } from "./kv-handoff.ts";
export { WorkerMetrics, type WorkerState } from "./worker-metrics.ts";
