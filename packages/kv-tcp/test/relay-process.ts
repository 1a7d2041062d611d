// Test plumbing: airm-kv-relay as a real child process (stdout/stderr captured), and a TCP proxy
// that can flip one byte of the stream in either direction.

import { spawn, type ChildProcess } from "node:child_process";
import { once } from "node:events";
import net from "node:net";
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

export interface FlipProxy {
  address: string;
  close(): Promise<void>;
}

/**
 * A TCP proxy to `target` that XORs the byte at stream offset `at` of the first connection, in the
 * client-to-relay direction ("up") or relay-to-client ("down"), with 0xff. Everything else passes through.
 */
export async function startFlipProxy(target: { host: string; port: number }, direction: "up" | "down", at: number): Promise<FlipProxy> {
  let flipped = false;
  const sockets = new Set<net.Socket>();
  const flipper = () => {
    let seen = 0;
    return (chunk: Buffer): Buffer => {
      if (!flipped && at >= seen && at < seen + chunk.length) {
        chunk[at - seen] ^= 0xff;
        flipped = true;
      }
      seen += chunk.length;
      return chunk;
    };
  };
  const server = net.createServer((client) => {
    const upstream = net.connect(target.port, target.host);
    sockets.add(client).add(upstream);
    const up = direction === "up" ? flipper() : (c: Buffer) => c;
    const down = direction === "down" ? flipper() : (c: Buffer) => c;
    client.on("data", (c: Buffer) => upstream.write(up(c)));
    upstream.on("data", (c: Buffer) => client.write(down(c)));
    const end = () => {
      client.destroy();
      upstream.destroy();
    };
    client.on("close", end).on("error", end);
    upstream.on("close", end).on("error", end);
  });
  server.listen(0, "127.0.0.1");
  await once(server, "listening");
  return {
    address: `127.0.0.1:${(server.address() as net.AddressInfo).port}`,
    async close() {
      for (const s of sockets) s.destroy();
      await new Promise((r) => server.close(r));
    },
  };
}
