// airm-kv-relay as a real child process (stdout/stderr captured), for launchers, tests and
// benches that need a relay of their own.

import { spawn, type ChildProcess } from "node:child_process";
import { once } from "node:events";
import { fileURLToPath } from "node:url";

const relayBin = fileURLToPath(new URL("../bin/airm-kv-relay.mjs", import.meta.url));

export interface RelayProcess {
  proc: ChildProcess;
  address: string;
  port: number;
  stdout(): string;
  stderr(): string;
  stop(): Promise<number | null>;
}

/**
 * Starts `airm-kv-relay` with `args` and resolves once it prints its listening line. `wrap` runs it
 * through another command (e.g. ["ip", "netns", "exec", NAME]).
 */
export async function spawnRelay(args: string[], env: NodeJS.ProcessEnv = {}, wrap: string[] = []): Promise<RelayProcess> {
  const argv = [...wrap, process.execPath, relayBin, ...args];
  const proc = spawn(argv[0], argv.slice(1), { stdio: ["ignore", "pipe", "pipe"], env: { ...process.env, ...env } });
  let err = "";
  let out = "";
  proc.stderr!.on("data", (d: Buffer) => (err += d.toString()));
  const address = await new Promise<string>((resolve, reject) => {
    proc.stdout!.on("data", (d: Buffer) => {
      out += d.toString();
      const m = /listening on (\S+)/.exec(out);
      if (m) resolve(m[1]);
    });
    proc.once("exit", (code) => reject(new Error(`airm-kv-relay exited with ${code} before listening: ${err}`)));
  });
  return {
    proc,
    address,
    port: Number(address.slice(address.lastIndexOf(":") + 1)),
    stdout: () => out,
    stderr: () => err,
    async stop() {
      if (proc.exitCode !== null) return proc.exitCode;
      proc.kill("SIGTERM");
      const [code] = (await once(proc, "exit")) as [number | null];
      return code;
    },
  };
}
