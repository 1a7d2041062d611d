// @airm/worker: the rngd-pd worker process (prefill / decode / solo) over an engine and a KV
// transport chosen by name through the rm-core registry. API: docs/internal-api.md.
export { startWorker, type WorkerOptions, type RunningWorker } from "./worker-server.ts";
export { createWorkerApp, toHttpError, type Role, type WorkerRuntime } from "./worker-app.ts";
export { loadServingEngine, engineForBackend, type ServingEngine, type EngineStream } from "./serving-engine.ts";
export { LeaseTable, LEASE_END_REASONS, type LeaseEnd, type LeaseCounters } from "./kv-leases.ts";
export { RequestSlots } from "./request-slots.ts";
export { DecodeBatcher } from "./decode-batcher.ts";
export { KVPusher, pullKV, type PulledKV } from "./kv-handoff.ts";
export { TextStream } from "./text-stream.ts";
export { WorkerMetrics, type WorkerState } from "./worker-metrics.ts";
