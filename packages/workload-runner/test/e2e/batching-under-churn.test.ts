// Continuous batching through the workers' HTTP API: requests of different lengths start at
// staggered times on a PD cluster with the default batch width (they join the running batch
// mid-generation and leave when done), and each gets exactly the tokens it gets alone on a
// decode worker that cannot batch (--B 1). The decode worker's own histogram proves the steps
// were in fact shared (the test would be empty otherwise).
import { rmSync } from "node:fs";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { PrefillRequest } from "@airm/internal-api";
import type { RunningCluster } from "../../src/index.ts";
import { cluster, pdTokens, tinyModel, type TokenRun } from "../helpers/cluster.ts";

const S = 256;
const N = 12;
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
/** Prompts of varied length and max_tokens from 6 to 60, so requests leave the batch at different steps. */
const bodies = (tag: string): PrefillRequest[] =>
  Array.from({ length: N }, (_, i) => ({
    requestId: `${tag}-${i}`,
    input: { promptTokenIds: Array.from({ length: 3 + ((i * 7) % 40) }, (_, j) => 5 + ((i * 31 + j * 17) % 300)) },
    maxTokens: 6 + ((i * 13) % 55),
    sampling: { temperature: 0, seed: 1 },
  }));

let model: string;
let alone: RunningCluster;
let batched: RunningCluster;

beforeAll(async () => {
  model = tinyModel();
  [alone, batched] = await Promise.all([
    cluster({ model, maxModelLen: S, decode: [{ backend: "atom", batch: 1 }], kvTransport: "shm", port: 0 }),
    cluster({ model, maxModelLen: S, decode: [{ backend: "atom" }], kvTransport: "shm", port: 0 }),
  ]);
});
afterAll(async () => {
  await Promise.all([alone?.stop(), batched?.stop()]);
  if (model) rmSync(model, { recursive: true, force: true });
});

/** sum and count of the decode worker's airm_worker_decode_batch_size histogram. */
async function batchSizes(c: RunningCluster): Promise<{ sum: number; count: number; max: number }> {
  const text = await (await fetch(`${c.part("decode").url}/metrics`)).text();
  const num = (re: RegExp) => Number(re.exec(text)?.[1] ?? Number.NaN);
  const sum = num(/^airm_worker_decode_batch_size_sum\{[^}]*\} (\S+)$/m);
  const count = num(/^airm_worker_decode_batch_size_count\{[^}]*\} (\S+)$/m);
  // The largest bucket bound that some step did not fit under: a lower bound of the widest step.
  let max = 0;
  for (const m of text.matchAll(/^airm_worker_decode_batch_size_bucket\{(?:[^}]*,)?le="([^"]+)"[^}]*\} (\S+)$/gm)) {
    if (m[1] !== "+Inf" && Number(m[2]) < count) max = Math.max(max, Number(m[1]) + 1);
  }
  return { sum, count, max };
}

describe("continuous batching under churn", () => {
  it("gives every request its batch-of-one tokens while requests join and leave the running batch", async () => {
    const want: TokenRun[] = [];
    for (const body of bodies("alone")) want.push(await pdTokens(alone.part("prefill").url, alone.part("decode").url, body, alone.internalToken));
    // Alone means alone: every step of that worker ran one stream.
    const a = await batchSizes(alone);
    expect(a.count).toBeGreaterThan(0);
    expect(a.sum).toBe(a.count);

    const got = await Promise.all(
      bodies("churn").map(async (body, i) => {
        // staggered, and prefilled one after another: later requests join batches already running.
        // 10 ms apart: at 40 ms a run here had so little overlap that steps averaged 1.3 streams
        // (the faster the machine, the less they overlap); at 10 ms 5.0-5.6.
        await sleep(i * 10);
        return pdTokens(batched.part("prefill").url, batched.part("decode").url, body, batched.internalToken);
      }),
    );
    got.forEach((g, i) => expect({ i, ...g }).toEqual({ i, ...want[i] }));
    // The steps were shared: more streams than steps, and some step ran more than 4 at once.
    const b = await batchSizes(batched);
    expect(b.sum).toBe(want.reduce((acc, r) => acc + r.tokens.length - 1, 0));
    expect(b.sum / b.count).toBeGreaterThan(1.5);
    expect(b.max).toBeGreaterThan(4);
  });
});
