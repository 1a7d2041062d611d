// Precise prefix routing in the endpoint picker (airm-epp --routing prefix): two "pods", each a real solo
// worker (tiny model, blocks of 8, KV events on Unix sockets) behind a real gateway, listed in an
// endpoints file with their workers' event sockets. Through a stub Envoy over real gRPC, a prompt
// that continues one served before goes to the pod whose worker holds its blocks, though the other
// pod is as idle; with --routing load the ties rotate and it does not. A picker that restarts
// rebuilds its index from the replay.
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { type Epp, type PickerRouting, StaticEndpoints, startEpp } from "@airm/epp";
import { EnvoyStub } from "@airm/epp/testing";
import { makeTinyModel } from "@airm/llama";
import { startWorker, type RunningWorker } from "@airm/worker";
import pino from "pino";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { type RunningGateway, startGateway } from "../src/index.ts";

const root = mkdtempSync(join(tmpdir(), "airm-epp-precise-"));
const model = join(root, "model");
const env = { AIRM_ENGINE_LOG: "0", AIRM_ARTIFACT_CACHE: "off", AIRM_BLOCK_SIZE: "8" };
const logger = pino({ level: "silent" });
const pods: { worker: RunningWorker; gateway: RunningGateway; events: string; replay: string }[] = [];
const closers: (() => unknown)[] = [];
let file: string;
let id: string;

async function pod(name: string) {
  const events = `ipc://${join(root, `${name}-pub.sock`)}`;
  const replay = `ipc://${join(root, `${name}-replay.sock`)}`;
  const kvEventsConfig = JSON.stringify({ enable_kv_cache_events: true, endpoint: events, replay_endpoint: replay, topic: `kv@${name}` });
  const worker = await startWorker({ role: "solo", backend: "rngd", model, port: 0, maxModelLen: 64, env, logger, kvEventsConfig });
  await worker.ready;
  // The pod's gateway routes by load: the picker is what is tested.
  const gateway = await startGateway({ port: 0, solo: [worker.url], routing: "load" });
  return { worker, gateway, events, replay };
}

async function picker(routing: PickerRouting): Promise<{ epp: Epp; envoy: EnvoyStub }> {
  const epp = await startEpp({ source: new StaticEndpoints(file, { pollMs: 25 }), grpcPort: 0, scrapeIntervalMs: 20, picker: { routing } });
  await epp.scraper.settled();
  const envoy = new EnvoyStub(epp.address);
  closers.push(
    () => envoy.close(),
    () => epp.close(),
  );
  return { epp, envoy };
}

/** The pod Envoy is told to send `prompt` to (index into pods). */
async function route(envoy: EnvoyStub, prompt: number[]): Promise<number> {
  const a = await envoy.request({ body: { model: id, prompt, max_tokens: 4 } });
  const at = a.setHeaders["x-gateway-destination-endpoint"];
  const i = pods.findIndex((p) => p.gateway.url.endsWith(at));
  expect(i, `routed to ${at}`).toBeGreaterThanOrEqual(0);
  return i;
}

/** Serves `prompt` on pod `i` (as Envoy would after the pick); the worker keeps its blocks. */
async function serve(i: number, prompt: number[]): Promise<void> {
  const r = await fetch(`${pods[i].gateway.url}/v1/completions`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify({ model: id, prompt, max_tokens: 4, temperature: 0, ignore_eos: true }),
  });
  expect(r.status).toBe(200);
  await r.text();
}

/** Waits until the picker's index holds `n` blocks of pod `i`. */
async function indexed(epp: Epp, i: number, n: number): Promise<void> {
  const key = new URL(pods[i].gateway.url).host;
  for (let k = 0; k < 200 && epp.events!.index.blocksOf(key) < n; k++) await new Promise((r) => setTimeout(r, 20));
  expect(epp.events!.index.blocksOf(key)).toBeGreaterThanOrEqual(n);
}

const prompt = (seed: number) => Array.from({ length: 24 }, (_, i) => 5 + ((seed * 11 + i * 5) % 100));

beforeAll(async () => {
  makeTinyModel({ arch: "llama", out: model, layers: 2, seed: 12 });
  pods.push(await pod("a"), await pod("b"));
  id = ((await (await fetch(`${pods[0].gateway.url}/v1/models`)).json()) as { data: { id: string }[] }).data[0]!.id;
  file = join(root, "endpoints.json");
  writeFileSync(file, JSON.stringify(pods.map((p, i) => ({ address: "127.0.0.1", port: p.gateway.port, role: "both", name: `pod-${i}`, kvEvents: p.events, kvReplay: p.replay }))));
}, 120_000);
afterAll(async () => {
  for (const c of closers.reverse()) await c();
  for (const p of pods) {
    await p.gateway.close();
    await p.worker.close();
  }
  rmSync(root, { recursive: true, force: true });
});

describe("--routing prefix", () => {
  it("sends a prompt to the pod whose worker holds its blocks, turn after turn; load does not", async () => {
    const { epp, envoy } = await picker("prefix");
    // Each pod serves a conversation of its own first (by hand: the picker sees idle equals).
    await serve(0, prompt(1));
    await serve(1, prompt(2));
    await indexed(epp, 0, 3);
    await indexed(epp, 1, 3);
    const picks: number[] = [];
    for (let turn = 0; turn < 3; turn++) {
      picks.push(await route(envoy, [...prompt(2), 7, 8, turn]));
      picks.push(await route(envoy, [...prompt(1), 9, 10, turn]));
    }
    expect(picks).toEqual([1, 0, 1, 0, 1, 0]);
    expect(epp.events!.counts.lookups).toBe(6);

    const load = await picker("load");
    const rotated: number[] = [];
    for (let turn = 0; turn < 3; turn++) rotated.push(await route(load.envoy, [...prompt(2), 7, 8, turn]));
    expect(new Set(rotated).size).toBe(2);
  });

  it("a picker that restarts rebuilds its index from the workers' replay", async () => {
    const { epp, envoy } = await picker("prefix");
    await indexed(epp, 0, 3);
    await indexed(epp, 1, 3);
    expect(await route(envoy, [...prompt(1), 1, 2, 3])).toBe(0);
    expect(epp.events!.eventCounts().replays).toBeGreaterThanOrEqual(2);
  });
});
