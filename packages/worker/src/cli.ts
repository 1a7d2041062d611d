// `airm-worker`: parses the command line (node:util parseArgs) and environment, starts a worker
// and stops it on SIGINT/SIGTERM. Exits non-zero with the reason when the engine cannot load.

import { parseArgs } from "node:util";
import { isAirmError, untilStopSignal } from "@airm/rm-core";
import { startWorker } from "./worker-server.ts";
import type { Role } from "./worker-app.ts";

const HELP = `airm-worker: an rngd-pd worker process (prefill, decode or solo)

usage: airm-worker --role prefill|decode|solo --backend rngd|rngd-chunk|rngd-full|atom
                   [--chip N] [--port P] [--model DIR] [--seq-len S] [--B n]

  --role R          prefill: tokenizes, prefills, pushes KV layer by layer, answers the first token
                    decode:  pulls KV (prefetching while prefill runs), checks it, decodes
                    solo:    prefill and decode in one process, no transport (the reference)
  --backend B       rngd-full (whole prompt), rngd-chunk (chunked prefill), rngd (resident cache),
                    atom (cache as a host input each step)
  --chip N          card ordinal among the visible cards; -1 reads this pod's allocation (default 0)
  --port P          HTTP port (default 8101; 0 picks a free port)
  --host H          address to listen on (default 127.0.0.1)
  --model DIR       model folder (default: $MODEL)
  --seq-len S       compiled context S (default: the engine's)
  --B n             batch width (default: the engine's)
  --threads n       CPU threads of the reference backend (default 1)
  --kv-transport T  KV transport name (default: $AIRM_KV_TRANSPORT, else shm)
  -h, --help        this text

environment: MODEL, AIRM_KV_TRANSPORT, PD_SHM_ROOT, AIRM_KV_TCP_ADDR, AIRM_KV_LEASE_TTL_S (120),
AIRM_LOG_LEVEL (info). API: docs/internal-api.md.
`;

function int(name: string, v: string | undefined, min: number): number | undefined {
  if (v === undefined) return undefined;
  const n = Number(v);
  if (!Number.isInteger(n) || n < min) throw new Error(`${name} must be an integer >= ${min}, got ${JSON.stringify(v)}`);
  return n;
}

/** Runs the CLI; resolves with the exit code once the worker stopped (or failed). */
export async function main(argv = process.argv.slice(2), env = process.env): Promise<number> {
  let opts;
  // `--chip -1` (as the seed writes it): parseArgs would read "-1" as an option.
  const args = argv.flatMap((a, i) => (a === "--chip" && /^-\d+$/.test(argv[i + 1] ?? "") ? [] : i > 0 && argv[i - 1] === "--chip" && /^-\d+$/.test(a) ? [`--chip=${a}`] : [a]));
  try {
    const { values } = parseArgs({
      args,
      options: {
        role: { type: "string" },
        backend: { type: "string" },
        chip: { type: "string", default: "0" },
        port: { type: "string", default: "8101" },
        host: { type: "string", default: "127.0.0.1" },
        model: { type: "string" },
        "seq-len": { type: "string" },
        B: { type: "string" },
        threads: { type: "string" },
        "kv-transport": { type: "string" },
        help: { type: "boolean", short: "h" },
      },
      strict: true,
    });
    if (values.help) {
      console.log(HELP);
      return 0;
    }
    if (!values.role) throw new Error("--role is required (prefill, decode or solo)");
    if (!values.backend) throw new Error("--backend is required (rngd, rngd-chunk, rngd-full or atom)");
    const model = values.model ?? env.MODEL;
    if (!model) throw new Error("--model is required (or set MODEL): a model folder, e.g. one written by `airm-model make-tiny`");
    opts = {
      role: values.role as Role,
      backend: values.backend,
      model,
      chip: int("--chip", values.chip, -1),
      port: int("--port", values.port, 0)!,
      host: values.host,
      seqLen: int("--seq-len", values["seq-len"], 1),
      batch: int("--B", values.B, 1),
      threads: int("--threads", values.threads, 1),
      kvTransport: values["kv-transport"],
      env,
    };
  } catch (err) {
    console.error(`airm-worker: ${(err as Error).message}\n\n${HELP}`);
    return 2;
  }
  let w;
  try {
    w = await startWorker(opts);
    await w.ready;
  } catch (err) {
    console.error(`airm-worker: ${isAirmError(err) ? `${err.code}: ${err.message}` : (err as Error).message}`);
    await w?.close().catch(() => {});
    return 1;
  }
  await untilStopSignal();
  await w.close();
  return 0;
}
