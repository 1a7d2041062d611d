// The reference an engine must match: the model run solo by @airm/llama (prefill, then one token
// at a time, greedy unless sampling says otherwise). Used by the engines' tests and benches.

import { importLlama } from "./cpu-model.ts";
import type { SamplingParams } from "@airm/rm-core";

/**
 * `steps` tokens generated from `tokens` by the model in `modelDir` on @airm/llama alone, with a
 * cache of context `seqLen`. The first is the prefill's token (sampled at position tokens.length).
 */
export async function referenceTokens(modelDir: string, tokens: number[], steps: number, seqLen: number, sampling: SamplingParams = {}): Promise<number[]> {
  const llama = await importLlama();
  const ckpt = await llama.loadCheckpoint(modelDir);
  const model = await llama.LlamaModel.load(ckpt);
  try {
    const cache = model.newCache(seqLen);
    const out = [llama.sample(model.prefill(tokens, cache), sampling, tokens.length)];
    while (out.length < steps) out.push(llama.sample(model.decode([{ cache, token: out[out.length - 1] }])[0], sampling, cache.n));
    return out;
  } finally {
    model.close();
    ckpt.tensors.close();
  }
}
