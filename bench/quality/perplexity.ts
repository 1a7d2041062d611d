// Perplexity of a GGUF on a fixed text, ours (the model in this process, airm up's default kernels)
// and llama.cpp's own `llama-perplexity` on the same file, with llama-perplexity's method: the
// text tokenized once with the model's special tokens, cut into chunks of `ctx` tokens, each
// chunk's first token replaced by BOS when the model adds one, and the negative log-likelihood of
// the second half of every chunk (positions ctx/2 .. ctx-2 predicting the next token) averaged
// over all chunks. Also makes the files that carry the quant types no pulled file has, with
// llama.cpp's llama-quantize (`--allow-requantize` from a pulled Q4_K_M), cached by name.
import { execFileSync, spawnSync } from "node:child_process";
import { existsSync, mkdirSync, readFileSync, renameSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { loadCheckpoint } from "../../packages/llama/src/checkpoint/load-checkpoint.ts";
import { DEFAULT_ACTIVATIONS, LlamaModel } from "../../packages/llama/src/model/llama-model.ts";
import { defaultCacheDir } from "../../packages/llama/src/model-cache/model-cache.ts";
import type { BuiltServer } from "../serve-load/llama-server.ts";

/**
 * The fixed text: the first 10,000 characters of this project's docs/decisions.md as of
 * 2026-12-05, kept as a file (English technical prose no model has seen: a license text, which
 * every code model has memorised, scored ~1.37 on the 1.5B coder and hid differences).
 */
export const PERPLEXITY_TEXT = join(dirname(fileURLToPath(import.meta.url)), "perplexity-text.txt");

export interface Perplexity {
  ppl: number;
  /** Tokens scored. */
  count: number;
  chunks: number;
  seconds: number;
}

/** Our perplexity of `gguf` over `text` in chunks of `ctx` tokens (at most `maxChunks`), `threads` threads. */
export async function oursPerplexity(gguf: string, text: string, ctx: number, maxChunks: number, threads: 1 | 2): Promise<Perplexity & { dtypes: Record<string, number> }> {
  const ckpt = await loadCheckpoint(gguf);
  const dtypes: Record<string, number> = {};
  for (const t of ckpt.tensors.list()) if (t.shape.length === 2) dtypes[t.dtype] = (dtypes[t.dtype] ?? 0) + 1;
  const model = await LlamaModel.load(ckpt, { threads, activations: DEFAULT_ACTIVATIONS });
  try {
    const tokens = ckpt.tokenizer.encode(text, { addSpecialTokens: true });
    const bos = ckpt.tokenizer.bosTokenId;
    const addsBos = bos !== null && tokens[0] === bos;
    const chunks = Math.min(maxChunks, Math.floor(tokens.length / ctx));
    if (chunks < 1) throw new Error(`${gguf}: the text is ${tokens.length} tokens, fewer than one chunk of ${ctx}`);
    const first = ctx >> 1;
    let nll = 0;
    let count = 0;
    const t0 = performance.now();
    for (let i = 0; i < chunks; i++) {
      const chunk = tokens.slice(i * ctx, (i + 1) * ctx);
      if (addsBos) chunk[0] = bos;
      const cache = model.newCache(ctx);
      const rows = model.prefillAllLogits(chunk, cache);
      model.freeCache(cache);
      for (let j = first; j < ctx - 1; j++) {
        nll -= logSoftmaxAt(rows[j], chunk[j + 1]);
        count++;
      }
    }
    return { ppl: Math.exp(nll / count), count, chunks, seconds: (performance.now() - t0) / 1000, dtypes };
  } finally {
    model.close();
    ckpt.tensors.close();
  }
}

/** log p(id) under softmax(logits), in f64. */
function logSoftmaxAt(logits: Float32Array, id: number): number {
  let max = -Infinity;
  for (const v of logits) if (v > max) max = v;
  let sum = 0;
  for (const v of logits) sum += Math.exp(v - max);
  return logits[id] - max - Math.log(sum);
}

/** llama.cpp's perplexity of `gguf` (its `llama-perplexity` beside the server binary), same chunks. */
export function llamaCppPerplexity(server: BuiltServer, gguf: string, textFile: string, ctx: number, maxChunks: number, threads: number): Perplexity {
  const bin = join(dirname(server.bin), "llama-perplexity");
  const t0 = performance.now();
  const run = spawnSync(bin, ["-m", gguf, "-f", textFile, "-c", String(ctx), "-b", String(ctx), "--chunks", String(maxChunks), "-t", String(threads)], {
    env: server.env,
    encoding: "utf8",
    maxBuffer: 64 << 20,
  });
  // the estimate is in its log (stderr), the running figures on stdout
  const out = `${run.stdout}${run.stderr}`;
  if (run.status !== 0) throw new Error(`llama-perplexity exited ${run.status} on ${gguf}:\n${out.slice(-2000)}`);
  const seconds = (performance.now() - t0) / 1000;
  const m = /Final estimate: PPL = ([\d.]+)/.exec(out);
  const chunks = /calculating perplexity over (\d+) chunks/.exec(out);
  if (!m || !chunks) throw new Error(`llama-perplexity printed no estimate for ${gguf}:\n${out.slice(-2000)}`);
  const n = Number(chunks[1]);
  return { ppl: Number(m[1]), count: n * (ctx - (ctx >> 1) - 1), chunks: n, seconds };
}

/**
 * `source` requantized by llama-quantize to `type` (a llama.cpp preset name such as Q5_K_M),
 * cached in the airm cache folder; returns its path.
 */
export function requantized(server: BuiltServer, source: string, name: string, type: string): string {
  const dir = join(dirname(defaultCacheDir(process.env)), "quant-variants");
  const out = join(dir, `${name}.${type}.gguf`);
  if (existsSync(out)) return out;
  mkdirSync(dir, { recursive: true });
  const tmp = `${out}.${process.pid}.tmp`;
  execFileSync(join(dirname(server.bin), "llama-quantize"), ["--allow-requantize", source, tmp, type, "2"], { env: server.env, stdio: ["ignore", "pipe", "pipe"] });
  renameSync(tmp, out);
  return out;
}

/** The fixed text's contents. */
export function perplexityText(): string {
  return readFileSync(PERPLEXITY_TEXT, "utf8");
}
