// What configures a worker process besides its command line: the model (the seed's MODEL), the
// KV lease lifetime, how long a decode waits for KV by default, and the log level. Engines and
// transports declare their own settings; the worker resolves those from the same environment
// and passes them down.

import { defineConfig, flag, int, list, num, oneOf, opt, text, type ConfigValues } from "@airm/rm-core";

export const WORKER_CONFIG = defineConfig("@airm/worker", {
  model: opt(text({ label: "path" }), {
    env: "MODEL",
    defaultText: "none (--model is then required)",
    doc: "The model folder or .gguf file a worker serves when --model is not given (the chart's model artifact path).",
  }),
  leaseTtlS: opt(num({ positive: true }), {
    env: "AIRM_KV_LEASE_TTL_S",
    default: 120,
    doc: "Seconds a prefill worker keeps a request's pushed KV waiting for its decode; past it the blobs are released and counted as expired. It starts when the last blob is pushed (a long prefill or a long generation is not cut by it).",
  }),
  kvTimeoutMs: opt(int({ min: 1 }), {
    env: "AIRM_KV_TIMEOUT_MS",
    default: 60_000,
    doc: "How long a KV push waits for space and a decode's pull waits for each blob unless the request says (the gateway sends its own).",
  }),
  maxWaiting: opt(int({ min: 1 }), {
    env: "AIRM_MAX_WAITING",
    default: 256,
    doc: "Most requests a worker holds waiting (for a slot, or a decode for its KV); one more gets 429 with Retry-After and an OpenAI error body at once. The gateway's own bound has the same variable.",
  }),
  maxNumSeqs: opt(int({ min: 1, max: 4096 }), {
    env: "AIRM_MAX_NUM_SEQS",
    default: 64,
    doc: "Requests a worker runs at once (vLLM's --max-num-seqs), each holding the KV blocks it uses; more wait (vllm:num_requests_waiting) until blocks and a slot free up. A decode pass steps up to the widest compiled batch of them (16 by default), the rest in the next passes.",
  }),
  grammarCache: opt(int({ min: 1 }), {
    env: "AIRM_GRAMMAR_CACHE",
    default: 64,
    doc: "Compiled structured-output grammars a worker keeps (by schema and vocabulary; least recently used go first, grammars in use stay). A request whose grammar is cached skips compiling it.",
  }),
  kvEventsConfig: opt(text({ label: "json" }), {
    env: "AIRM_KV_EVENTS_CONFIG",
    defaultText: "none (no events)",
    doc: 'vLLM\'s --kv-events-config: a JSON object such as {"enable_kv_cache_events": true, "endpoint": "tcp://*:5557", "replay_endpoint": "tcp://*:5558", "topic": "kv@POD@MODEL"}. The worker then publishes its prefix cache\'s block stored / removed / cleared events in vLLM\'s wire format (ZMQ PUB, msgpack KVEventBatch; replay on a ROUTER), starting with a cleared event (a restarted worker\'s old entries go).',
  }),
  enableLora: opt(flag(), {
    env: "AIRM_ENABLE_LORA",
    default: false,
    doc: "Serve LoRA adapters on the base model (vLLM's --enable-lora): a request names one in `model`; AIRM_LORA_MODULES loads some at start, POST /internal/lora/load (the gateway's /v1/load_lora_adapter) more at run time.",
  }),
  loraModules: opt(list(text({ label: "name=path", pattern: /^[^=,\s]+=[^,]+$/, hint: "name=path" })), {
    env: "AIRM_LORA_MODULES",
    defaultText: "none",
    doc: "LoRA adapters loaded at start (vLLM's --lora-modules): comma-separated name=path pairs, each path a PEFT folder (adapter_config.json + adapter_model.safetensors) or a llama.cpp GGUF LoRA file. Implies AIRM_ENABLE_LORA.",
  }),
  maxLoras: opt(int({ min: 1, max: 64 }), {
    env: "AIRM_MAX_LORAS",
    default: 4,
    doc: "LoRA adapters whose weights are resident at once (vLLM's --max-loras); others reload from their folder on demand, the least recently used idle one out.",
  }),
  maxLoraRank: opt(int({ min: 1, max: 512 }), {
    env: "AIRM_MAX_LORA_RANK",
    default: 64,
    doc: "The largest LoRA rank accepted (vLLM's --max-lora-rank); an adapter of a larger rank is refused at load, naming r.",
  }),
  logLevel: opt(oneOf(["fatal", "error", "warn", "info", "debug", "trace", "silent"] as const), {
    env: "AIRM_LOG_LEVEL",
    default: "info",
    doc: "Log level of the worker's JSON logs (stderr).",
  }),
});

export type WorkerConfig = ConfigValues<typeof WORKER_CONFIG.options>;
