// `airm run prefill|decode|serve`: one rngd-pd workload in the foreground, as a pod's entry point
// runs it (the workload runner's buildCommand), or its command line with --dry-run.

import { defineCommand, flagOf, int, switchOf, text, UsageError } from "@airm/rm-core";
import { DEFAULT_KV_TRANSPORT } from "./defaults.ts";
import { run, type RunConfig } from "./rngd-pd-workload.ts";

export const RUN_COMMAND = defineCommand({
  name: "airm run",
  summary: "one rngd-pd workload in the foreground (what a pod's entry point runs)",
  usage: ["airm run prefill|decode|serve [--model PATH] [options] [-- extra worker/gateway args]"],
  positionals: { min: 0, max: 1 },
  flags: {
    model: flagOf(text({ label: "path" }), { doc: "model folder or .gguf (becomes MODEL)" }),
    batchHint: flagOf(int({ min: 1, max: 1024 }), { doc: "decode only: batch width (becomes --B)" }),
    kvTransport: flagOf(text({ label: "name" }), { defaultText: DEFAULT_KV_TRANSPORT, doc: "AIRM_KV_TRANSPORT: an installed KV transport" }),
    port: flagOf(int({ min: 0, max: 65535 }), { defaultText: "8000", doc: "HTTP port" }),
    host: flagOf(text({ label: "address" }), { defaultText: "0.0.0.0", doc: "listen address" }),
    maxModelLen: flagOf(int({ min: 8 }), { defaultText: "the model's context", doc: "the longest request (prompt + max_tokens) served" }),
    backend: flagOf(text({ label: "name" }), { defaultText: "rngd-full (prefill), atom (decode)", doc: "engine backend" }),
    prefillUrl: flagOf(text({ label: "URL" }), { defaultText: "http://127.0.0.1:8101", doc: "serve only: prefill worker" }),
    decodeUrl: flagOf(text({ label: "URL" }), { defaultText: "http://127.0.0.1:8102", doc: "serve only: decode worker" }),
    metricsPort: flagOf(int({ min: 0, max: 65535 }), { doc: "serve only: airm_* metrics port (AIRM_METRICS_PORT)" }),
    dryRun: switchOf({ doc: "print the command line and environment instead of running" }),
  },
});

/** Runs `airm run`; resolves with the workload's exit code. */
export async function runCommand(argv: string[]): Promise<number> {
  const dash = argv.indexOf("--");
  const extra = dash >= 0 ? argv.slice(dash + 1) : [];
  const { values: f, positionals, help } = RUN_COMMAND.parse(dash >= 0 ? argv.slice(0, dash) : argv);
  if (help) {
    process.stdout.write(RUN_COMMAND.help());
    return 0;
  }
  const kind = positionals[0];
  if (kind !== "prefill" && kind !== "decode" && kind !== "serve") throw new UsageError("airm run takes one workload kind: prefill, decode or serve");
  const config: RunConfig = { args: extra, dry_run: f.dryRun };
  if (f.kvTransport) config.kv_transport = f.kvTransport;
  if (f.port !== undefined) config.port = f.port;
  if (f.host) config.host = f.host;
  if (f.maxModelLen !== undefined) config.max_model_len = f.maxModelLen;
  if (f.backend) config.backend = f.backend;
  if (f.prefillUrl) config.prefill_url = f.prefillUrl;
  if (f.decodeUrl) config.decode_url = f.decodeUrl;
  if (f.metricsPort !== undefined) config.metrics_port = f.metricsPort;
  const result = await run({ kind, model: f.model, batch_hint: f.batchHint }, config);
  if ("argv" in result) {
    process.stdout.write(`${JSON.stringify(result, null, 2)}\n`);
    return 0;
  }
  for (const sig of ["SIGINT", "SIGTERM"] as const) process.once(sig, () => result.kill(sig));
  return new Promise((resolve) => result.once("exit", (code, signal) => resolve(code ?? (signal ? 1 : 0))));
}
