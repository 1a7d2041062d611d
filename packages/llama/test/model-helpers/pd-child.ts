// Child process for the prefill/decode split test. `prefill` loads the model, prefills the prompt,
// picks the first token and writes {meta, K/V bytes} to a file; `decode` loads the model in a
// fresh process, fills a cache from that file and continues. Prints a JSON line on stdout.
import { readFileSync, writeFileSync } from "node:fs";
import type { Checkpoint } from "../../src/checkpoint-types.ts";
import { LlamaModel, type WeightsMode } from "../../src/model/llama-model.ts";
import { continueFromToken } from "../../src/model/generate.ts";
import { sample, type SamplingParams } from "../../src/sampling/sample.ts";
import { randomCheckpoint } from "./random-checkpoint.ts";

interface Job {
  mode: "prefill" | "decode";
  /** Either a generated model folder or an in-memory random config + seed. */
  modelDir?: string;
  config?: Checkpoint["config"];
  seed?: number;
  prompt: number[];
  S: number;
  maxTokens: number;
  sampling: SamplingParams;
  file: string;
  weights?: WeightsMode;
}

async function checkpointFor(job: Job): Promise<Checkpoint> {
  if (job.modelDir) {
    const { loadCheckpoint } = await import("../../src/checkpoint/load-checkpoint.ts");
    return loadCheckpoint(job.modelDir);
  }
  return randomCheckpoint(job.config!, job.seed!);
}

const job = JSON.parse(process.argv[2]) as Job;
const model = await LlamaModel.load(await checkpointFor(job), { weights: job.weights });
const cache = model.newCache(job.S);
if (job.mode === "prefill") {
  const logits = model.prefill(job.prompt, cache);
  const first = sample(logits, job.sampling, cache.n);
  const kv = model.exportKV(cache);
  const meta = Buffer.from(`${JSON.stringify({ n: cache.n, blockSize: kv.blockSize, first, fingerprint: model.numericsFingerprint })}\n`);
  const parts: Uint8Array[] = [meta];
  for (let l = 0; l < model.config.numLayers; l++) parts.push(kv.k[l], kv.v[l]);
  writeFileSync(job.file, Buffer.concat(parts));
  console.log(JSON.stringify({ pid: process.pid, first }));
} else {
  const buf = readFileSync(job.file);
  const nl = buf.indexOf(10);
  const meta = JSON.parse(buf.subarray(0, nl).toString()) as { n: number; blockSize: number; first: number; fingerprint: string };
  if (meta.fingerprint !== model.numericsFingerprint) throw new Error("numerics fingerprint mismatch");
  const L = model.config.numLayers;
  const blob = (buf.length - nl - 1) / (2 * L);
  const at = (j: number) => buf.subarray(nl + 1 + j * blob, nl + 1 + (j + 1) * blob);
  model.importKV(cache, { blockSize: meta.blockSize, n: meta.n, k: Array.from({ length: L }, (_, l) => at(2 * l)), v: Array.from({ length: L }, (_, l) => at(2 * l + 1)) });
  const r = continueFromToken(model, cache, meta.first, { maxTokens: job.maxTokens, sampling: job.sampling });
  console.log(JSON.stringify({ pid: process.pid, tokens: r.tokens }));
}
model.close();
