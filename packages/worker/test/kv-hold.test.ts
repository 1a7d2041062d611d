// A handoff that skips what decode holds, through the workers' routes on a real shm transport and
// a generated tiny model: a conversation's second turn on the same decode worker moves only its
// new blocks (bytes checked), its tokens equal a solo worker's, and the decode worker's blocks are
// what the prefill side named (a wrong name is refused on either side).
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { ErrorBodySchema, KvHoldResponseSchema, PrefillResponseSchema } from "@airm/internal-api";
import { makeTinyModel } from "@airm/llama";
import { blockLayerBytes, blocksFor, type WorkerRole } from "@airm/rm-core";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { events, inProcessWorker, tokensOf, type Opened } from "./in-process-worker.ts";

const root = mkdtempSync(join(tmpdir(), "airm-worker-hold-"));
const model = join(root, "model");
const shmRoot = `/dev/shm/airm-worker-hold-${process.pid}`;
const BS = 8;
const env = { AIRM_ENGINE_LOG: "0", AIRM_ARTIFACT_CACHE: "off", PD_SHM_ROOT: shmRoot, AIRM_BLOCK_SIZE: String(BS) };
const opened: Opened[] = [];
const MAX_TOKENS = 12;

const worker = (role: WorkerRole, backend: string) => inProcessWorker(role, backend, { model, env, maxModelLen: 256, maxNumSeqs: 8, opened });

let prefill: Awaited<ReturnType<typeof worker>>;
let decode: Awaited<ReturnType<typeof worker>>;
let solo: Awaited<ReturnType<typeof worker>>;

beforeAll(async () => {
  makeTinyModel({ arch: "llama", out: model, layers: 2, seed: 5 });
  prefill = await worker("prefill", "rngd-full");
  decode = await worker("decode", "atom");
  solo = await worker("solo", "rngd");
}, 120_000);
afterAll(async () => {
  for (const o of opened) {
    await o.engine.close();
    await o.transport?.close();
  }
  rmSync(root, { recursive: true, force: true });
  rmSync(shmRoot, { recursive: true, force: true });
});

/** One PD turn as the gateway runs it: kv-hold on decode, decode (waits for KV), prefill with the skip. */
async function pdTurn(id: string, promptTokenIds: number[], opts: { salt?: string; skipHash?: string } = {}) {
  const salt = opts.salt ? { cacheSalt: opts.salt } : {};
  const hold = KvHoldResponseSchema.parse(await (await decode.post("/internal/kv-hold", { requestId: id, input: { promptTokenIds }, ...salt })).json());
  const d = decode.post("/internal/decode", { requestId: id, maxTokens: MAX_TOKENS, ignoreEos: true, ...salt });
  const skip = hold.held ? { skip: { blocks: hold.held.blocks, hash: opts.skipHash ?? hold.held.hash } } : {};
  const p = await prefill.post("/internal/prefill", { requestId: id, input: { promptTokenIds }, maxTokens: MAX_TOKENS, ignoreEos: true, ...salt, ...skip });
  if (p.status !== 200) {
    await decode.post("/internal/release", { requestId: id, reason: "prefill_failed" });
    await d;
    return { hold, status: p.status, error: ErrorBodySchema.parse(await p.json()).error };
  }
  const answer = PrefillResponseSchema.parse(await p.json());
  return { hold, status: 200, answer, tokens: tokensOf(answer.first.token, await events(await d)) };
}

async function soloTokens(id: string, promptTokenIds: number[]): Promise<number[]> {
  return tokensOf(null, await events(await solo.post("/internal/generate", { requestId: id, input: { promptTokenIds }, maxTokens: MAX_TOKENS, ignoreEos: true })));
}

const SYSTEM = Array.from({ length: 37 }, (_, i) => 3 + ((i * 7) % 50));

describe("a handoff that skips what decode holds", () => {
  it("the second turn on the same decode worker moves only its new blocks and gives solo's tokens", async () => {
    const turn1 = [...SYSTEM, 60, 61, 62];
    const t1 = await pdTurn("conv-1", turn1);
    expect(t1.hold.held).toBeNull();
    expect(t1.tokens).toEqual(await soloTokens("solo-1", turn1));
    const g = decode.engine.model;
    const blockBytes = blockLayerBytes(g, BS);
    expect(t1.answer!.kvBytes).toBe(2 * g.layers * blocksFor(turn1.length, BS) * blockBytes);
    // turn 2: the conversation so far (turn 1's prompt and answer), then a new message
    const turn2 = [...turn1, ...t1.tokens!, 70, 71, 72, 73];
    const t2 = await pdTurn("conv-2", turn2);
    // decode kept turn 1's prompt and every token fed to its steps (all but the last)
    const held = Math.floor((turn1.length + MAX_TOKENS - 1) / BS);
    expect(t2.hold.held).toMatchObject({ blocks: held, positions: held * BS });
    expect(t2.answer!.kvBytes).toBe(2 * g.layers * (blocksFor(turn2.length, BS) - held) * blockBytes);
    expect(t2.tokens).toEqual(await soloTokens("solo-2", turn2));
    const metrics = await (await decode.app.request("/metrics")).text();
    expect(Number(/^airm_kv_skipped_bytes_total\S* (\S+)$/m.exec(metrics)?.[1])).toBe(2 * g.layers * held * blockBytes);
    expect(Number(/^airm_kv_held_positions_total\S* (\S+)$/m.exec(metrics)?.[1])).toBe(held * BS);
    expect(Number(/^airm_kv_pulled_bytes_total\S* (\S+)$/m.exec(metrics)?.[1])).toBe(t1.answer!.kvBytes + t2.answer!.kvBytes);
    expect(Number(/^airm_kv_pulls_total\S* (\S+)$/m.exec(metrics)?.[1])).toBe(2);
    // What crossed left the prefill worker: the same bytes (the held blocks did not cross).
    const pushed = await (await prefill.app.request("/metrics")).text();
    expect(Number(/^airm_kv_pushed_bytes_total\S* (\S+)$/m.exec(pushed)?.[1])).toBe(t1.answer!.kvBytes + t2.answer!.kvBytes);
    expect(decode.rt.holds.size).toBe(0);
    // a tenant with another cache_salt finds none of it
    const other = await pdTurn("conv-3", turn2, { salt: "tenant-b" });
    expect(other.hold.held).toBeNull();
    expect(other.tokens).toEqual(t2.tokens);
  });

  it("a skip whose block hash is not the prefill side's is a 409 kv_mismatch; the decode worker lets its hold go", async () => {
    const turn = [...SYSTEM, 90, 91, 92];
    await pdTurn("warm-1", turn);
    const bad = await pdTurn("warm-2", [...turn, 93, 94], { skipHash: "0".repeat(64) });
    expect(bad.hold.held).not.toBeNull();
    expect(bad.status).toBe(409);
    expect(bad.error).toMatchObject({ code: "kv_mismatch", param: "skip.hash" });
    expect(decode.rt.holds.size).toBe(0);
    expect(decode.rt.leases.counters().outstanding).toBe(0);
  });

  it("a decode that holds nothing refuses KV that leaves blocks out for it", async () => {
    const turn = [...SYSTEM, 80, 81, 82, 83];
    const held = await pdTurn("miss-1", turn);
    expect(held.status).toBe(200);
    // the prefill side is told the decode holds the first blocks; this decode worker never said so
    const id = "miss-2";
    const hold = KvHoldResponseSchema.parse(await (await decode.post("/internal/kv-hold", { requestId: "someone-else", input: { promptTokenIds: [...turn, 84] } })).json());
    expect(hold.held).not.toBeNull();
    const d = decode.post("/internal/decode", { requestId: id, maxTokens: MAX_TOKENS, ignoreEos: true });
    const p = await prefill.post("/internal/prefill", {
      requestId: id,
      input: { promptTokenIds: [...turn, 84] },
      maxTokens: MAX_TOKENS,
      ignoreEos: true,
      skip: { blocks: hold.held!.blocks, hash: hold.held!.hash },
    });
    expect(p.status).toBe(200);
    const err = (await events(await d)).find((e) => e.type === "error") as { code?: string; message?: string } | undefined;
    expect(err?.message).toMatch(/leaves out \d+ block\(s\)/);
    await decode.post("/internal/release", { requestId: "someone-else", reason: "done" });
    expect(decode.rt.holds.size).toBe(0);
  });
});
