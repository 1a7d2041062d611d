// Test harness: real processes on 127.0.0.1 (workers, gateway, KV relay), free ports, a generated
// tiny model, a per-cluster PD_SHM_ROOT, and cleanup of all of them. Used by the e2e tests and
// bench/pd-vs-solo.ts.

import { spawn, spawnSync, type ChildProcess } from "node:child_process";
import { existsSync, mkdtempSync, readdirSync, rmSync } from "node:fs";
import { createRequire } from "node:module";
import { createServer } from "node:net";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

const require = createRequire(import.meta.url);
const binOf = (pkg: string, bin: string) => join(dirname(require.resolve(`${pkg}/package.json`)), "bin", bin);
export const GATEWAY_BIN = join(dirname(fileURLToPath(import.meta.url)), "..", "bin", "airm-gateway.mjs");
export const WORKER_BIN = binOf("@airm/worker", "airm-worker.mjs");
export const MODEL_BIN = binOf("@airm/llama", "airm-model.mjs");
export const RELAY_BIN = binOf("@airm/kv-tcp", "airm-kv-relay.mjs");

/** A free TCP port on 127.0.0.1 (bound and released). */
export function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const s = createServer();
    s.once("error", reject);
    s.listen(0, "127.0.0.1", () => {
      const port = (s.address() as { port: number }).port;
      s.close(() => resolve(port));
    });
  });
}

export interface Service {
  name: string;
  proc: ChildProcess;
  url: string;
  logs(): string;
  /** SIGTERM, then SIGKILL after 3 s; resolves when the process has exited. */
  stop(signal?: NodeJS.Signals): Promise<void>;
  exited: Promise<number | null>;
}

/** Spawns `node bin args`, keeping the last 64 KiB of its output for error messages. */
export function spawnService(name: string, bin: string, args: string[], env: NodeJS.ProcessEnv, url: string): Service {
  const proc = spawn(process.execPath, [bin, ...args], { env, stdio: ["ignore", "pipe", "pipe"] });
  let out = "";
  const keep = (d: Buffer) => {
    out = (out + d.toString()).slice(-65536);
  };
  proc.stdout!.on("data", keep);
  proc.stderr!.on("data", keep);
  const exited = new Promise<number | null>((resolve) => proc.once("exit", (code) => resolve(code)));
  return {
    name,
    proc,
    url,
    logs: () => out,
    exited,
    async stop(signal = "SIGTERM") {
      if (proc.exitCode !== null || proc.signalCode !== null) return;
      proc.kill(signal);
      const t = setTimeout(() => proc.kill("SIGKILL"), 3000);
      await exited;
      clearTimeout(t);
    },
  };
}

/** Polls `url`/health until it answers 200; throws with the service's logs if it exits or never does. */
export async function waitHealthy(s: Service, path = "/health", limitMs = 180_000): Promise<void> {
  const until = Date.now() + limitMs;
  let exited = false;
  void s.exited.then(() => (exited = true));
  while (Date.now() < until) {
    if (exited) throw new Error(`${s.name} exited before it was healthy:\n${s.logs()}`);
    try {
      const r = await fetch(`${s.url}${path}`, { signal: AbortSignal.timeout(2000) });
      if (r.ok) return;
    } catch {
      // not listening yet
    }
    await new Promise((r) => setTimeout(r, 100));
  }
  throw new Error(`${s.name} was not healthy within ${limitMs} ms:\n${s.logs()}`);
}

/** Writes a generated tiny model (deterministic) into a new temp folder and returns it. */
export function makeTinyModel(args: string[] = ["--arch", "llama"]): string {
  const dir = mkdtempSync(join(tmpdir(), "airm-model-"));
  const r = spawnSync(process.execPath, [MODEL_BIN, "make-tiny", ...args, "--out", dir], { encoding: "utf8" });
  if (r.status !== 0) throw new Error(`airm-model make-tiny failed (${r.status}):\n${r.stdout}\n${r.stderr}`);
  return dir;
}

/** A fresh shm root under /dev/shm for one cluster. */
export function newShmRoot(): string {
  return mkdtempSync("/dev/shm/airm-e2e-");
}

/** Request folders (blob links) left under an shm root's keys/ folder. */
export function leftoverBlobs(root: string): string[] {
  const keys = join(root, "keys");
  if (!existsSync(keys)) return [];
  return readdirSync(keys).flatMap((rid) => {
    try {
      return readdirSync(join(keys, rid)).map((f) => `${rid}/${f}`);
    } catch {
      return [];
    }
  });
}

export interface ClusterOptions {
  mode: "pd" | "solo";
  model: string;
  prefillBackend?: string;
  decodeBackend?: string;
  soloBackend?: string;
  transport?: "shm" | "tcp" | "nixl-ucx";
  seqLen?: number;
  env?: NodeJS.ProcessEnv;
  gatewayEnv?: NodeJS.ProcessEnv;
}

export interface Cluster {
  url: string;
  metricsUrl: string;
  shmRoot: string | null;
  services: Record<string, Service>;
  stop(): Promise<void>;
}

/** Starts the KV relay (tcp, nixl-ucx), workers and a gateway; waits until all are healthy. Stops what started on failure. */
export async function startCluster(o: ClusterOptions): Promise<Cluster> {
  const services: Record<string, Service> = {};
  const shmRoot = o.mode === "pd" && (o.transport ?? "shm") === "shm" ? newShmRoot() : null;
  const env: NodeJS.ProcessEnv = { ...process.env, AIRM_LOG_LEVEL: "warn", ...o.env };
  if (shmRoot) env.PD_SHM_ROOT = shmRoot;
  env.AIRM_KV_TRANSPORT = o.transport ?? "shm";
  const stop = async () => {
    await Promise.all(Object.values(services).map((s) => s.stop()));
    if (shmRoot) rmSync(shmRoot, { recursive: true, force: true });
  };
  try {
    const seq = o.seqLen ? ["--seq-len", String(o.seqLen)] : [];
    if (o.transport === "tcp" || o.transport === "nixl-ucx") {
      const port = await freePort();
      env.AIRM_KV_TCP_ADDR = `127.0.0.1:${port}`;
      services.relay = spawnService("relay", RELAY_BIN, ["--listen", env.AIRM_KV_TCP_ADDR], env, "");
      await waitForLine(services.relay, /listening/);
    }
    const gwPort = await freePort();
    const metricsPort = await freePort();
    let gwArgs: string[];
    if (o.mode === "pd") {
      const [pp, dp] = [await freePort(), await freePort()];
      services.prefill = spawnService("prefill", WORKER_BIN, ["--role", "prefill", "--backend", o.prefillBackend ?? "rngd-full", "--port", String(pp), "--model", o.model, ...seq], env, `http://127.0.0.1:${pp}`);
      services.decode = spawnService("decode", WORKER_BIN, ["--role", "decode", "--backend", o.decodeBackend ?? "atom", "--port", String(dp), "--model", o.model, ...seq], env, `http://127.0.0.1:${dp}`);
      await Promise.all([waitHealthy(services.prefill), waitHealthy(services.decode)]);
      gwArgs = ["--prefill", services.prefill.url, "--decode", services.decode.url];
    } else {
      const sp = await freePort();
      services.solo = spawnService("solo", WORKER_BIN, ["--role", "solo", "--backend", o.soloBackend ?? "rngd", "--port", String(sp), "--model", o.model, ...seq], env, `http://127.0.0.1:${sp}`);
      await waitHealthy(services.solo);
      gwArgs = ["--solo", services.solo.url];
    }
    services.gateway = spawnService(
      "gateway",
      GATEWAY_BIN,
      ["--port", String(gwPort), "--metrics-port", String(metricsPort), ...gwArgs],
      { ...env, AIRM_HEALTH_INTERVAL_MS: "500", ...o.gatewayEnv },
      `http://127.0.0.1:${gwPort}`,
    );
    await waitHealthy(services.gateway);
    return { url: services.gateway.url, metricsUrl: `http://127.0.0.1:${metricsPort}/metrics`, shmRoot, services, stop };
  } catch (err) {
    await stop();
    throw err;
  }
}

async function waitForLine(s: Service, re: RegExp, limitMs = 30_000): Promise<void> {
  const until = Date.now() + limitMs;
  while (Date.now() < until) {
    if (re.test(s.logs())) return;
    if (s.proc.exitCode !== null) break;
    await new Promise((r) => setTimeout(r, 50));
  }
  throw new Error(`${s.name} did not print ${re}:\n${s.logs()}`);
}

/** POSTs JSON and returns status + parsed body. */
export async function postJson(url: string, body: unknown): Promise<{ status: number; body: any }> {
  const r = await fetch(url, { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify(body) });
  const text = await r.text();
  let parsed: unknown = text;
  try {
    parsed = JSON.parse(text);
  } catch {
    // keep text
  }
  return { status: r.status, body: parsed };
}

/** Reads an SSE response into its data payloads (parsed JSON, or the raw "[DONE]"). */
export async function readSse(r: Response): Promise<unknown[]> {
  const text = await r.text();
  return text
    .split("\n\n")
    .map((b) => b.trim())
    .filter((b) => b.startsWith("data: "))
    .map((b) => b.slice(6))
    .map((d) => (d === "[DONE]" ? d : JSON.parse(d)));
}

export interface TokenRun {
  promptTokens: number;
  tokens: number[];
  text: string;
  finishReason: string;
}

async function ndjsonEvents(r: Response): Promise<Record<string, any>[]> {
  const text = await r.text();
  return text
    .split("\n")
    .filter((l) => l.trim())
    .map((l) => JSON.parse(l));
}

function collect(first: { first_token: number; first_text: string; prompt_tokens: number }, events: Record<string, any>[]): TokenRun {
  const err = events.find((e) => e.type === "error");
  if (err) throw new Error(`worker error ${err.code}: ${err.message}`);
  const done = events.find((e) => e.type === "done");
  if (!done) throw new Error(`stream ended without done: ${JSON.stringify(events.slice(-2))}`);
  const toks = events.filter((e) => e.type === "token");
  const tokens = [first.first_token, ...toks.map((e) => e.token)];
  if (done.finish_reason === "stop" && done.completion_tokens === tokens.length + 1) tokens.push(-1); // the EOS, not shown
  return {
    promptTokens: first.prompt_tokens,
    tokens,
    text: first.first_text + toks.map((e) => e.text).join("") + done.text,
    finishReason: done.finish_reason,
  };
}

/** One request through a solo worker's internal API: the token ids it generates. */
export async function soloTokens(soloUrl: string, body: Record<string, unknown>): Promise<TokenRun> {
  const r = await fetch(`${soloUrl}/internal/generate`, { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify(body) });
  if (!r.ok) throw new Error(`solo answered ${r.status}: ${await r.text()}`);
  const events = await ndjsonEvents(r);
  const first = events.find((e) => e.type === "first");
  if (!first) throw new Error(`no first event: ${JSON.stringify(events[0])}`);
  return collect(first as any, events);
}

/** One request through a prefill and a decode worker's internal API (decode sent first: prefetch). */
export async function pdTokens(prefillUrl: string, decodeUrl: string, body: Record<string, unknown>): Promise<TokenRun> {
  const decode = fetch(`${decodeUrl}/internal/decode`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify({ request_id: body.request_id, max_tokens: body.max_tokens ?? null, sampling: body.sampling ?? {} }),
  });
  const p = await fetch(`${prefillUrl}/internal/prefill`, { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify(body) });
  const pb = (await p.json()) as any;
  if (!p.ok) throw new Error(`prefill answered ${p.status}: ${JSON.stringify(pb)}`);
  const d = await decode;
  if (!d.ok) throw new Error(`decode answered ${d.status}: ${await d.text()}`);
  const run = collect(pb, await ndjsonEvents(d));
  await fetch(`${prefillUrl}/internal/release`, { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify({ request_id: body.request_id }) });
  return run;
}

/** Waits (up to `limitMs`) for the shm root to hold no blob, then returns what is left (empty when clean). */
export async function settledLeftovers(root: string, limitMs = 20_000): Promise<string[]> {
  const until = Date.now() + limitMs;
  let left = leftoverBlobs(root);
  while (left.length && Date.now() < until) {
    await new Promise((r) => setTimeout(r, 100));
    left = leftoverBlobs(root);
  }
  return left;
}

/** Starts one worker process and waits until it is healthy. */
export async function startWorkerProc(role: string, backend: string, model: string, env: NodeJS.ProcessEnv, seqLen?: number): Promise<Service> {
  const port = await freePort();
  const s = spawnService(
    role,
    WORKER_BIN,
    ["--role", role, "--backend", backend, "--port", String(port), "--model", model, ...(seqLen ? ["--seq-len", String(seqLen)] : [])],
    { ...process.env, AIRM_LOG_LEVEL: "warn", ...env },
    `http://127.0.0.1:${port}`,
  );
  try {
    await waitHealthy(s);
  } catch (err) {
    await s.stop();
    throw err;
  }
  return s;
}
