// The `airm` command line: `up` (a local PD cluster), `top` (a live console of a cluster), `run` (one workload in the foreground, as a
// pod runs it), `model` (the model tool), `k8s` (the sweep manifests) and `bench` (the load
// generator). Each subcommand has --help.

import { spawnSync } from "node:child_process";
import { isAirmError } from "@airm/rm-core";
import { binPath } from "./package-bins.ts";
import { benchCommand } from "./bench/bench-command.ts";
import { k8sCommand } from "./k8s-command.ts";
import { runCommand } from "./run-command.ts";
import { top } from "./top/top-command.ts";
import { up } from "./up-command.ts";

const HELP = `airm: run rngd-pd (prefill/decode-disaggregated LLM serving)

usage: airm <command> [options]

commands:
  up       start a whole PD cluster on 127.0.0.1 (the transport's sidecar if any, prefill, decode, gateway)
  top      a live console of a running cluster (airm up's, a gateway's, or the chart's pods with --k8s); drain a worker from it
  run      run one workload (prefill | decode | serve) in the foreground, as a pod does
  model    the model tool: pull, list, make-tiny (see "airm model --help")
  k8s      the experiment sweep: gen-sweep (deploy/k8s manifests), render (fill in the site)
  bench    load generation against an OpenAI-compatible server: load (one point), slo (attainment, goodput)

"airm <command> --help" describes every option of a command.
`;

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
      case "top":
        return await top(rest);
      case "run":
        return await runCommand(rest);
      case "model":
        return model(rest);
      case "k8s":
        return await k8sCommand(rest);
      case "bench":
        return await benchCommand(rest);
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
    if (isAirmError(e, "USAGE")) {
      process.stderr.write(`${(e as Error).message.startsWith("airm") ? "" : `airm ${cmd}: `}${(e as Error).message}\n`);
      return 2;
    }
    process.stderr.write(`airm ${cmd}: ${e instanceof Error ? e.message : String(e)}\n`);
    return 1;
  }
}
