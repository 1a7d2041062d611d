// Helpers of the end-to-end tests: clusters through the one launcher on free ports with a
// generated tiny model, calls to the workers' internal API through the contract's client, and
// checks that nothing of a request is left: no KV blob in a cluster folder, no slab of a dead
// process, no lease or used KV block on a live worker.

import { existsSync, mkdtempSync, readdirSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { WorkerClient, type DecodeRequest, type GenerateRequest, type PrefillRequest, type WorkerEvent } from "@airm/internal-api";
import { makeTinyModel, type TinyModelOptions } from "@airm/llama";
import type { TlsMaterial } from "@airm/rm-core";
import { startLocalCluster, type ClusterOptions, type RunningCluster, type WorkerSpec } from "../../src/index.ts";

/** A generated tiny model (deterministic) in a new temp folder. */
export function tinyModel(o: Omit<TinyModelOptions, "out"> = { arch: "llama" }): string {
  const out = mkdtempSync(join(tmpdir(), "airm-model-"));
  makeTinyModel({ ...o, out });
  return out;
}

/**
 * The shape of the e2e tests' slow model: big enough that prefill and a long decode take seconds
 * on the CPU path, so a fault or a signal lands mid-request (`tinyModel(SLOW_MODEL)`).
 */
export const SLOW_MODEL: Omit<TinyModelOptions, "out"> = { arch: "llama", layers: 8, hidden: 512, heads: 8, kvHeads: 2, intermediate: 1536 };

const freePorts = (specs: WorkerSpec[] | undefined) => (specs ?? [{}]).map((s) => ({ port: 0, ...s }));

/**
 * A cluster on free ports that keeps running when a part dies (tests kill parts on purpose), with
 * quiet workers and a fast health probe. Its output is kept per part (part.logs()).
 */
export function cluster(o: ClusterOptions): Promise<RunningCluster> {
  return startLocalCluster({
    port: 0,
    sidecarPort: 0,
    onPartExit: "keep",
    readyTimeoutMs: 180_000,
    ...o,
    prefill: freePorts(o.prefill),
    decode: freePorts(o.decode),
    solo: freePorts(o.solo),
    env: { AIRM_LOG_LEVEL: "warn", AIRM_ENGINE_LOG: "0", ...o.env },
    gatewayEnv: { AIRM_HEALTH_INTERVAL_MS: "500", ...o.gatewayEnv },
  });
}

/** POSTs JSON and returns status + parsed body. */
export async function postJson(url: string, body: unknown, headers: Record<string, string> = {}): Promise<{ status: number; body: any }> {
  const r = await fetch(url, { method: "POST", headers: { "content-type": "application/json", ...headers }, body: JSON.stringify(body) });
  const text = await r.text();
  try {
    return { status: r.status, body: JSON.parse(text) };
  } catch {
    return { status: r.status, body: text };
  }
}

/** Reads an SSE response into its data payloads (parsed JSON, or the raw "[DONE]"). */
export async function readSse(r: Response): Promise<unknown[]> {
  return (await r.text())
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

async function collect(first: { token: number; text: string; promptTokens: number }, events: AsyncGenerator<WorkerEvent>): Promise<TokenRun> {
  const tokens = [first.token];
  let text = first.text;
  for await (const ev of events) {
    if (ev.type === "error") throw new Error(`worker error ${ev.code}: ${ev.message}`);
    if (ev.type === "token") {
      tokens.push(ev.token);
      text += ev.text;
    }
    if (ev.type === "done") {
      if (ev.finishReason === "stop" && ev.completionTokens === tokens.length + 1) tokens.push(-1); // the EOS, not shown
      return { promptTokens: first.promptTokens, tokens, text: text + ev.text, finishReason: ev.finishReason };
    }
  }
  throw new Error("the stream ended without a done event");
}

/** One request through a solo worker's internal API (with the cluster's internal token and TLS material): the token ids it generates. */
export async function soloTokens(soloUrl: string, body: GenerateRequest, token?: string, tls?: TlsMaterial): Promise<TokenRun> {
  const events = (await new WorkerClient(soloUrl, undefined, { token, tls }).generate(body)).events(120_000);
  const first = await events.next();
  if (first.done || first.value.type !== "first") throw new Error(`no first event: ${JSON.stringify(first.value)}`);
  return collect(first.value, events);
}

/** One request through a prefill and a decode worker's internal API (decode sent first: prefetch), over mutual TLS with `tls`. */
export async function pdTokens(prefillUrl: string, decodeUrl: string, body: PrefillRequest, token?: string, tls?: TlsMaterial): Promise<TokenRun> {
  const decodeBody: DecodeRequest = { requestId: body.requestId, maxTokens: body.maxTokens, sampling: body.sampling };
  const decode = new WorkerClient(decodeUrl, undefined, { token, tls }).decode(decodeBody);
  decode.catch(() => {});
  const prefill = new WorkerClient(prefillUrl, undefined, { token, tls });
  const p = await prefill.prefill(body);
  const run = await collect(p.first, (await decode).events(120_000));
  await prefill.release({ requestId: body.requestId });
  return run;
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

/** Waits until `cond` holds, checking every `everyMs`; throws naming `what` after `limitMs`. */
export async function until(cond: () => Promise<boolean> | boolean, what: string, limitMs = 60_000, everyMs = 20): Promise<void> {
  const end = Date.now() + limitMs;
  while (Date.now() < end) {
    if (await cond()) return;
    await new Promise((r) => setTimeout(r, everyMs));
  }
  throw new Error(`timed out waiting for ${what}`);
}

/** The model id a cluster's gateway serves (the first of /v1/models). */
export async function modelId(c: RunningCluster): Promise<string> {
  return ((await (await fetch(`${c.url}/v1/models`)).json()) as { data: { id: string }[] }).data[0].id;
}

/** A worker's /health body. */
export async function health(url: string): Promise<any> {
  return (await fetch(`${url}/health`)).json();
}

/** Slab files under an shm root whose owning process is gone (a slab is named slab-<pid>-...). */
export function deadSlabs(root: string): string[] {
  if (!existsSync(root)) return [];
  return readdirSync(root).filter((f) => {
    const m = /^\.?(?:new-)?slab-(\d+)-/.exec(f);
    if (!m) return false;
    try {
      process.kill(Number(m[1]), 0);
      return false;
    } catch {
      return true;
    }
  });
}

/** What a live worker still holds: open leases and KV blocks in use (0 and 0 when a request left nothing). */
async function held(url: string): Promise<{ leases: number; blocks: number }> {
  const h = await health(url);
  return { leases: h.leases.outstanding, blocks: h.kvCache?.usedBlocks ?? 0 };
}

/**
 * Waits (up to `limitMs`) until nothing of any request is left in a cluster: every live worker has
 * no open lease and no KV block in use, and its shm root (when it has one) holds no KV link and no
 * dead process's slab (the live endpoints sweep those every few seconds). Throws naming what is left.
 */
export async function expectNothingLeft(c: RunningCluster, limitMs = 20_000): Promise<void> {
  const workers = c.parts.filter((p) => p.alive && /^(prefill|decode|solo)/.test(p.name));
  const left = async () => {
    const out: string[] = [];
    for (const w of workers) {
      const h = await held(w.url);
      if (h.leases || h.blocks) out.push(`${w.name}: ${h.leases} lease(s), ${h.blocks} block(s)`);
    }
    if (c.clusterDir) out.push(...leftoverBlobs(c.clusterDir), ...deadSlabs(c.clusterDir));
    return out;
  };
  const end = Date.now() + limitMs;
  let now = await left();
  while (now.length && Date.now() < end) {
    await new Promise((r) => setTimeout(r, 100));
    now = await left();
  }
  if (now.length) throw new Error(`left after the request: ${now.join("; ")}`);
}
