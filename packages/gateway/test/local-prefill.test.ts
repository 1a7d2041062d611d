// Not disaggregating a request: with --local-prefill a gateway runs a request that no endpoint
// picker gave a prefill pod (no x-prefiller-host-port) whole on its decode worker, which then
// serves /internal/generate too (airm-worker --local-prefill). Real in-process workers on a tiny
// model, KV over a real shm root: the local answer is token-identical to the disaggregated one,
// the prefill worker is not called, and a decode worker without the flag refuses /generate.
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { makeTinyModel } from "@airm/llama";
import { startWorker, type RunningWorker } from "@airm/worker";
import pino from "pino";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { startGateway, type RunningGateway } from "../src/index.ts";

const S = 64;
const root = mkdtempSync(join(tmpdir(), "airm-gateway-local-"));
const model = join(root, "model");
const env = { AIRM_ENGINE_LOG: "0", AIRM_ARTIFACT_CACHE: "off", PD_SHM_ROOT: `/dev/shm/airm-gateway-local-${process.pid}` };
const logger = pino({ level: "silent" });
const workers: RunningWorker[] = [];
let prefill: RunningWorker;
let decode: RunningWorker;
let plainDecode: RunningWorker;
let gw: RunningGateway;
let id: string;

async function start(role: "prefill" | "decode", backend: string, localPrefill = false): Promise<RunningWorker> {
  const w = await startWorker({ role, backend, model, port: 0, seqLen: S, env, logger, localPrefill });
  workers.push(w);
  await w.ready;
  return w;
}

/** Requests a worker answered on `route` with outcome ok. */
async function served(w: RunningWorker, route: string): Promise<number> {
  const text = await (await fetch(`${w.url}/metrics`)).text();
  return Number(new RegExp(`^airm_worker_requests_total\\{route="${route}",outcome="ok"[^}]*\\} (\\d+)$`, "m").exec(text)?.[1] ?? 0);
}

async function complete(headers: Record<string, string> = {}): Promise<string> {
  const r = await fetch(`${gw.url}/v1/completions`, {
    method: "POST",
    headers: { "content-type": "application/json", ...headers },
    body: JSON.stringify({ model: id, prompt: "short prompts stay", max_tokens: 12, temperature: 0 }),
  });
  const body = (await r.json()) as any;
  expect(r.status, JSON.stringify(body)).toBe(200);
  return body.choices[0].text;
}

beforeAll(async () => {
  makeTinyModel({ arch: "llama", out: model, layers: 2, seed: 5 });
  [prefill, decode, plainDecode] = await Promise.all([start("prefill", "rngd-full"), start("decode", "atom", true), start("decode", "atom")]);
  gw = await startGateway({ port: 0, prefill: [prefill.url], decode: [decode.url], localPrefill: true });
  id = ((await (await fetch(`${gw.url}/v1/models`)).json()) as { data: { id: string }[] }).data[0]!.id;
});
afterAll(async () => {
  await gw?.close();
  await Promise.all(workers.map((w) => w.close()));
  rmSync(root, { recursive: true, force: true });
  rmSync(env.PD_SHM_ROOT, { recursive: true, force: true });
});

describe("--local-prefill", () => {
  it("runs a request without x-prefiller-host-port whole on the decode worker, token-identical to the disaggregated run", async () => {
    const before = { prefill: await served(prefill, "prefill"), generate: await served(decode, "generate"), decode: await served(decode, "decode") };
    const local = await complete();
    expect(await served(prefill, "prefill")).toBe(before.prefill);
    expect(await served(decode, "generate")).toBe(before.generate + 1);
    const disaggregated = await complete({ "x-prefiller-host-port": prefill.url.replace(/^http:\/\//, "") });
    expect(await served(prefill, "prefill")).toBe(before.prefill + 1);
    expect(await served(decode, "decode")).toBe(before.decode + 1);
    expect(local).toBe(disaggregated);
    expect(local.length).toBeGreaterThan(0);
  });

  it("a decode worker started without it has no /internal/generate; the flag is refused on other roles", async () => {
    const r = await fetch(`${plainDecode.url}/internal/generate`, { method: "POST", headers: { "content-type": "application/json" }, body: "{}" });
    expect(r.status).toBe(404);
    expect(((await r.json()) as any).error.code).toBe("wrong_role");
    await expect(startWorker({ role: "prefill", backend: "rngd-full", model, port: 0, env, logger, localPrefill: true })).rejects.toThrow(/--local-prefill.*decode workers/);
    await expect(startGateway({ port: 0, solo: [plainDecode.url], localPrefill: true })).rejects.toThrow(/--local-prefill/);
  });
});
