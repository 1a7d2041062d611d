// What a local cluster or a workload runs when nothing is said: the KV transport, the engine
// backend of each role and the ports (the context is the model's own, max_model_len). The only
// place the runner names plugins; everything else asks the registry what is installed.

export const DEFAULT_KV_TRANSPORT = "shm";
export const DEFAULT_BACKENDS = { prefill: "rngd-full", decode: "atom", solo: "rngd" } as const;
export const DEFAULT_PORTS = { gateway: 8000, prefill: 8101, decode: 8102, solo: 8101 } as const;
/**
 * CPU threads per worker on the CPU reference backend (2 cores): prefill takes two (a burst of
 * prompts arrives while the decode workers are still idle, and time to first token is the
 * prefill's); each decode worker has two and uses the second only while no other worker of the
 * cluster has work (`auto`: the core board). Serve-load on Qwen2.5-Coder-0.5B, c1 / c4 / c8 tok/s:
 * auto 22.2 / 33.7 / 53.2 against 11.0 / 26.8 / 41.1 with one thread each; on the 1.5B c1 TPOT 103
 * ms against 182, c4 ~9% lower, c8 the same. See docs/decisions.md (serving under load).
 */
export const DEFAULT_THREADS = { prefill: 2, decode: "auto" } as const;
/**
 * Niceness of decode workers in a local cluster: 10 lets a prefill take the CPU first when both
 * want it (prefill before decode, as SGLang schedules). Serve-load c8 on 2 cores: TTFT p50
 * 96-175 ms and p90 604-785 ms against 239-273 and 893-1018 at 0, the same tok/s and TPOT; open
 * loop at 0.8 req/s: TTFT halves, TPOT p50 14 -> 33 ms. See docs/decisions.md.
 */
export const DEFAULT_DECODE_NICE = 10;
/**
 * Workers per role that `airm up` starts. Two decode workers on a 2-core machine: a decode worker
 * is compute-bound beyond 4 streams per step, and the prefill worker leaves most of its core idle
 * under load, so a second decode worker turns that idle time into tokens (serve-load: 57 -> 79
 * tok/s at 8 clients; +0.75 GiB). See docs/decisions.md (serving under load).
 */
export const DEFAULT_REPLICAS = { prefill: 1, decode: 2 } as const;
/** The experiment sweep's axes when none are given (`airm k8s gen-sweep`). */
export const SWEEP_DEFAULTS = { transports: ["shm", "tcp"], decode: ["atom", "rngd"], batch: [4, 8] };
/** The Kubernetes device resource of each engine's card (the device plugins' names). */
export const ENGINE_DEVICE_RESOURCES: Record<string, string> = { rngd: "furiosa.ai/rngd", atom: "rebellions.ai/ATOM" };
