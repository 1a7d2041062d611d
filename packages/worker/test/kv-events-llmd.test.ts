// KV events read by a real consumer: llm-d's own vLLM event decoder (github.com/llm-d/llm-d-kv-cache
// v0.9.0, engineadapter.VLLMAdapter.ParseMessage, over go-zeromq), built from the Go module proxy by
// scripts/tools/kvev-consumer.sh, subscribes to a real worker's publisher (generated tiny model) and
// asks its replay socket from sequence 0. What it decodes (pod and model from the topic, block
// hashes, parents, token ids, block size, medium, the cleared event) must be what the worker stored.
import { execFileSync, spawn } from "node:child_process";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { blockHashes, blockHashId, blockHashRoot } from "@airm/rm-core";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { RunningWorker } from "../src/index.ts";
import { generateTokens, tinyWorker } from "./tiny-worker.ts";

const BS = 8;
const root = mkdtempSync(join(tmpdir(), "airm-kvev-llmd-"));
const EVENTS = `ipc://${join(root, "events")}`;
const REPLAY = `ipc://${join(root, "replay")}`;
const TOPIC = "kv@pod-7@tiny-model";
let consumer: string;
let w: RunningWorker;

interface Line {
  topic: string;
  pod: string;
  model: string;
  seq: number;
  ts: number;
  events: { type: string; hashes?: string[]; parent?: string; tokens?: number[]; blockSize?: number; medium?: string }[];
}

beforeAll(async () => {
  const dir = execFileSync("bash", [join(import.meta.dirname, "../../../scripts/tools/kvev-consumer.sh")], { encoding: "utf8", timeout: 900_000 }).trim();
  consumer = join(dir, "bin/kvev-consumer");
  const config = JSON.stringify({ enable_kv_cache_events: true, endpoint: EVENTS, replay_endpoint: REPLAY, topic: TOPIC });
  w = await tinyWorker({ role: "solo", backend: "rngd", seed: 4, env: { AIRM_BLOCK_SIZE: String(BS), AIRM_KV_EVENTS_CONFIG: config } });
}, 900_000);
afterAll(async () => {
  await w?.close();
  rmSync(root, { recursive: true, force: true });
});

/** Runs the consumer to its end; its JSON lines. */
function consume(args: string[]): Promise<Line[]> {
  return new Promise((resolve, reject) => {
    const p = spawn(consumer, [...args, "-timeout", "15s"], { stdio: ["ignore", "pipe", "pipe"] });
    let out = "";
    let err = "";
    p.stdout.on("data", (d) => (out += d));
    p.stderr.on("data", (d) => (err += d));
    p.on("exit", (code) => {
      if (code !== 0) reject(new Error(`kvev-consumer exited ${code}: ${err}`));
      else
        resolve(
          out
            .trim()
            .split("\n")
            .filter(Boolean)
            .map((l) => JSON.parse(l) as Line),
        );
    });
  });
}

describe("KV events through llm-d's decoder", () => {
  it("a live subscriber and a replaying one decode what the worker stored, under the pod and model of the topic", async () => {
    const live = consume(["-endpoint", EVENTS, "-topic-prefix", "kv@", "-count", "2"]);
    await new Promise((r) => setTimeout(r, 1500)); // the consumer dials and subscribes
    const prompt = Array.from({ length: 21 }, (_, i) => 40 + i);
    const out = await generateTokens(w, "llmd-1", prompt, 9);
    const got = await live;
    const engine = w.runtime.serving!.engine;
    const hashes = blockHashes(
      blockHashRoot({ modelFingerprint: engine.model.modelFingerprint, numericsFingerprint: engine.model.numericsFingerprint, blockSize: BS }),
      [...prompt, ...out.slice(0, -1)],
      BS,
    );
    const ids = hashes.map((h) => blockHashId(h).toString());
    const inPrompt = Math.floor(prompt.length / BS);
    for (const l of got) expect([l.topic, l.pod, l.model]).toEqual([TOPIC, "pod-7", "tiny-model"]);
    expect(got[0].events).toEqual([{ type: "BlockStored", hashes: ids.slice(0, inPrompt), parent: "0", tokens: prompt.slice(0, inPrompt * BS), blockSize: BS, medium: "GPU" }]);
    expect(got[1].events).toEqual([
      {
        type: "BlockStored",
        hashes: ids.slice(inPrompt),
        parent: ids[inPrompt - 1],
        tokens: [...prompt, ...out].slice(inPrompt * BS, ids.length * BS),
        blockSize: BS,
        medium: "GPU",
      },
    ]);
    // a consumer that connects now replays from 0: the cleared event a started worker sends, then the same batches
    const replayed = await consume(["-replay", REPLAY, "-from", "0", "-count", "100"]);
    expect(replayed.map((l) => l.seq)).toEqual([0, got[0].seq, got[1].seq]);
    expect(replayed[0].events).toEqual([{ type: "AllBlocksCleared" }]);
    expect(replayed.slice(1).map((l) => l.events)).toEqual(got.map((l) => l.events));
  });
});
