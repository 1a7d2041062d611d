// KV events in vLLM's wire format from a real worker (generated tiny model) over real ZMQ sockets:
// a SUB consumer gets each batch as [topic, 8-byte big-endian seq, msgpack [ts, events, rank]],
// the events name the blocks by the low 64 bits of rm-core's block hash of the request's tokens,
// and a consumer that (re)connects gets every kept batch from the sequence it asks for through the
// replay socket, starting with the cleared event a (re)started worker sends first.
import { rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { decode } from "@msgpack/msgpack";
import { blockHashes, blockHashId, blockHashRoot } from "@airm/rm-core";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import * as zmq from "zeromq";
import { binds } from "../src/kv-events.ts";
import { parseKvEventsConfig } from "../src/kv-events-config.ts";
import type { RunningWorker } from "../src/index.ts";
import { generateTokens, tinyWorker } from "./tiny-worker.ts";

const BS = 8;
const sock = (what: string) => `ipc://${join(tmpdir(), `airm-kvev-${process.pid}-${what}`)}`;
const EVENTS = sock("events");
const REPLAY = sock("replay");
const TOPIC = "kv@pod-a@tiny";
let w: RunningWorker;

beforeAll(async () => {
  const config = JSON.stringify({ enable_kv_cache_events: true, endpoint: EVENTS, replay_endpoint: REPLAY, topic: TOPIC });
  w = await tinyWorker({ role: "solo", backend: "rngd", seed: 3, env: { AIRM_BLOCK_SIZE: String(BS), AIRM_KV_EVENTS_CONFIG: config } });
}, 60_000);
afterAll(async () => {
  await w?.close();
  for (const s of [EVENTS, REPLAY]) rmSync(s.slice("ipc://".length), { force: true });
});

type Batch = [number, Record<string, unknown>[], number | null];
const decodeBatch = (payload: Buffer): Batch => decode(payload, { useBigInt64: true }) as Batch;

describe("KV events", () => {
  it("publishes each batch as vLLM does, names blocks by the hash of their tokens, and replays from a sequence", async () => {
    const sub = new zmq.Subscriber({ receiveTimeout: 10_000 });
    sub.connect(EVENTS);
    sub.subscribe("kv@");
    await new Promise((r) => setTimeout(r, 200)); // the subscription reaches the publisher
    const prompt = Array.from({ length: 20 }, (_, i) => 5 + i);
    const out = await generateTokens(w, "ev-1", prompt, 10);
    const got: { topic: string; seq: bigint; batch: Batch }[] = [];
    while (got.flatMap((g) => g.batch[1]).filter((e) => e.type === "BlockStored").length < 2) {
      const frames = await sub.receive();
      expect(frames).toHaveLength(3);
      expect(frames[1]).toHaveLength(8);
      got.push({ topic: frames[0].toString(), seq: frames[1].readBigInt64BE(0), batch: decodeBatch(frames[2]) });
    }
    sub.close();
    for (const g of got) {
      expect(g.topic).toBe(TOPIC);
      expect(g.batch).toHaveLength(3);
      expect(typeof g.batch[0]).toBe("number");
      expect(g.batch[2]).toBeNull();
    }
    // sequence numbers count batches from 0: the cleared event at start (which the subscriber may
    // have joined too late for), then one per batch
    if (got[0].seq === 0n) expect(got.shift()!.batch[1]).toEqual([{ type: "AllBlocksCleared" }]);
    expect(got.map((g) => g.seq)).toEqual(got.map((_, i) => BigInt(i + 1)));
    const stored = got.flatMap((g) => g.batch[1]);
    // the prompt's full blocks at prefill, then the rest of the stream's (prompt and fed output) at its end
    const fed = [...prompt, ...out.slice(0, -1)];
    const engine = w.runtime.serving!.engine;
    const root = blockHashRoot({ modelFingerprint: engine.model.modelFingerprint, numericsFingerprint: engine.model.numericsFingerprint, blockSize: BS });
    const hashes = blockHashes(root, fed, BS);
    const ids = hashes.map(blockHashId);
    expect(stored[0]).toEqual({
      type: "BlockStored",
      block_hashes: ids.slice(0, Math.floor(prompt.length / BS)),
      parent_block_hash: null,
      token_ids: prompt.slice(0, Math.floor(prompt.length / BS) * BS),
      block_size: BS,
      lora_id: null,
      medium: "GPU",
      lora_name: null,
    });
    const first = Math.floor(prompt.length / BS);
    expect(stored[1]).toMatchObject({ type: "BlockStored", block_hashes: ids.slice(first), parent_block_hash: ids[first - 1], token_ids: fed.slice(first * BS, ids.length * BS) });
    // msgpack keys in vLLM's field order, "type" first
    expect(Object.keys(stored[0])).toEqual(["type", "block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "medium", "lora_name"]);

    // a consumer that connects late asks the replay socket from seq 0
    const dealer = new zmq.Dealer({ receiveTimeout: 10_000 });
    dealer.connect(REPLAY);
    await dealer.send([Buffer.alloc(0), Buffer.alloc(8)]);
    const replayed: { seq: bigint; batch: Batch | null }[] = [];
    for (;;) {
      const frames = await dealer.receive();
      expect(frames).toHaveLength(4);
      const seq = frames[2].readBigInt64BE(0);
      if (seq === -1n) {
        expect(frames[1]).toHaveLength(0);
        expect(frames[3]).toHaveLength(0);
        break;
      }
      expect(frames[1].toString()).toBe(TOPIC);
      replayed.push({ seq, batch: decodeBatch(frames[3]) });
    }
    dealer.close();
    expect(replayed.map((r) => r.seq)).toEqual([0n, ...got.map((g) => g.seq)]);
    expect(replayed[0].batch![1]).toEqual([{ type: "AllBlocksCleared" }]);
    expect(replayed.slice(1).map((r) => r.batch![1])).toEqual(got.map((g) => g.batch[1]));
    const metrics = await (await fetch(`${w.url}/metrics`)).text();
    expect(Number(/^airm_kv_events_published_total\S* (\S+)$/m.exec(metrics)?.[1])).toBe(replayed.length);
  });

  it("--kv-events-config is vLLM's JSON; a bad one names the field", () => {
    expect(parseKvEventsConfig('{"enable_kv_cache_events": true}')).toMatchObject({ publisher: "zmq", endpoint: "tcp://*:5557", replay_endpoint: null, topic: "" });
    expect(parseKvEventsConfig("{}").publisher).toBe("null");
    expect(() => parseKvEventsConfig("{")).toThrow(/not JSON/);
    expect(() => parseKvEventsConfig('{"enable_kv_cache_events": true, "endpoit": "x"}')).toThrow(/unknown field\(s\) endpoit/);
    expect(() => parseKvEventsConfig('{"enable_kv_cache_events": true, "endpoint": "5557"}')).toThrow(/endpoint/);
    expect(() => parseKvEventsConfig('{"enable_kv_cache_events": "yes"}')).toThrow(/enable_kv_cache_events/);
  });

  it("binds a wildcard, ipc and the worker's own address (a pod's), and connects to any other (vLLM's rule)", async () => {
    expect(binds("tcp://*:5557", "0.0.0.0")).toBe(true);
    expect(binds("tcp://[::]:5557", "127.0.0.1")).toBe(true);
    expect(binds(EVENTS, "127.0.0.1")).toBe(true);
    expect(binds("tcp://10.1.2.3:5557", "10.1.2.3")).toBe(true);
    expect(binds("tcp://10.1.2.9:5557", "10.1.2.3")).toBe(false);
    expect(binds("tcp://collector.svc:5557", "0.0.0.0")).toBe(false);
    // A worker serving on 127.0.0.2 publishes on its own address: a live subscriber gets its batches.
    const config = JSON.stringify({ enable_kv_cache_events: true, endpoint: "tcp://127.0.0.2:0", replay_endpoint: null });
    const own = await tinyWorker({ role: "solo", backend: "rngd", seed: 3, host: "127.0.0.2", env: { AIRM_BLOCK_SIZE: String(BS), AIRM_KV_EVENTS_CONFIG: config } });
    try {
      const at = (await (await fetch(`${own.url}/health`)).json()) as { prefixCache: { events: { endpoint: string } } };
      expect(at.prefixCache.events.endpoint).toMatch(/^tcp:\/\/127\.0\.0\.2:\d+$/);
      const sub = new zmq.Subscriber({ receiveTimeout: 10_000 });
      sub.connect(at.prefixCache.events.endpoint);
      sub.subscribe();
      await new Promise((r) => setTimeout(r, 200));
      await generateTokens(
        own,
        "own-1",
        Array.from({ length: 20 }, (_, i) => 7 + i),
        4,
      );
      const [, , payload] = await sub.receive();
      expect(decodeBatch(payload!)[1].some((e) => e.type === "BlockStored")).toBe(true);
      sub.close();
    } finally {
      await own.close();
    }
  });
});
