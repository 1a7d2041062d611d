// What a local cluster or a workload runs when nothing is said: the KV transport, the engine
// backend of each role, the ports and the compiled context. The only place the runner names
// plugins; everything else asks the registry what is installed.

export const DEFAULT_KV_TRANSPORT = "shm";
export const DEFAULT_BACKENDS = { prefill: "rngd-full", decode: "atom", solo: "rngd" } as const;
export const DEFAULT_PORTS = { gateway: 8000, prefill: 8101, decode: 8102, solo: 8101 } as const;
export const DEFAULT_SEQ_LEN = 512;
