// `airm up`: a whole PD cluster on 127.0.0.1 through the launcher (local-cluster.ts), with a
// ready-to-paste request printed once every part is healthy. Ctrl-C / SIGTERM stop it.

import { defineCommand, flagOf, int, oneOf, RM_CORE_CONFIG, switchOf, text } from "@airm/rm-core";
import { DEFAULT_BACKENDS, DEFAULT_KV_TRANSPORT, DEFAULT_PORTS, DEFAULT_THREADS, DEFAULT_DECODE_NICE, DEFAULT_REPLICAS } from "./defaults.ts";
import { DEFAULT_MODELS, chooseDefaultModel, resolveModelArg } from "./default-model.ts";
import { firstApiKey, StartAbortedError, startLocalCluster, type ClusterOptions, type RunningCluster } from "./local-cluster.ts";
import { freePort } from "./cluster-plan.ts";
import { RESTART_POLICY } from "./supervisor.ts";
import { UpStateWriter } from "./top/up-state.ts";
import { checkTopologyRun, openTopologyRun, type CheckedTopology, type TopologyRun } from "./up-topology.ts";

export const UP_COMMAND = defineCommand({
  name: "airm up",
  summary: "a local PD cluster on 127.0.0.1, on the CPU reference backend unless NPUs are present",
  usage: ["airm up [--model NAME|PATH] [--kv-transport NAME] [--port 8000] [--decode-backend NAME] [options]", "airm up --topology FILE [options]   (as root)"],
  flags: {
    model: flagOf(text({ label: "name|path" }), {
      defaultText: `the first pulled of ${DEFAULT_MODELS.join(", ")} (airm model pull NAME), else a generated tiny Llama (random weights)`,
      doc: "a pulled model's name (airm model list), a .gguf file or a Hugging Face folder (Llama, Qwen2, Qwen3, Gemma 3)",
    }),
    kvTransport: flagOf(text({ label: "name" }), {
      default: DEFAULT_KV_TRANSPORT,
      doc: "how KV crosses from prefill to decode: any installed transport (shm, tcp, nixl-ucx...); a sidecar it declares (the KV relay for tcp and nixl-ucx) is started too",
    }),
    port: flagOf(int({ min: 0, max: 65535 }), { default: DEFAULT_PORTS.gateway, doc: "the OpenAI API port (0 picks a free one)" }),
    prefillBackend: flagOf(text({ label: "name" }), { default: DEFAULT_BACKENDS.prefill, doc: "prefill engine backend (rngd-full: whole prompt; rngd-chunk: chunked)" }),
    decodeBackend: flagOf(text({ label: "name" }), {
      default: DEFAULT_BACKENDS.decode,
      doc: "decode engine backend (atom: cache as a host input each step; rngd: resident cache)",
    }),
    maxModelLen: flagOf(int({ min: 8 }), {
      defaultText: "the model's context (max_position_embeddings / context_length)",
      doc: "the longest request (prompt + max_tokens) served (vLLM's flag); lower it to cap requests. The KV cache is paged: a request holds the blocks of the positions it uses, whatever this is",
    }),
    blockSize: flagOf(oneOf(["4", "8", "16", "32", "64", "128", "256"] as const), { default: "16", doc: "positions per KV block (vLLM's flag; AIRM_BLOCK_SIZE for every worker)" }),
    enablePrefixCaching: switchOf({ doc: "prefix caching by block on every worker (vLLM's flag): the default" }),
    noEnablePrefixCaching: switchOf({
      doc: "turn prefix caching off on every worker (vLLM's flag; AIRM_ENABLE_PREFIX_CACHING=0): no KV block outlives its request",
    }),
    kvCacheMemory: flagOf(text({ label: "share|bytes" }), {
      default: "0.25",
      doc: "each worker's KV cache budget (AIRM_KV_CACHE_MEMORY): a share of the memory it can still have after loading the weights, or bytes (512M, 2G); memory is only taken as blocks are used. Each worker prints what it bought (KV cache: N blocks = M tokens)",
    }),
    maxNumBatchedTokens: flagOf(int({ min: 16 }), {
      default: 2048,
      doc: "most tokens in one forward pass (vLLM's flag; AIRM_MAX_NUM_BATCHED_TOKENS): a longer prompt prefills in chunks of this",
    }),
    maxNumSeqs: flagOf(int({ min: 1, max: 4096 }), {
      default: 64,
      doc: "requests each worker runs at once (vLLM's flag; AIRM_MAX_NUM_SEQS); more wait for KV blocks and a slot (vllm:num_requests_waiting)",
    }),
    enableLora: switchOf({
      doc: "serve LoRA adapters on the base model (vLLM's flag; AIRM_ENABLE_LORA): every worker, prefill and decode alike; a request names one in `model`, POST /v1/load_lora_adapter loads more",
    }),
    loraModules: flagOf(text({ label: "name=path,...", pattern: /^[^=,\s]+=[^,]+(,[^=,\s]+=[^,]+)*$/, hint: "name=path,name2=path2" }), {
      defaultText: "none",
      doc: "LoRA adapters every worker loads at start (vLLM's flag; AIRM_LORA_MODULES): comma-separated name=path pairs, each a PEFT folder (adapter_config.json + adapter_model.safetensors) or a llama.cpp GGUF LoRA file; implies --enable-lora",
    }),
    maxLoras: flagOf(int({ min: 1, max: 64 }), { default: 4, doc: "LoRA adapters resident at once in each worker (vLLM's flag; AIRM_MAX_LORAS); others reload on demand" }),
    maxLoraRank: flagOf(int({ min: 1, max: 512 }), { default: 64, doc: "the largest LoRA rank accepted (vLLM's flag; AIRM_MAX_LORA_RANK)" }),
    prefillReplicas: flagOf(int({ min: 1, max: 16 }), {
      default: DEFAULT_REPLICAS.prefill,
      doc: "prefill workers (ports from --prefill-port, step 2); the gateway balances by load",
    }),
    decodeReplicas: flagOf(int({ min: 1, max: 16 }), { default: DEFAULT_REPLICAS.decode, doc: "decode workers (ports from --decode-port, step 2); the gateway balances by load" }),
    decodeBatch: flagOf(int({ min: 1, max: 256 }), {
      defaultText: "16 (the engine's widest compiled batch)",
      doc: "widest decode batch: running requests step together (continuous batching) in compiled buckets 1, 4, 8, 16 up to this; 1 turns batching off",
    }),
    prefillThreads: flagOf(int({ min: 1, max: 2 }), { default: DEFAULT_THREADS.prefill, doc: "CPU threads of each prefill worker (CPU reference backend)" }),
    decodeThreads: flagOf(oneOf(["1", "2", "auto"] as const), {
      default: DEFAULT_THREADS.decode,
      doc: "CPU threads of each decode worker (CPU reference backend): 1, 2, or auto (two, the second used only while no other worker of the cluster has work: one stream alone gets both cores, busy workers one each)",
    }),
    weights: flagOf(oneOf(["auto", "bf16", "q8_0", "q4_1"] as const), {
      default: "auto",
      doc: "how the CPU reference holds weight matrices (AIRM_WEIGHTS for every worker): auto keeps a GGUF's quantized blocks and runs integer kernels, float checkpoints as bf16; bf16 dequantises everything; q8_0 / q4_1 also quantize float matrices at load",
    }),
    activations: flagOf(oneOf(["i8", "i16"] as const), {
      default: "i8",
      doc: "input width of the CPU reference's Q4_0/Q4_1/Q4_K/Q6_K kernels (AIRM_ACTIVATIONS for every worker): i8 quantizes inputs to 8 bits as llama.cpp does (exact integer dots on relaxed SIMD, the faster); i16 keeps 16 bits (slower, closer to the float model)",
    }),
    generationConfig: flagOf(oneOf(["auto", "vllm"] as const), {
      default: "auto",
      doc: "whose sampling defaults a request gets for the fields it leaves out (AIRM_GENERATION_CONFIG for every worker; vLLM's flag): auto the model's (generation_config.json or the GGUF's general.sampling.* keys; each worker prints them at start), vllm none (temperature 1, top_p/top_k/min_p off). A request's own values always win",
    }),
    prefillBatchTokens: flagOf(int({ min: 0, max: 65536 }), {
      default: 0,
      doc: "prompts that wait for a busy prefill worker run together in its next pass, up to this many prompt tokens (AIRM_PREFILL_BATCH_TOKENS; same tokens either way); 0 runs them one at a time (a lower median time to first token under load, a higher p90)",
    }),
    decodeNice: flagOf(int({ min: 0, max: 19 }), {
      default: DEFAULT_DECODE_NICE,
      doc: "scheduling niceness of the decode workers: above 0 lets a prefill take the CPU first when both want it (shorter time to first token under load)",
    }),
    prefillPort: flagOf(int({ min: 0, max: 65535 }), { default: DEFAULT_PORTS.prefill, doc: "prefill worker port" }),
    decodePort: flagOf(int({ min: 0, max: 65535 }), { default: DEFAULT_PORTS.decode, doc: "decode worker port" }),
    sidecarPort: flagOf(int({ min: 0, max: 65535 }), { defaultText: "the one the transport declares (7400 for the KV relay)", doc: "port of the transport's sidecar" }),
    metricsPort: flagOf(int({ min: 0, max: 65535 }), { defaultText: "none", doc: "gateway airm_* metrics port" }),
    toolCallParser: flagOf(oneOf(["hermes", "llama3_json", "none"] as const), {
      default: "hermes",
      doc: 'how the gateway reads tool calls from answers to tool_choice "auto" (AIRM_TOOL_CALL_PARSER; vLLM\'s --tool-call-parser): hermes reads <tool_call> blocks, which is also how a chat template without tools is told to call them; none refuses auto',
    }),
    readyTimeout: flagOf(int({ min: 1 }), { default: 300, doc: "seconds to wait for every part to be healthy" }),
    maxRestarts: flagOf(int({ min: 0, max: 100 }), {
      default: RESTART_POLICY.maxDeaths - 1,
      doc: `a part that dies is restarted after ${RESTART_POLICY.firstDelayMs} ms, doubling up to ${RESTART_POLICY.maxDelayMs / 1000} s, at most this many times within ${RESTART_POLICY.windowMs / 1000} s; one more death stops the cluster (0: the first death does)`,
    }),
    topology: flagOf(text({ label: "file" }), {
      defaultText: "none: every part on 127.0.0.1",
      doc: "YAML or JSON: hosts of a rig of network namespaces on one switch (links shaped with tc: rate, burst, latency, mtu) and `place`, the host of gateway, prefill, decode (a list: one worker per entry) and relay; each part runs in its host's namespace on its address, the transport's per-host sidecar (the NIXL agent) beside the workers, and the gateway is reached on 127.0.0.1:--port. Needs root. The hosts share this machine's memory, so UCX is held to TCP over eth0 (UCX_TLS=tcp, UCX_NET_DEVICES=eth0 unless set). A transport with a folder of one machine (shm) is refused across hosts",
    }),
    tls: switchOf({
      doc: "mutual TLS between the parts: a throwaway CA (openssl) issues one certificate for them all into a folder removed when the cluster stops, and every part gets it as AIRM_TLS_DIR (workers and the KV relay serve TLS and refuse callers without a certificate of that CA; the gateway and the transports present it). An AIRM_TLS_DIR already set is used instead. The gateway's own port stays plain HTTP",
    }),
    quiet: switchOf({ doc: "do not echo the parts' own log lines" }),
  },
  env: [RM_CORE_CONFIG],
  notes:
    "Stop with Ctrl-C (SIGINT) or SIGTERM: every part is stopped and the cluster's folder removed.\nIf a part dies, airm up says which and why and restarts it (the gateway routes around it meanwhile); a part that keeps dying makes it stop the rest and exit 1.\nThe parts share a fresh internal token (AIRM_INTERNAL_TOKEN, or yours when it is set); with AIRM_API_KEY set the gateway asks for that key; with --tls or AIRM_TLS_DIR they talk mutual TLS (docs/tls.md).",
});

/** The ready-to-paste requests; with API keys they send the key from the shell's AIRM_API_KEY (never printed). */
function tryIt(url: string, modelId: string, withKey: boolean): string {
  const chat = `{"model": "${modelId}", "messages": [{"role": "user", "content": "What is the capital of France?"}], "max_tokens": 32, "temperature": 0}`;
  const auth = withKey ? ` -H "authorization: Bearer \${AIRM_API_KEY%%,*}"` : "";
  const apiKey = withKey ? 'os.environ["AIRM_API_KEY"].split(",")[0]' : '"none"';
  return [
    "try it:",
    `  curl -s ${url}/v1/chat/completions -H 'content-type: application/json'${auth} \\`,
    `    -d '${chat}'`,
    "",
    "or with the OpenAI client (pip install openai):",
    `  python3 -c 'import os; from openai import OpenAI; c = OpenAI(base_url="${url}/v1", api_key=${apiKey}); print(c.chat.completions.create(model="${modelId}", messages=[{"role": "user", "content": "What is the capital of France?"}], max_tokens=32, temperature=0).choices[0].message.content)'`,
  ].join("\n");
}

export type UpFlags = ReturnType<typeof UP_COMMAND.parse>["values"];

/**
 * The cluster `airm up` starts for `f` (its parsed flags, defaults filled in) and `model`: the
 * same shape for airm up and for the benches that measure what it serves.
 */
export function upCluster(f: UpFlags, model: string): ClusterOptions {
  // Replica i listens on the role's port + 2i (a free one each when the port is 0).
  const replicas = (n: number, backend: string, port: number, extra: { batch?: number; threads: number; nice?: number; secondThread?: "when-idle" }) =>
    Array.from({ length: n }, (_, i) => ({ backend, port: port === 0 ? 0 : port + 2 * i, ...extra }));
  const prefill = replicas(f.prefillReplicas, f.prefillBackend, f.prefillPort, { threads: f.prefillThreads });
  const auto = f.decodeThreads === "auto";
  const decode = replicas(f.decodeReplicas, f.decodeBackend, f.decodePort, {
    batch: f.decodeBatch,
    threads: auto ? 2 : Number(f.decodeThreads),
    nice: f.decodeNice,
    ...(auto ? { secondThread: "when-idle" as const } : {}),
  });
  return {
    model,
    kvTransport: f.kvTransport,
    prefill,
    decode,
    port: f.port,
    sidecarPort: f.sidecarPort,
    metricsPort: f.metricsPort,
    maxModelLen: f.maxModelLen,
    coreBoard: auto,
    readyTimeoutMs: f.readyTimeout * 1000,
    tls: f.tls,
    onPartExit: f.maxRestarts === 0 ? "stop-all" : "restart",
    restart: { maxDeaths: f.maxRestarts + 1 },
    env: {
      AIRM_WEIGHTS: f.weights,
      AIRM_ACTIVATIONS: f.activations,
      AIRM_GENERATION_CONFIG: f.generationConfig,
      AIRM_PREFILL_BATCH_TOKENS: String(f.prefillBatchTokens),
      AIRM_BLOCK_SIZE: f.blockSize,
      AIRM_ENABLE_PREFIX_CACHING: prefixCachingEnv(f.enablePrefixCaching, f.noEnablePrefixCaching),
      AIRM_KV_CACHE_MEMORY: f.kvCacheMemory,
      AIRM_MAX_NUM_BATCHED_TOKENS: String(f.maxNumBatchedTokens),
      AIRM_MAX_NUM_SEQS: String(f.maxNumSeqs),
      ...loraEnv(f),
    },
    gatewayEnv: { AIRM_TOOL_CALL_PARSER: f.toolCallParser },
  };
}

/** The workers' LoRA variables from --enable-lora, --lora-modules, --max-loras, --max-lora-rank (none without the first two). */
function loraEnv(f: Pick<UpFlags, "enableLora" | "loraModules" | "maxLoras" | "maxLoraRank">): Record<string, string> {
  if (!f.enableLora && f.loraModules === undefined) return {};
  return {
    AIRM_ENABLE_LORA: "1",
    ...(f.loraModules === undefined ? {} : { AIRM_LORA_MODULES: f.loraModules }),
    AIRM_MAX_LORAS: String(f.maxLoras),
    AIRM_MAX_LORA_RANK: String(f.maxLoraRank),
  };
}

/** AIRM_ENABLE_PREFIX_CACHING for the workers from --enable-prefix-caching / --no-enable-prefix-caching (on unless turned off). */
function prefixCachingEnv(on: boolean, off: boolean): string {
  if (on && off) throw new Error("--enable-prefix-caching and --no-enable-prefix-caching contradict each other");
  return off ? "0" : "1";
}

/**
 * `airm up`'s own cluster for its flags `extra` (defaults filled in) on free ports, started in
 * this process and stopped at a part's death: what the benches and `airm bench --local` measure.
 * `adjust` changes the options of a shape airm up has no flag for (a sweep's solo replicas).
 */
export async function startUpCluster(
  extra: string[],
  o: { env: Record<string, string | undefined>; gatewayEnv?: Record<string, string>; adjust?: (c: ClusterOptions) => ClusterOptions },
): Promise<{ cluster: RunningCluster; modelNote: string }> {
  const { values: f } = UP_COMMAND.parse(["--port", "0", "--prefill-port", "0", "--decode-port", "0", "--sidecar-port", "0", ...extra]);
  const chosen = f.model ? await resolveModelArg(f.model, o.env) : await chooseDefaultModel(o.env);
  const shape = upCluster(f, chosen.path);
  const options: ClusterOptions = { ...shape, onPartExit: "stop-all", gatewayEnv: { ...shape.gatewayEnv, ...o.gatewayEnv }, env: { ...shape.env, AIRM_LOG_LEVEL: "warn" } };
  return { cluster: await startLocalCluster(o.adjust ? o.adjust(options) : options), modelNote: chosen.note };
}

/** Runs `airm up`; resolves with the exit code once the cluster stopped. */
export async function up(argv: string[]): Promise<number> {
  const { values: f, help } = UP_COMMAND.parse(argv);
  if (help) {
    process.stdout.write(UP_COMMAND.help());
    return 0;
  }
  const log = (line: string) => process.stderr.write(`${line}\n`);
  // a topology is checked (placement, transport across hosts, root) before anything starts
  const checked = f.topology ? checkTopologyRun(f.topology, upCluster(f, "")) : undefined;
  const chosen = f.model ? await resolveModelArg(f.model, process.env) : await chooseDefaultModel(process.env);
  const model = chosen.path;
  if (chosen.path !== f.model) log(`airm up: ${chosen.note}`);
  const batchText = f.decodeBatch === undefined ? "up to 16 (buckets 1, 4, 8, 16)" : f.decodeBatch === 1 ? "1 (batching off)" : `up to ${f.decodeBatch}`;
  log(
    `airm up: ${f.prefillReplicas} prefill (${f.prefillBackend}, ${f.prefillThreads} thread${f.prefillThreads > 1 ? "s" : ""} each, ` +
      `${f.prefillBatchTokens > 0 ? `waiting prompts batched up to ${f.prefillBatchTokens} tokens` : "prompts one at a time"}) : ` +
      `${f.decodeReplicas} decode (${f.decodeBackend}, ${f.decodeThreads === "auto" ? "2 threads each, the second while the other workers are idle" : `${f.decodeThreads} thread${f.decodeThreads === "1" ? "" : "s"} each`}, batch ${batchText}, nice ${f.decodeNice}); ` +
      `weights ${f.weights}, activations ${f.activations}; KV over ${f.kvTransport} in blocks of ${f.blockSize} (budget ${f.kvCacheMemory} per worker); ` +
      `max_model_len ${f.maxModelLen ?? "the model's"}; generation config ${f.generationConfig}; gateway port ${f.port}`,
  );
  // Ctrl-C or SIGTERM while the parts start stops the ones started and removes the cluster's
  // folder, as it does once the cluster is up.
  const abort = new AbortController();
  let cluster: RunningCluster | undefined;
  // The handlers stay: a signal sent to the whole process group reaches airm up more than once
  // (from the terminal or supervisor, and again from a parent such as pnpm that forwards it), and
  // a second one must not kill airm up before it has stopped the parts and removed the folder.
  let signalled = false;
  const onSignal = (sig: string) => {
    if (signalled) return;
    signalled = true;
    if (cluster) void cluster.stop(`airm up: ${sig}: stopping every part`);
    else {
      log(`airm up: ${sig} while starting: stopping the parts started so far`);
      abort.abort(sig);
    }
  };
  process.on("SIGINT", () => onSignal("SIGINT"));
  process.on("SIGTERM", () => onSignal("SIGTERM"));
  let topo: TopologyRun | undefined;
  const state = openUpState(log);
  // the KV relay (a sidecar) serves its metrics on a port of its own, which the state file names for airm top
  const sidecarMetricsPort = checked ? undefined : await freePort();
  try {
    topo = checked ? await openTopology(checked, upCluster(f, model), f.port, log) : undefined;
    if (abort.signal.aborted) throw new StartAbortedError(String(abort.signal.reason));
    const shape = upCluster(f, model);
    cluster = await startLocalCluster({
      ...shape,
      ...topo?.options,
      ...(sidecarMetricsPort === undefined ? {} : { sidecarEnv: { ...shape.sidecarEnv, AIRM_METRICS_PORT: String(sidecarMetricsPort) } }),
      log,
      childLog: (part, line) => {
        state?.logLine(part, line);
        if (!f.quiet) process.stderr.write(`${part.padEnd(8)}| ${line}\n`);
      },
      onPartStart: (part) => state?.partStarted(part),
      abort: abort.signal,
    });
  } catch (e) {
    state?.remove();
    await topo?.close();
    if (!(e instanceof StartAbortedError)) throw e;
    log(`airm up: ${e.message}`);
    return 130;
  }
  publishState(state, cluster, sidecarMetricsPort);
  const key = firstApiKey(process.env.AIRM_API_KEY);
  const modelId = await fetch(`${cluster.url}/v1/models`, { headers: key ? { authorization: `Bearer ${key}` } : {} })
    .then((r) => r.json() as Promise<{ data?: { id: string }[] }>)
    .then((b) => b.data?.[0]?.id ?? "default")
    .catch(() => "default");
  const sidecar = cluster.plan.transport?.sidecar?.name;
  const sidecars = sidecar && !topo ? `, ${sidecar} on ${cluster.part(sidecar).url}` : "";
  const placement = topo ? ["", `placed by ${f.topology}:`, topo.placement(cluster.parts)] : [];
  process.stdout.write(
    [
      "",
      `rngd-pd is up: ${cluster.url}  (KV transport ${f.kvTransport}${sidecars}, decode on ${f.decodeBackend}${cluster.tls ? `; mutual TLS between the parts, ${cluster.tls.dir}` : ""})`,
      ...placement,
      "",
      tryIt(cluster.url, modelId, Boolean(key)),
      "",
      "Ctrl-C stops the cluster.",
      "",
    ].join("\n"),
  );
  const code = await cluster.done;
  state?.remove();
  if (topo) {
    await topo.close();
    log("airm up: the rig is down");
  }
  return code;
}

/** The state file airm top reads (up-state.ts); airm up goes on without it when its folder cannot be used safely. */
function openUpState(log: (line: string) => void): UpStateWriter | null {
  try {
    return UpStateWriter.open(process.env);
  } catch (e) {
    log(`airm up: no state file for airm top: ${(e as Error).message}`);
    return null;
  }
}

/** Writes the state file of the cluster now up: its gateway, its parts, their token and TLS folder. */
function publishState(state: UpStateWriter | null, cluster: RunningCluster, sidecarMetricsPort: number | undefined): void {
  const sidecar = cluster.plan.transport?.sidecar;
  state?.publish({
    gateway: cluster.url,
    gatewayMetrics: cluster.metricsUrl,
    internalToken: cluster.internalToken,
    tlsDir: cluster.tls?.dir ?? null,
    parts: cluster.parts.map((p) => ({ name: p.name, url: /^https?:\/\//.test(p.url) ? p.url : `http://${p.url}` })),
    sidecarMetrics: sidecar && sidecarMetricsPort !== undefined ? `http://127.0.0.1:${sidecarMetricsPort}/metrics` : null,
  });
}

/** Makes the topology's rig; the user learns where each host is. */
async function openTopology(c: CheckedTopology, shape: ClusterOptions, port: number, log: (line: string) => void): Promise<TopologyRun> {
  const run = await openTopologyRun(c, shape, port, process.env);
  log(`airm up: rig of ${c.file} is up: ${[...run.rig.hosts.values()].map((h) => `${h.name} ${h.address}`).join(", ")}`);
  return run;
}
