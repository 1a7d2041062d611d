// What configures the gateway besides its command line: the airm_* metrics port and the timeouts
// it applies to worker calls, each with its variable.

import { defineConfig, int, list, num, oneOf, opt, text, type ConfigValues } from "@airm/rm-core";
import { ROUTINGS } from "./endpoint-pool.ts";

export const GATEWAY_CONFIG = defineConfig("@airm/gateway", {
  metricsPort: opt(int({ min: 0, max: 65535 }), {
    env: "AIRM_METRICS_PORT",
    defaultText: "none",
    doc: "Port of the gateway's airm_* metrics (/metrics); the chart sets 9400 with airm.ai-computing.io/scrape.",
  }),
  prefillTimeoutMs: opt(int({ min: 1 }), {
    env: "AIRM_PREFILL_TIMEOUT_MS",
    default: 600_000,
    doc: "Longest a whole prefill call may take (ms), its wait for KV blocks included: a prompt of the model's whole context takes minutes on a CPU.",
  }),
  decodeIdleTimeoutMs: opt(int({ min: 1 }), {
    env: "AIRM_DECODE_IDLE_TIMEOUT_MS",
    default: 60_000,
    doc: "Longest gap between two events of a decode stream (ms). A solo or local-prefill stream waits for its first event as long as AIRM_PREFILL_TIMEOUT_MS allows (its prefill, queue included).",
  }),
  kvTimeoutMs: opt(int({ min: 1 }), {
    env: "AIRM_KV_TIMEOUT_MS",
    default: 60_000,
    doc: "How long a decode's KV pull waits for its blob beyond AIRM_PREFILL_TIMEOUT_MS (ms): the decode is called when the request arrives, so its wait covers the prefill's queue and compute too; decode gets the sum as kvTimeoutMs.",
  }),
  healthIntervalMs: opt(int({ min: 10 }), { env: "AIRM_HEALTH_INTERVAL_MS", default: 2000, doc: "Period of the health probe of each worker (ms)." }),
  requestTimeoutS: opt(num({ positive: true }), {
    env: "AIRM_REQUEST_TIMEOUT_S",
    default: 1800,
    doc: "Longest a request may run, start to last token (s); a request's own `timeout` (body field, seconds) may only shorten it. Past it the request ends with 504 request_timeout (or an error event when streaming) and its slots, KV lease and blobs are released.",
  }),
  breakerFailures: opt(int({ min: 1 }), {
    env: "AIRM_BREAKER_FAILURES",
    default: 3,
    doc: "Calls to one worker that fail in a row (5xx, broken or silent stream, unreachable) before its circuit breaker opens: no request goes there until a trial call succeeds.",
  }),
  breakerCooldownMs: opt(int({ min: 1 }), {
    env: "AIRM_BREAKER_COOLDOWN_MS",
    default: 1000,
    doc: "How long an open breaker waits before one trial call (ms); each failed trial doubles it, up to 30 s.",
  }),
  migrationLimit: opt(int({ min: 0, max: 100 }), {
    env: "AIRM_MIGRATION_LIMIT",
    default: 3,
    doc: "Times one streamed generation may move to another worker after its worker died, went silent, lost its KV or handed it back on drain (0: never; the client then gets the error). The prompt and the tokens already sent are prefilled again and decoding resumes at the next token, with the tokens the first worker would have given (the sampler is keyed by seed and position). Not for n or best_of > 1.",
  }),
  workerWaitS: opt(num({ min: 0 }), {
    env: "AIRM_WORKER_WAIT_S",
    default: 30,
    doc: "How long a request waits for a worker of a role when none is healthy (one restarting after a crash, or still loading), and for the one it was sent to when that one died before taking the request, before it gets 503 no_healthy_worker (0: at once). Waiting requests count against AIRM_MAX_WAITING.",
  }),
  routing: opt(oneOf(ROUTINGS), {
    env: "AIRM_ROUTING",
    default: "prefix",
    doc: "How the gateway picks a worker of a role: prefix (a score of load and the share of the prompt's blocks the worker already holds, from the workers' KV events; workers that publish none are scored by load alone), load (the fewest requests outstanding, ties in turn) or random (a baseline for benches).",
  }),
  maxBodyBytes: opt(int({ min: 1024 }), { default: 1 << 20, doc: "Largest request body (--max-body-bytes)." }),
  maxWaiting: opt(int({ min: 1 }), {
    env: "AIRM_MAX_WAITING",
    default: 256,
    doc: "Most requests the gateway holds before their first token (queued or in prefill); one more gets 429 with Retry-After and an OpenAI error body instead of a wait with no end.",
  }),
  apiKeys: opt(list(text({ label: "key" })), {
    env: "AIRM_API_KEY",
    defaultText: "none (no key asked)",
    doc: "API keys, comma-separated: when set, every route but the open paths needs `Authorization: Bearer <key>` with one of them (401 with an OpenAI error body otherwise). `airm up` passes it to its gateway.",
  }),
  openPaths: opt(list(text({ label: "path" })), {
    env: "AIRM_API_OPEN_PATHS",
    default: ["/health", "/metrics"],
    doc: "Paths served without an API key when AIRM_API_KEY is set (probes and the endpoint picker's scrapes); `none` asks a key everywhere.",
  }),
  toolCallParser: opt(oneOf(["hermes", "llama3_json", "none"] as const), {
    env: "AIRM_TOOL_CALL_PARSER",
    default: "hermes",
    doc: 'How tool calls are read from answers to tool_choice "auto" (vLLM\'s --tool-call-parser; `none` refuses auto, as vLLM does without --enable-auto-tool-choice): hermes reads `<tool_call>{...}</tool_call>` blocks (Qwen2.5, Hermes, and the tool prompt this server writes for templates without tools), llama3_json a JSON object or several separated by `;`.',
  }),
  logLevel: opt(oneOf(["fatal", "error", "warn", "info", "debug", "trace", "silent"] as const), {
    env: "AIRM_LOG_LEVEL",
    default: "info",
    doc: "Log level of the gateway's JSON logs (stderr): request fields it ignored (once per name), worker faults.",
  }),
  podNamespace: opt(text(), { env: "POD_NAMESPACE", default: "default", doc: "Namespace of --prefill-pool when --pool-namespace is not given (the chart sets it from the pod)." }),
});

export type GatewayConfig = ConfigValues<typeof GATEWAY_CONFIG.options>;
