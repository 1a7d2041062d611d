// `airm-worker`: the command line (rm-core's defineCommand) and environment, starts a worker and
// stops it on SIGINT/SIGTERM (or when the `airm up` that started it is gone). Exits 2 for a bad
// command line, 1 with the reason when the engine or transport cannot load.

import { defineCommand, flagOf, switchOf, int, isAirmError, list, oneOf, RM_CORE_CONFIG, text, untilStopSignal, type LoraServingOptions } from "@airm/rm-core";
import { startTracing, TELEMETRY_CONFIG, type Tracing } from "@airm/telemetry";
import { WORKER_CONFIG } from "./worker-config.ts";
import { type RunningWorker, startWorker, type WorkerOptions } from "./worker-server.ts";

export const WORKER_COMMAND = defineCommand({
  name: "airm-worker",
  summary: "an rngd-pd worker process (prefill, decode or solo)",
  usage: ["airm-worker --role prefill|decode|solo --backend NAME [--chip N] [--port P] [--model PATH] [--max-model-len N] [--B n]"],
  flags: {
    role: flagOf(oneOf(["prefill", "decode", "solo"] as const), {
      doc: "prefill: tokenizes, prefills, pushes KV layer by layer, answers the first token; decode: pulls KV (prefetching while prefill runs), checks it, decodes; solo: both in one process, no transport (the reference)",
    }),
    backend: flagOf(text({ label: "name" }), {
      doc: "an engine backend the installed engines declare: rngd-full (whole prompt), rngd-chunk (chunked prefill), rngd (resident cache), atom (cache as a host input each step)",
    }),
    chip: flagOf(int({ min: -1 }), { default: 0, doc: "card ordinal among the visible cards; -1 reads this pod's allocation" }),
    port: flagOf(int({ min: 0, max: 65535 }), { default: 8101, doc: "HTTP port (0 picks a free port)" }),
    host: flagOf(text({ label: "address" }), { default: "127.0.0.1", doc: "address to listen on" }),
    metricsPort: flagOf(int({ min: 0, max: 65535 }), {
      defaultText: "none",
      doc: "also serve GET /health and GET /metrics on this port, plain HTTP: for kubelet probes and metric scrapers that cannot present a client certificate when AIRM_TLS_DIR makes --port mutual TLS",
    }),
    model: flagOf(text({ label: "path" }), { defaultText: "MODEL", doc: "model folder or .gguf file" }),
    maxModelLen: flagOf(int({ min: 8 }), {
      defaultText: "AIRM_MAX_MODEL_LEN, else the model's context",
      doc: "the longest request (prompt + max_tokens) served; at most the model's own context (vLLM's flag)",
    }),
    blockSize: flagOf(text({ label: "4|8|16|32|64|128|256" }), {
      defaultText: "AIRM_BLOCK_SIZE, else 16",
      doc: "positions per KV block (vLLM's flag); prefill and decode must agree",
    }),
    kvCacheMemory: flagOf(text({ label: "share|bytes" }), {
      defaultText: "AIRM_KV_CACHE_MEMORY, else 0.25",
      doc: "the KV cache's budget: a share of the memory available after the weights, or bytes (512M, 2G)",
    }),
    maxNumBatchedTokens: flagOf(int({ min: 16 }), { defaultText: "AIRM_MAX_NUM_BATCHED_TOKENS, else 2048", doc: "most tokens in one forward pass (vLLM's flag)" }),
    maxNumSeqs: flagOf(int({ min: 1 }), { defaultText: "AIRM_MAX_NUM_SEQS, else 64", doc: "requests run at once (vLLM's flag)" }),
    B: flagOf(int({ min: 1 }), { name: "B", defaultText: "the engine's (16)", doc: "the widest decode batch compiled" }),
    threads: flagOf(int({ min: 1, max: 2 }), { defaultText: "AIRM_THREADS, else 1", doc: "CPU threads of the reference backend" }),
    kvTransport: flagOf(text({ label: "name" }), { defaultText: "AIRM_KV_TRANSPORT, else shm", doc: "KV transport name (an installed airm.kv_transports plugin)" }),
    otlpTracesEndpoint: flagOf(text({ label: "URL" }), {
      defaultText: "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT, else none",
      doc: "export spans to this OTLP receiver URL (vLLM's flag; the OTEL_* variables set the rest)",
    }),
    enablePrefixCaching: switchOf({ doc: "keep full KV blocks by hash for reuse (vLLM's flag; the default, AIRM_ENABLE_PREFIX_CACHING)" }),
    noEnablePrefixCaching: switchOf({ doc: "turn prefix caching off (vLLM's flag)" }),
    kvEventsConfig: flagOf(text({ label: "json" }), {
      defaultText: "AIRM_KV_EVENTS_CONFIG, else none",
      doc: 'vLLM\'s flag: publish the prefix cache\'s block events, e.g. \'{"enable_kv_cache_events": true, "endpoint": "tcp://*:5557", "replay_endpoint": "tcp://*:5558"}\'',
    }),
    enableLora: switchOf({ doc: "serve LoRA adapters on the base model (vLLM's flag; AIRM_ENABLE_LORA)" }),
    loraModules: flagOf(list(text({ label: "name=path", pattern: /^[^=,\s]+=[^,]+$/, hint: "name=path" })), {
      defaultText: "AIRM_LORA_MODULES, else none",
      doc: "adapters loaded at start (vLLM's flag): comma-separated name=path pairs, each a PEFT folder or a llama.cpp GGUF LoRA file; implies --enable-lora",
    }),
    maxLoras: flagOf(int({ min: 1, max: 64 }), { defaultText: "AIRM_MAX_LORAS, else 4", doc: "adapters resident at once (vLLM's flag)" }),
    maxLoraRank: flagOf(int({ min: 1, max: 512 }), { defaultText: "AIRM_MAX_LORA_RANK, else 64", doc: "the largest adapter rank accepted (vLLM's flag)" }),
    localPrefill: switchOf({
      doc: "decode role: also serve /internal/generate, so a gateway can have short prompts prefilled here instead of on a prefill worker (llm-d's topology, when the picker names no prefill pod)",
    }),
  },
  env: [WORKER_CONFIG, RM_CORE_CONFIG, TELEMETRY_CONFIG],
  notes: "The engine's and the transport's own variables are listed in docs/configuration.md. API: docs/internal-api.md.",
});

/** The engine option --enable-prefix-caching / --no-enable-prefix-caching set (none: the config's). */
export function prefixCachingFlag(on: boolean, off: boolean): { prefixCaching?: boolean } {
  if (on && off) throw new Error("--enable-prefix-caching and --no-enable-prefix-caching contradict each other");
  return on ? { prefixCaching: true } : off ? { prefixCaching: false } : {};
}

/**
 * The LoRA serving options of --enable-lora, --lora-modules, --max-loras and --max-lora-rank, each
 * else its variable (WORKER_CONFIG); none unless adapters are enabled or some are named.
 */
export function loraFlags(
  f: { enableLora: boolean; loraModules?: string[]; maxLoras?: number; maxLoraRank?: number },
  env: Record<string, string | undefined>,
): { lora?: LoraServingOptions } {
  const cfg = WORKER_CONFIG.resolve({ env });
  const pairs = f.loraModules ?? cfg.loraModules;
  if (!(f.enableLora || cfg.enableLora || pairs !== undefined)) return {};
  const modules = (pairs ?? []).map((pair) => {
    const at = pair.indexOf("=");
    return { name: pair.slice(0, at), path: pair.slice(at + 1) };
  });
  const names = modules.map((m) => m.name);
  const twice = names.find((n, i) => names.indexOf(n) !== i);
  if (twice !== undefined) throw new Error(`--lora-modules names ${JSON.stringify(twice)} twice`);
  return { lora: { maxLoras: f.maxLoras ?? cfg.maxLoras, maxLoraRank: f.maxLoraRank ?? cfg.maxLoraRank, modules } };
}

/** Runs the CLI; resolves with the exit code once the worker stopped (or failed). */
export async function main(argv = process.argv.slice(2), env: Record<string, string | undefined> = process.env): Promise<number> {
  let opts: WorkerOptions;
  let tracing: Tracing;
  try {
    const { values: f, help } = WORKER_COMMAND.parse(argv);
    if (help) {
      process.stdout.write(WORKER_COMMAND.help());
      return 0;
    }
    if (!f.role) throw new Error("--role is required (prefill, decode or solo)");
    if (!f.backend) throw new Error("--backend is required (e.g. rngd, rngd-chunk, rngd-full or atom)");
    const model = f.model ?? WORKER_CONFIG.resolve({ env }).model;
    if (!model) throw new Error("--model is required (or set MODEL): a model folder, e.g. one written by `airm-model make-tiny`");
    opts = {
      role: f.role,
      backend: f.backend,
      model,
      chip: f.chip,
      port: f.port,
      host: f.host,
      metricsPort: f.metricsPort,
      ...loraFlags(f, env),
      maxModelLen: f.maxModelLen,
      batch: f.B,
      maxNumSeqs: f.maxNumSeqs,
      engineOptions: {
        ...(f.blockSize !== undefined ? { blockSize: f.blockSize } : {}),
        ...(f.kvCacheMemory !== undefined ? { kvCacheMemory: f.kvCacheMemory } : {}),
        ...(f.maxNumBatchedTokens !== undefined ? { maxNumBatchedTokens: f.maxNumBatchedTokens } : {}),
        ...prefixCachingFlag(f.enablePrefixCaching, f.noEnablePrefixCaching),
      },
      threads: f.threads,
      kvTransport: f.kvTransport,
      localPrefill: f.localPrefill,
      kvEventsConfig: f.kvEventsConfig,
      env,
    };
    tracing = await startTracing({
      service: "airm-worker",
      env,
      attributes: { "airm.role": f.role, "airm.backend": f.backend },
      options: { tracesEndpoint: f.otlpTracesEndpoint },
    });
  } catch (err) {
    console.error(`airm-worker: ${(err as Error).message.replace(/^airm-worker: /, "")}\n\n${WORKER_COMMAND.help()}`);
    return 2;
  }
  let w: RunningWorker | undefined;
  try {
    w = await startWorker(opts);
    await w.ready;
  } catch (err) {
    console.error(`airm-worker: ${isAirmError(err) ? `${err.code}: ${err.message}` : (err as Error).message}`);
    await w?.close().catch(() => {});
    await tracing.shutdown().catch(() => {});
    return 1;
  }
  const why = await untilStopSignal(env);
  // A signal drains first (AIRM_DRAIN_S); a launcher that is gone leaves nobody to serve.
  if (why !== "parent exited") await w.drain();
  await w.close();
  await tracing.shutdown().catch(() => {});
  return 0;
}
