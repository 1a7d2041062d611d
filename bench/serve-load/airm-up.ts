// Starts and stops `airm up` for the serving benches: free ports, extra flags, and the URL once
// the launcher says the cluster is up.
import { type ChildProcess, spawn } from "node:child_process";
import { performance } from "node:perf_hooks";
import { fileURLToPath } from "node:url";
import { freePort } from "../../packages/workload-runner/src/cluster-plan.ts";

export interface RunningUp {
  url: string;
  child: ChildProcess;
  /** Seconds from spawn to "rngd-pd is up". */
  startS: number;
  /** The launcher's "airm up: ..." configuration lines. */
  config: string[];
  /** The first decode worker's port (replica i listens on it + 2i). */
  decodePort: number;
}

/** Starts `airm up` with its defaults plus `extra` flags on free ports; resolves once it is up. */
export async function startAirmUp(extra: string[] = [], env: NodeJS.ProcessEnv = process.env): Promise<RunningUp> {
  const bin = fileURLToPath(new URL("../../packages/workload-runner/bin/airm.mjs", import.meta.url));
  const [port, pre, dec] = [await freePort(), await freePort(), await freePort()];
  const t0 = performance.now();
  const child = spawn(process.execPath, [bin, "up", "--port", String(port), "--prefill-port", String(pre), "--decode-port", String(dec), "--quiet", ...extra], {
    stdio: ["ignore", "pipe", "pipe"],
    env,
  });
  const lines: string[] = [];
  return new Promise((resolve, reject) => {
    const onLine = (chunk: Buffer) => {
      for (const l of chunk.toString().split("\n")) {
        if (!l.trim()) continue;
        lines.push(l);
        const m = /rngd-pd is up: (\S+)/.exec(l);
        if (m) resolve({ url: m[1]!, child, startS: (performance.now() - t0) / 1000, config: lines.filter((x) => x.startsWith("airm up:")), decodePort: dec });
      }
    };
    child.stdout.on("data", onLine);
    child.stderr.on("data", onLine);
    child.on("exit", (code) => reject(new Error(`airm up exited ${code} before it was up:\n${lines.slice(-20).join("\n")}`)));
  });
}

/** SIGTERM, then SIGKILL after 15 s. */
export async function stopChild(child: ChildProcess): Promise<void> {
  if (child.exitCode !== null) return;
  const gone = new Promise((r) => child.once("exit", r));
  child.kill("SIGTERM");
  await Promise.race([gone, new Promise((r) => setTimeout(r, 15_000))]);
  if (child.exitCode === null) child.kill("SIGKILL");
}

/** The id of the first model the server lists. */
export async function modelId(url: string): Promise<string> {
  const r = (await (await fetch(`${url}/v1/models`)).json()) as { data: { id: string }[] };
  return r.data[0]!.id;
}
