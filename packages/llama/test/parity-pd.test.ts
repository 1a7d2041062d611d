// Prefill/decode split on the real SmolLM2-135M-Instruct GGUF: one child process prefills, the KV
// bytes cross through files in /dev/shm, another child process decodes; the tokens must equal one
// process doing both, and the KV bytes must equal this process's own prefill. Skipped, with the
// reason, when the model is not in the cache.
import { execFile } from "node:child_process";
import { existsSync, mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { promisify } from "node:util";
import { afterAll, describe, expect, it } from "vitest";
import { loadCheckpoint } from "../src/checkpoint/load-checkpoint.ts";
import { LlamaModel } from "../src/model/llama-model.ts";
import { continueGeneration, type GenerateResult } from "../src/model/generate.ts";
import type { SamplingParams } from "../src/sampling/sample.ts";
import type { KvFileMeta, PdJob } from "./fixtures/parity/pd-child.ts";
import { SKIP_REASON, cachedParityModel } from "./fixtures/parity/parity-model.ts";

const ggufPath = cachedParityModel();
if (!ggufPath) console.warn(`parity-pd skipped: ${SKIP_REASON}`);

const child = fileURLToPath(new URL("./fixtures/parity/pd-child.ts", import.meta.url));
const run = promisify(execFile);

async function runChild(job: PdJob): Promise<{ pid: number; firsts?: number[]; outputs?: GenerateResult[] }> {
  const { stdout } = await run(process.execPath, ["--import", "tsx", child, JSON.stringify(job)], { encoding: "utf8", timeout: 120_000, maxBuffer: 1 << 20 });
  return JSON.parse(stdout.trim().split("\n").at(-1)!);
}

const dir = mkdtempSync(join(existsSync("/dev/shm") ? "/dev/shm" : tmpdir(), "airm-parity-pd-"));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

const questions: [string, SamplingParams][] = [
  ["What is the capital of France?", {}],
  ["Write one sentence about the sea.", {}],
  ["Tell me a short fact about cats.", { temperature: 0.8, topP: 0.9, topK: 50, seed: 4242 }],
];

describe.skipIf(!ggufPath)(`prefill in one process, decode in another, on ${ggufPath ?? SKIP_REASON}`, () => {
  it("gives exactly the solo tokens for greedy and seeded sampling, from the same KV bytes", async () => {
    const ckpt = await loadCheckpoint(ggufPath!);
    const prompts = questions.map(([q]) => ckpt.tokenizer.encode(ckpt.renderChat!([{ role: "user", content: q }], { addGenerationPrompt: true })));
    const sampling = questions.map(([, s]) => s);
    const maxTokens = 16;
    const stopTokenIds = ckpt.generation.eosTokenIds;
    const job: PdJob = { mode: "prefill", gguf: ggufPath!, prompts, sampling, maxTokens, stopTokenIds, dir };

    // The prefill process runs while this process loads its own copy for the solo run.
    const prefillDone = runChild(job);
    prefillDone.catch(() => undefined); // awaited below; no unhandled rejection if loading fails first
    const model = await LlamaModel.load(ckpt, { threads: 1 });
    try {
      const a = await prefillDone;
      const decodeDone = runChild({ ...job, mode: "decode" });
      decodeDone.catch(() => undefined);
      // Solo: prefill here, check that the bytes that crossed equal this process's own KV, then
      // decode here.
      const solo = prompts.map((p, i) => {
        const buf = readFileSync(join(dir, `req-${i}.kv`));
        const nl = buf.indexOf(10);
        const meta = JSON.parse(buf.subarray(0, nl).toString("utf8")) as KvFileMeta;
        expect(meta.n).toBe(p.length);
        const cache = model.newCache(p.length + maxTokens);
        try {
          const logits = model.prefill(p, cache);
          let at = nl + 1;
          let equalBlobs = 0;
          for (let l = 0; l < model.config.numLayers; l++) {
            for (const mine of [cache.layerK(l), cache.layerV(l)]) {
              if (Buffer.compare(buf.subarray(at, at + mine.byteLength), mine) === 0) equalBlobs++;
              at += mine.byteLength;
            }
          }
          expect(equalBlobs).toBe(2 * model.config.numLayers);
          return continueGeneration(model, cache, logits, { maxTokens, sampling: sampling[i], stopTokenIds });
        } finally {
          model.freeCache(cache);
        }
      });
      const b = await decodeDone;
      expect(new Set([process.pid, a.pid, b.pid]).size).toBe(3);
      expect(b.outputs).toEqual(solo);
      expect(b.outputs!.map((o) => o.tokens[0])).toEqual(a.firsts); // the decode side starts from the prefill side's token
      expect(solo.every((s) => s.tokens.length > 0)).toBe(true);
      const texts = solo.map((s) => ckpt.tokenizer.decode(s.tokens, { skipSpecialTokens: true }));
      console.log(`PD == solo on ${prompts.length} prompts (pids ${a.pid} -> ${b.pid}); answers:\n${texts.map((t) => `  ${JSON.stringify(t)}`).join("\n")}`);
    } finally {
      model.close();
      ckpt.tensors.close();
    }
  }, 240_000);
});
