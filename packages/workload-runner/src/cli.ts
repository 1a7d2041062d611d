// The `airm` command line: `up` (a local PD cluster), `run` (one workload in the foreground, as a
// pod runs it) and `model` (the model tool). node:util parseArgs; `--help` on each subcommand.

import { spawnSync } from "node:child_process";
import { parseArgs } from "node:util";
import { isAirmError } from "@airm/rm-core";
import { binPath } from "./package-bins.ts";
import { chooseDefaultModel } from "./default-model.ts";
import { startLocalCluster } from "./local-cluster.ts";
import { run, type RunConfig } from "./rngd-pd-workload.ts";

const HELP = `airm: run rngd-pd (prefill/decode-disaggregated LLM serving)

usage: airm <command> [options]

commands:
  up       start a whole PD cluster on 127.0.0.1 (KV relay if needed, prefill, decode, gateway)
  run      run one workload (prefill | decode | serve) in the foreground, as a pod does
  model    the model tool: pull, list, make-tiny (see "airm model --help")

"airm <command> --help" describes every option of a command.
`;

const UP_HELP = `airm up: a local PD cluster on 127.0.0.1, on the CPU reference backend unless NPUs are present

usage: airm up [--model PATH] [--kv-transport shm|tcp|nixl-ucx] [--port 8000] [--decode-backend atom|rngd]

  --model PATH            Hugging Face Llama/Qwen2 folder or .gguf file. Default: SmolLM2-135M-Instruct
                          from the model cache if "airm model pull smollm2-135m-instruct" was run,
                          otherwise a generated tiny Llama (random weights)
  --kv-transport NAME     how KV crosses from prefill to decode: shm (default), tcp (starts a KV relay),
                          nixl-ucx (UCX one-sided reads; starts a KV relay for descriptors)
  --port N                the OpenAI API port (default 8000)
  --decode-backend NAME   atom (default; cache as a host input each step) or rngd (resident cache)
  --seq-len S             compiled context length (default 512)
  --prefill-port N        prefill worker port (default 8101)
  --decode-port N         decode worker port (default 8102)
  --relay-port N          KV relay port for tcp / nixl-ucx (default 7400)
  --metrics-port N        gateway airm_* metrics port (default: none)
  --ready-timeout S       seconds to wait for every part to be healthy (default 300)
  --quiet                 do not echo the parts' own log lines
  -h, --help              this text

Stop with Ctrl-C (SIGINT) or SIGTERM: every part is stopped and the cluster's /dev/shm folder removed.
If a part dies, airm up says which and why, stops the rest and exits 1.
`;

const RUN_HELP = `airm run: one rngd-pd workload in the foreground (what a pod's entry point runs)

usage: airm run prefill|decode|serve [--model PATH] [options] [-- extra worker/gateway args]

  --model PATH          model folder or .gguf (becomes MODEL)
  --batch-hint N        decode only: batch width (becomes --B)
  --kv-transport NAME   AIRM_KV_TRANSPORT (default shm)
  --port N              HTTP port (default 8000)
  --host H              listen address (default 0.0.0.0)
  --seq-len S           compiled context (default 256)
  --backend NAME        rngd-full | rngd-chunk (prefill), atom | rngd (decode)
  --prefill-url URL     serve only: prefill worker (default http://127.0.0.1:8101)
  --decode-url URL      serve only: decode worker (default http://127.0.0.1:8102)
  --metrics-port N      serve only: airm_* metrics port (AIRM_METRICS_PORT)
  --dry-run             print the command line and environment instead of running
  -h, --help            this text
`;

function int(flag: string, v: string | undefined, fallback?: number): number | undefined {
  if (v === undefined) return fallback;
  const n = Number(v);
  if (!/^\d+$/.test(v) || !Number.isSafeInteger(n)) throw new UsageError(`${flag} must be a non-negative integer, got ${JSON.stringify(v)}`);
  return n;
}

class UsageError extends Error {}

async function up(argv: string[]): Promise<number> {
  const { values } = parseArgs({
    args: argv,
    strict: true,
    options: {
      model: { type: "string" },
      "kv-transport": { type: "string", default: "shm" },
      port: { type: "string" },
      "decode-backend": { type: "string", default: "atom" },
      "seq-len": { type: "string" },
      "prefill-port": { type: "string" },
      "decode-port": { type: "string" },
      "relay-port": { type: "string" },
      "metrics-port": { type: "string" },
      "ready-timeout": { type: "string" },
      quiet: { type: "boolean" },
      help: { type: "boolean", short: "h" },
    },
  });
  if (values.help) {
    process.stdout.write(UP_HELP);
    return 0;
  }
  const kv = values["kv-transport"]!;
  if (kv !== "shm" && kv !== "tcp" && kv !== "nixl-ucx") throw new UsageError(`--kv-transport must be shm, tcp or nixl-ucx, got ${JSON.stringify(kv)}`);
  const decodeBackend = values["decode-backend"]!;
  if (decodeBackend !== "atom" && decodeBackend !== "rngd") throw new UsageError(`--decode-backend must be atom or rngd, got ${JSON.stringify(decodeBackend)}`);
  const log = (line: string) => process.stderr.write(`${line}\n`);
  let model = values.model;
  if (!model) {
    const chosen = await chooseDefaultModel();
    model = chosen.path;
    log(`airm up: ${chosen.note}`);
  }
  const port = int("--port", values.port, 8000)!;
  const cluster = await startLocalCluster({
    model,
    kvTransport: kv,
    decodeBackend,
    port,
    prefillPort: int("--prefill-port", values["prefill-port"], 8101)!,
    decodePort: int("--decode-port", values["decode-port"], 8102)!,
    relayPort: int("--relay-port", values["relay-port"], 7400)!,
    metricsPort: int("--metrics-port", values["metrics-port"]),
    seqLen: int("--seq-len", values["seq-len"], 512)!,
    readyTimeoutMs: int("--ready-timeout", values["ready-timeout"], 300)! * 1000,
    log,
    childLog: values.quiet ? () => {} : (part, line) => process.stderr.write(`${part.padEnd(8)}| ${line}\n`),
  });
  const onSignal = (sig: string) => void cluster.stop(`airm up: ${sig}: stopping every part`);
  process.once("SIGINT", () => onSignal("SIGINT"));
  process.once("SIGTERM", () => onSignal("SIGTERM"));
  const url = cluster.url;
  const modelId = await fetch(`${url}/v1/models`)
    .then((r) => r.json() as Promise<{ data?: { id: string }[] }>)
    .then((b) => b.data?.[0]?.id ?? "default")
    .catch(() => "default");
  process.stdout.write(
    [
      "",
      `rngd-pd is up: ${url}  (KV transport ${kv}, decode on ${decodeBackend})`,
      "",
      "try it:",
      `  curl -s ${url}/v1/chat/completions -H 'content-type: application/json' \\`,
      `    -d '{"model": "${modelId}", "messages": [{"role": "user", "content": "What is the capital of France?"}], "max_tokens": 32, "temperature": 0}'`,
      "",
      "or with the OpenAI client (pip install openai):",
      `  python3 -c 'from openai import OpenAI; c = OpenAI(base_url="${url}/v1", api_key="none"); print(c.chat.completions.create(model="${modelId}", messages=[{"role": "user", "content": "What is the capital of France?"}], max_tokens=32, temperature=0).choices[0].message.content)'`,
      "",
      "Ctrl-C stops the cluster.",
      "",
    ].join("\n"),
  );
  return cluster.done;
}

async function runCommand(argv: string[]): Promise<number> {
  const dash = argv.indexOf("--");
  const extra = dash >= 0 ? argv.slice(dash + 1) : [];
  const { values, positionals } = parseArgs({
    args: dash >= 0 ? argv.slice(0, dash) : argv,
    strict: true,
    allowPositionals: true,
    options: {
      model: { type: "string" },
      "batch-hint": { type: "string" },
      "kv-transport": { type: "string" },
      port: { type: "string" },
      host: { type: "string" },
      "seq-len": { type: "string" },
      backend: { type: "string" },
      "prefill-url": { type: "string" },
      "decode-url": { type: "string" },
      "metrics-port": { type: "string" },
      "dry-run": { type: "boolean" },
      help: { type: "boolean", short: "h" },
    },
  });
  if (values.help) {
    process.stdout.write(RUN_HELP);
    return 0;
  }
  const kind = positionals[0];
  if (positionals.length !== 1 || (kind !== "prefill" && kind !== "decode" && kind !== "serve")) {
    throw new UsageError("airm run takes one workload kind: prefill, decode or serve");
  }
  const config: RunConfig = { args: extra, dry_run: values["dry-run"] ?? false };
  if (values["kv-transport"]) config.kv_transport = values["kv-transport"];
  if (values.port) config.port = int("--port", values.port);
  if (values.host) config.host = values.host;
  if (values["seq-len"]) config.seq_len = int("--seq-len", values["seq-len"]);
  if (values.backend) config.backend = values.backend as RunConfig["backend"];
  if (values["prefill-url"]) config.prefill_url = values["prefill-url"];
  if (values["decode-url"]) config.decode_url = values["decode-url"];
  if (values["metrics-port"]) config.metrics_port = int("--metrics-port", values["metrics-port"]);
  const result = await run({ kind, model: values.model, batch_hint: int("--batch-hint", values["batch-hint"]) }, config);
  if ("argv" in result) {
    process.stdout.write(`${JSON.stringify(result, null, 2)}\n`);
    return 0;
  }
  for (const sig of ["SIGINT", "SIGTERM"] as const) process.once(sig, () => result.kill(sig));
  return new Promise((resolve) => result.once("exit", (code, signal) => resolve(code ?? (signal ? 1 : 0))));
}

function model(argv: string[]): number {
  const r = spawnSync(process.execPath, [binPath("@airm/llama", "airm-model"), ...argv], { stdio: "inherit" });
  return r.status ?? 1;
}

/** Runs the CLI and resolves with the exit code. */
export async function main(argv = process.argv.slice(2)): Promise<number> {
  const [cmd, ...rest] = argv;
  try {
    switch (cmd) {
      case "up":
        return await up(rest);
      case "run":
        return await runCommand(rest);
      case "model":
        return model(rest);
      case undefined:
      case "-h":
      case "--help":
      case "help":
        process.stdout.write(HELP);
        return cmd === undefined ? 2 : 0;
      default:
        process.stderr.write(`airm: unknown command ${JSON.stringify(cmd)}\n\n${HELP}`);
        return 2;
    }
  } catch (e) {
    if (e instanceof UsageError || (e as { code?: string }).code?.startsWith("ERR_PARSE_ARGS")) {
      process.stderr.write(`airm ${cmd}: ${(e as Error).message}\n`);
      return 2;
    }
    process.stderr.write(`airm ${cmd}: ${isAirmError(e) || e instanceof Error ? (e as Error).message : String(e)}\n`);
    return 1;
  }
}
