// The block index a prefix-aware router keeps (@airm/routing), fed by a real worker's KV events
// over ZMQ (Unix sockets): it follows the blocks the worker stores and the ones it evicts (a KV
// pool of 10 blocks), keeps tenants (cache_salt) apart, and a consumer that restarts while the
// worker runs rebuilds the same index from the replay endpoint.
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { BlockIndex, KvEventSubscriber, promptBlockIds } from "@airm/routing";
import type { BlockHashRoot } from "@airm/rm-core";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { RunningWorker } from "../src/index.ts";
import { tinyWorker } from "./tiny-worker.ts";

const BS = 8;
const root = mkdtempSync(join(tmpdir(), "airm-kv-index-"));
const EVENTS = `ipc://${join(root, "events")}`;
const REPLAY = `ipc://${join(root, "replay")}`;
let w: RunningWorker;
let hashRoot: BlockHashRoot;
const subs: KvEventSubscriber[] = [];

function follow(): { index: BlockIndex; sub: KvEventSubscriber } {
  const index = new BlockIndex();
  const sub = new KvEventSubscriber({ worker: "w", endpoint: EVENTS, replayEndpoint: REPLAY, index });
  subs.push(sub);
  return { index, sub };
}

async function generate(prompt: number[], cacheSalt?: string): Promise<void> {
  const r = await fetch(`${w.url}/internal/generate`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify({
      requestId: `cmpl-${Math.random().toString(16).slice(2)}`,
      input: { promptTokenIds: prompt },
      maxTokens: 4,
      ignoreEos: true,
      ...(cacheSalt ? { cacheSalt } : {}),
    }),
  });
  expect(r.status).toBe(200);
  await r.text();
}

const prompt = (seed: number) => Array.from({ length: 24 }, (_, i) => 5 + ((seed * 13 + i * 7) % 100));
const kept = () => w.runtime.serving!.engine.stats().prefixCache!.blocks;

/** Waits until `index` holds what the worker keeps. */
async function caughtUp(index: BlockIndex): Promise<void> {
  for (let i = 0; i < 200 && index.blocksOf("w") !== kept(); i++) await new Promise((r) => setTimeout(r, 20));
  expect(index.blocksOf("w")).toBe(kept());
}

beforeAll(async () => {
  const config = JSON.stringify({ enable_kv_cache_events: true, endpoint: EVENTS, replay_endpoint: REPLAY, topic: "kv@w@tiny" });
  const probe = await tinyWorker({ role: "solo", backend: "rngd", seed: 6, env: { AIRM_BLOCK_SIZE: String(BS) } });
  const blockBytes = probe.runtime.serving!.engine.kvCache().blockBytes;
  await probe.close();
  w = await tinyWorker({
    role: "solo",
    backend: "rngd",
    seed: 6,
    env: { AIRM_BLOCK_SIZE: String(BS), AIRM_KV_EVENTS_CONFIG: config, AIRM_KV_CACHE_MEMORY: String(10 * blockBytes) },
  });
  expect(w.runtime.serving!.engine.kvCache().totalBlocks).toBe(10);
  const m = w.runtime.serving!.engine.model;
  hashRoot = { modelFingerprint: m.modelFingerprint, numericsFingerprint: m.numericsFingerprint, blockSize: BS };
}, 120_000);
afterAll(async () => {
  for (const s of subs) s.close();
  await w?.close();
  rmSync(root, { recursive: true, force: true });
});

describe("the block index from a worker's KV events", () => {
  it("follows stored blocks, keeps tenants apart, and a restarted consumer rebuilds it from the replay", async () => {
    const a = follow();
    await a.sub.start();
    await generate(prompt(1));
    await caughtUp(a.index);
    // 24 prompt tokens and 3 fed answers: 27 positions, 3 full blocks, named as a router names them.
    expect(a.index.matched(promptBlockIds(hashRoot, prompt(1)), "w")).toBe(3);
    expect(a.index.matched(promptBlockIds(hashRoot, prompt(1), "tenant-b"), "w")).toBe(0);
    await generate(prompt(1), "tenant-b");
    await caughtUp(a.index);
    expect(a.index.matched(promptBlockIds(hashRoot, prompt(1), "tenant-b"), "w")).toBe(3);

    // The consumer goes away, the worker goes on, a new one starts: the replay gives it all.
    a.sub.close();
    await generate(prompt(2));
    const b = follow();
    await b.sub.start();
    await caughtUp(b.index);
    for (const [p, salt] of [
      [prompt(1), ""],
      [prompt(1), "tenant-b"],
      [prompt(2), ""],
    ] as const)
      expect(b.index.matched(promptBlockIds(hashRoot, p, salt), "w")).toBe(3);
    expect(b.sub.counts.replays).toBe(1);
    expect(b.sub.counts.missed).toBe(0);
  });

  it("follows evictions: a full pool's oldest blocks leave the index as they leave the worker", async () => {
    const c = follow();
    await c.sub.start();
    for (let s = 3; s < 7; s++) await generate(prompt(s));
    await caughtUp(c.index);
    expect(w.runtime.serving!.engine.stats().prefixCache!.evictions).toBeGreaterThan(0);
    // The first conversation's blocks were the least recently used: gone from both.
    expect(c.index.matched(promptBlockIds(hashRoot, prompt(1)), "w")).toBe(0);
    expect(c.index.matched(promptBlockIds(hashRoot, prompt(6)), "w")).toBe(3);
    expect(c.index.size).toBe(kept());
  });
});
