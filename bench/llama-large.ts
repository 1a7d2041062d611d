// A generated GGUF of a real model shape with random quantized blocks: Qwen2.5-1.5B / -3B (GQA,
// q/k/v bias, the 151936-token vocabulary, tied embeddings) or Llama-3.1-8B (32 layers, hidden
// 4096, 32 / 8 heads, vocab 128256, untied head, llama3 rope scaling as rope_freqs.weight). It is
// written to a temp file, loaded by our CPU engine with the blocks resident (cold: packed from the
// file; warm: from a packed image in an artifact cache of its own), and decoded; then llama.cpp
// (node-llama-cpp, one thread, like ours) decodes the same file. Prints load times, resident
// memory, prefill and decode tokens/s, against the streaming roofline of the same weight bytes
// measured in the same run. No such checkpoint ships here; the weights are noise, so the tokens
// mean nothing; shape, bytes and speed are what this measures. Q4_K_M is llama.cpp's mix: Q4_K,
// with Q6_K for the output head and for attn_v / ffn_down in the layers its quantizer gives more
// bits (the first and last eighth, and every third between).
// Usage: pnpm bench llama-large [--preset 1.5b|3b|8b] [--type Q4_1|Q4_0|Q8_0|Q4_K|Q4_K_M]
//        [--steps N] [--llamacpp-steps N] [--keep] [--out FILE]
import { randomFillSync } from "node:crypto";
import { closeSync, mkdtempSync, openSync, rmSync, writeSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { GGML_TYPES } from "../packages/llama/src/checkpoint/gguf-file.ts";
import { loadCheckpoint } from "../packages/llama/src/checkpoint/load-checkpoint.ts";
import { bytesToUnicode } from "../packages/llama/src/tokenizer/byte-level-bpe.ts";
import { TYPE_IDS, f32, ggufHeader, str, strs, u32, type GgufTensorInfo, type MetaValue } from "../packages/llama/test/fixtures/io/gguf-writer.ts";
import { LlamaModel } from "../packages/llama/src/model/llama-model.ts";
import { argmax } from "../packages/llama/src/sampling/sample.ts";
import { flag, flagOf, int, oneOf, text } from "../packages/rm-core/src/index.ts";
import { ArtifactCache } from "../packages/engine-kit/src/artifact-cache.ts";
import { openLlamaCpp } from "../packages/llama/test/fixtures/parity/llamacpp-reference.ts";
import { benchArgs, finalLine, fmt, progress, progressDone, summarize } from "./lib.ts";

interface Preset {
  arch: "qwen2" | "llama";
  hidden: number;
  layers: number;
  heads: number;
  kv: number;
  ffn: number;
  vocab: number;
  /** Qwen2: q/k/v bias, tied embeddings; Llama 3.1: neither, and llama3 rope scaling. */
  llama31?: boolean;
}
const PRESETS: Record<string, Preset> = {
  "1.5b": { arch: "qwen2", hidden: 1536, layers: 28, heads: 12, kv: 2, ffn: 8960, vocab: 151936 },
  "3b": { arch: "qwen2", hidden: 2048, layers: 36, heads: 16, kv: 2, ffn: 11008, vocab: 151936 },
  "8b": { arch: "llama", hidden: 4096, layers: 32, heads: 32, kv: 8, ffn: 14336, vocab: 128256, llama31: true },
};

const args = benchArgs("llama-large", "load and decode a generated 1.5 B / 3 B / 8 B parameter quantized GGUF, and llama.cpp on the same file", {
  preset: flagOf(oneOf(["1.5b", "3b", "8b"] as const), { default: "1.5b", doc: "model shape (Qwen2.5-1.5B / -3B, Llama-3.1-8B)" }),
  type: flagOf(oneOf(["Q4_1", "Q4_0", "Q8_0", "Q4_K", "Q4_K_M"] as const), { default: "Q4_1", doc: "block type of the matrices (Q4_K_M: llama.cpp's Q4_K / Q6_K mix)" }),
  steps: flagOf(int({ min: 1 }), { default: 16, doc: "decode steps" }),
  llamacppSteps: flagOf(int({ min: 0 }), { default: 8, doc: "llama.cpp decode steps on the same file (0: skip llama.cpp)" }),
  keep: flagOf(flag(), { default: false, doc: "keep the generated file" }),
  out: flagOf(text({ label: "path" }), { defaultText: "a temp folder", doc: "where to write the GGUF (kept)" }),
});
const shape = PRESETS[args.preset]!;
const hd = shape.hidden / shape.heads;
const ggmlType = (name: string) => {
  const [id, t] = Object.entries(GGML_TYPES).find(([, x]) => x.name === name)!;
  return { name, id: Number(id), n: t.blockSize, bytes: t.typeSize };
};
/** llama.cpp's Q4_K_M rule for attn_v and ffn_down: Q6_K in the first and last eighth of the layers and every third between. */
const moreBits = (l: number) => l < shape.layers / 8 || l >= (7 * shape.layers) / 8 || (l - Math.floor(shape.layers / 8)) % 3 === 2;
/** The block type of a matrix under --type. */
function typeOf(name: string): ReturnType<typeof ggmlType> {
  if (args.type !== "Q4_K_M") return ggmlType(args.type);
  if (name === "output.weight") return ggmlType("Q6_K");
  const m = /^blk\.(\d+)\.(attn_v|ffn_down)\.weight$/.exec(name);
  return ggmlType(m && moreBits(Number(m[1])) ? "Q6_K" : "Q4_K");
}

// ---- the file: the test fixtures' GGUF header, then tensor data written in chunks
const dir = mkdtempSync(join(tmpdir(), "airm-large-"));
const path = args.out ?? join(dir, `generated-${args.preset}-${args.type}.gguf`);
// a byte-level BPE vocabulary of the model's size: the 256 byte tokens, fillers, two specials
const tokens = [...bytesToUnicode(), ...Array.from({ length: shape.vocab - 256 - 2 }, (_, i) => `Ġw${i}`), "<|endoftext|>", "<|im_end|>"];
const a = shape.arch;
const metadata: Record<string, MetaValue> = {
  "general.architecture": str(a),
  "general.name": str(`generated-${args.preset}`),
  [`${a}.block_count`]: u32(shape.layers),
  [`${a}.context_length`]: u32(shape.llama31 ? 131072 : 32768),
  [`${a}.embedding_length`]: u32(shape.hidden),
  [`${a}.feed_forward_length`]: u32(shape.ffn),
  [`${a}.attention.head_count`]: u32(shape.heads),
  [`${a}.attention.head_count_kv`]: u32(shape.kv),
  [`${a}.rope.freq_base`]: f32(shape.llama31 ? 500000 : 1000000),
  [`${a}.attention.layer_norm_rms_epsilon`]: f32(shape.llama31 ? 1e-5 : 1e-6),
  "tokenizer.ggml.model": str("gpt2"),
  "tokenizer.ggml.pre": str(shape.llama31 ? "llama-bpe" : "qwen2"),
  "tokenizer.ggml.tokens": strs(tokens),
  "tokenizer.ggml.merges": strs([]),
  "tokenizer.ggml.eos_token_id": u32(shape.vocab - 1),
};
const tensors: GgufTensorInfo[] = [];
const mat = (name: string, rows: number, cols: number) => {
  const t = typeOf(name);
  tensors.push({ name, dims: [cols, rows], typeId: t.id, bytes: (rows * cols * t.bytes) / t.n });
};
const vec = (name: string, n: number) => tensors.push({ name, dims: [n], typeId: TYPE_IDS.F32, bytes: 4 * n });
mat("token_embd.weight", shape.vocab, shape.hidden);
vec("output_norm.weight", shape.hidden);
if (shape.llama31) {
  mat("output.weight", shape.vocab, shape.hidden);
  vec("rope_freqs.weight", hd / 2);
}
for (let l = 0; l < shape.layers; l++) {
  const p = `blk.${l}.`;
  vec(`${p}attn_norm.weight`, shape.hidden);
  vec(`${p}ffn_norm.weight`, shape.hidden);
  mat(`${p}attn_q.weight`, shape.heads * hd, shape.hidden);
  mat(`${p}attn_k.weight`, shape.kv * hd, shape.hidden);
  mat(`${p}attn_v.weight`, shape.kv * hd, shape.hidden);
  if (!shape.llama31) {
    vec(`${p}attn_q.bias`, shape.heads * hd);
    vec(`${p}attn_k.bias`, shape.kv * hd);
    vec(`${p}attn_v.bias`, shape.kv * hd);
  }
  mat(`${p}attn_output.weight`, shape.hidden, shape.heads * hd);
  mat(`${p}ffn_gate.weight`, shape.ffn, shape.hidden);
  mat(`${p}ffn_up.weight`, shape.ffn, shape.hidden);
  mat(`${p}ffn_down.weight`, shape.hidden, shape.ffn);
}
const { header, offsets, alignment } = ggufHeader({ metadata, tensors });

/** Llama 3.1's rope_freqs.weight: llama.cpp's converter's divisors for factor 8, low 1, high 4, original 8192. */
function llama31RopeFactors(): Float32Array {
  const out = new Float32Array(hd / 2);
  for (let i = 0; i < hd / 2; i++) {
    const wavelen = (2 * Math.PI) / (1 / 500000 ** ((2 * i) / hd));
    const smooth = (8192 / wavelen - 1) / (4 - 1);
    out[i] = wavelen < 8192 / 4 ? 1 : wavelen > 8192 / 1 ? 8 : 1 / ((1 - smooth) / 8 + smooth);
  }
  return out;
}

/** Random blocks with small finite scales (f16 fields overwritten), or unit norms, zero biases, the rope factors. */
function fillTensor(t: GgufTensorInfo, buf: Uint8Array): void {
  if (t.typeId === TYPE_IDS.F32) {
    const v = new Float32Array(buf.buffer, buf.byteOffset, buf.byteLength / 4);
    if (t.name === "rope_freqs.weight") v.set(llama31RopeFactors());
    else v.fill(t.name.endsWith("norm.weight") ? 1 : 0);
    return;
  }
  const type = typeOf(t.name);
  randomFillSync(buf);
  const setF16 = (at: number, h: number) => {
    buf[at] = h & 0xff;
    buf[at + 1] = h >> 8;
  };
  for (let o = 0; o < buf.byteLength; o += type.bytes) {
    if (type.name === "Q6_K")
      setF16(o + 208, 0x0c00); // d = 2^-12 (scales are int8 up to 127)
    else if (type.name === "Q4_K") {
      setF16(o, 0x1400); // d = 2^-10
      setF16(o + 2, 0x1000); // dmin = 2^-11
    } else if (type.name === "Q8_0")
      setF16(o, 0x1c00); // 2^-8
    else {
      setF16(o, 0x1c00);
      if (type.name === "Q4_1") setF16(o + 2, 0xa000); // m = -2^-7
    }
  }
}

progress(`writing ${path}`);
const t0 = performance.now();
const fd = openSync(path, "w");
writeSync(fd, header);
const chunkBlocks = 1 << 16;
for (const t of tensors) {
  const per = t.typeId === TYPE_IDS.F32 ? t.bytes : chunkBlocks * typeOf(t.name).bytes;
  for (let done = 0; done < t.bytes; done += per) {
    const buf = new Uint8Array(Math.min(per, t.bytes - done));
    fillTensor(t, buf);
    writeSync(fd, buf);
  }
  const pad = Math.ceil(t.bytes / alignment) * alignment - t.bytes;
  if (pad) writeSync(fd, new Uint8Array(pad));
}
closeSync(fd);
const fileBytes = header.length + offsets.at(-1)! + tensors.at(-1)!.bytes;
const writeMs = performance.now() - t0;

progress("loading (cold: packing the file's blocks)");
const rssBefore = process.memoryUsage().rss;
const t1 = performance.now();
const ckpt = await loadCheckpoint(path);
let model = await LlamaModel.load(ckpt, { threads: 1 });
const loadMs = performance.now() - t1;
const rssLoaded = process.memoryUsage().rss;
const c = ckpt.config;
const params =
  c.vocabSize * c.hiddenSize * (c.tieWordEmbeddings ? 1 : 2) +
  c.numLayers * (c.hiddenSize * (c.numHeads + 2 * c.numKvHeads) * c.headDim + c.numHeads * c.headDim * c.hiddenSize + 3 * c.hiddenSize * c.intermediateSize);
const placement = model.separateWeightBytes > 0 ? `${model.rt.weightRanges().length} weight memories of their own` : "the main memory";
const wasmBytes = model.rt.byteLength + model.separateWeightBytes;

progress("prefill and decode");
const prompt = Array.from({ length: 16 }, (_, i) => 300 + i * 7);
const cache = model.newCache(prompt.length + args.steps + 1);
const t2 = performance.now();
let logits = model.prefill(prompt, cache);
const prefillMs = performance.now() - t2;
const stepMs: number[] = [];
const ours: number[] = [];
for (let i = 0; i < args.steps; i++) {
  const s = performance.now();
  ours.push(argmax(logits));
  [logits] = model.decode([{ cache, token: ours.at(-1)! }]);
  stepMs.push(performance.now() - s);
}
const finite = logits.every((v) => Number.isFinite(v));
const roof: number[] = [];
for (let i = 0; i < 5; i++) {
  const s = performance.now();
  model.streamWeights();
  roof.push(performance.now() - s);
}
const rssEnd = process.memoryUsage().rss;

// Warm: the packed image through an artifact cache of this run's own (not the user's).
progress("storing the packed image, then loading from it (warm)");
const artifacts = new ArtifactCache(join(dir, "artifacts"));
const parts = { kind: "packed-weights", weightsFingerprint: ckpt.fingerprint, variant: null, kernelVersion: LlamaModel.packedFormat };
const t3 = performance.now();
const packed = model.exportPackedWeights();
const key = artifacts.write(parts, packed.segments);
const storeMs = performance.now() - t3;
model.close();
const t4 = performance.now();
const reader = artifacts.reader(key);
if (!reader) throw new Error("the packed image just stored did not read back");
model = await LlamaModel.loadPacked(ckpt, reader, { threads: 1 });
const verified = reader.verify();
reader.close();
if (!verified) throw new Error("the packed image just stored failed its CRC-32");
const warmMs = performance.now() - t4;
const rssWarm = process.memoryUsage().rss;
const again = model.newCache(prompt.length + 2);
const warmSame = argmax(model.prefill(prompt, again)) === ours[0];
model.close();
ckpt.tensors.close();
const imageBytes = artifacts.sizeOf(key);
rmSync(join(dir, "artifacts"), { recursive: true, force: true });

// llama.cpp on the same file, one thread, the same prompt and greedy steps.
let cpp: { loadMs: number; prefillMs: number; stepMs: number; rssGib: number } | null = null;
if (args.llamacppSteps > 0) {
  progress("llama.cpp (node-llama-cpp, one thread) on the same file");
  const t5 = performance.now();
  const lc = await openLlamaCpp(path);
  const cppLoad = performance.now() - t5;
  const context = await lc.model.createContext({ contextSize: 64, batchSize: prompt.length, threads: 1, sequences: 1 });
  const sequence = context.getSequence();
  const t6 = performance.now();
  await sequence.evaluateWithoutGeneratingNewTokens(prompt.slice(0, -1) as never[]);
  const cppPrefill = performance.now() - t6;
  const times: number[] = [];
  let last = performance.now();
  let n = 0;
  for await (const _ of sequence.evaluate([prompt.at(-1)] as never[], { temperature: 0 })) {
    const now = performance.now();
    times.push(now - last);
    last = now;
    if (++n >= args.llamacppSteps) break;
  }
  const rssCpp = process.memoryUsage().rss;
  await context.dispose();
  await lc.model.dispose();
  await lc.llama.dispose();
  // the first interval includes the last prompt token's evaluation
  cpp = { loadMs: cppLoad, prefillMs: cppPrefill, stepMs: summarize(times.slice(1)).median, rssGib: rssCpp / 2 ** 30 };
}
progressDone();
const st = summarize(stepMs);
const rf = summarize(roof);
console.log(
  `model: generated ${args.preset} (${c.architecture}: ${c.numLayers} layers, hidden ${c.hiddenSize}, heads ${c.numHeads}/${c.numKvHeads}, ffn ${c.intermediateSize}, vocab ${c.vocabSize}, rope ${c.ropeScaling?.type ?? "plain"}), ${(params / 1e9).toFixed(2)} B parameters, matrices ${args.type}`,
);
console.log(
  `file: ${(fileBytes / 1e9).toFixed(2)} GB written in ${(writeMs / 1000).toFixed(1)} s; cold load ${(loadMs / 1000).toFixed(1)} s; matrices held: ${JSON.stringify(model.weightKinds)} in ${placement}`,
);
console.log(
  `warm load from the packed image (${(imageBytes / 1e9).toFixed(2)} GB, stored in ${(storeMs / 1000).toFixed(1)} s): ${(warmMs / 1000).toFixed(1)} s (read into the memories, CRC-32 checked); first token the same as cold: ${warmSame}`,
);
console.log(
  `resident: RSS ${(rssLoaded / 2 ** 30).toFixed(2)} GiB after the cold load (${((rssLoaded - rssBefore) / 2 ** 30).toFixed(2)} GiB for the model), ${(rssEnd / 2 ** 30).toFixed(2)} GiB after decoding, ${(rssWarm / 2 ** 30).toFixed(2)} GiB after the warm load; wasm memories ${(wasmBytes / 2 ** 30).toFixed(2)} GiB`,
);
console.log(`prefill ${prompt.length} tokens: ${prefillMs.toFixed(0)} ms = ${((1000 * prompt.length) / prefillMs).toFixed(1)} tok/s`);
console.log(`decode B=1: ${fmt(st, "ms/token")} -> ${(1000 / st.median).toFixed(2)} tok/s; logits finite: ${finite}`);
console.log(
  `roofline (plain read of the ${(model.weightBytesPerToken / 1e9).toFixed(2)} GB held): ${fmt(rf)} -> at most ${(1000 / rf.median).toFixed(2)} tok/s; decode at ${((100 * rf.median) / st.median).toFixed(0)}% of it`,
);
if (cpp) {
  console.log(
    `llama.cpp (one thread, same file): load ${(cpp.loadMs / 1000).toFixed(1)} s (mmap), prefill ${prompt.length - 1} tokens ${cpp.prefillMs.toFixed(0)} ms, decode ${cpp.stepMs.toFixed(0)} ms/token -> ${(1000 / cpp.stepMs).toFixed(2)} tok/s; ours / llama.cpp decode ${(cpp.stepMs / st.median).toFixed(3)}`,
  );
}
if (!args.keep && !args.out) rmSync(dir, { recursive: true, force: true });
else console.log(`kept ${path}`);
finalLine({
  bench: "llama-large",
  preset: args.preset,
  type: args.type,
  params,
  file_bytes: fileBytes,
  load_s: loadMs / 1000,
  warm_load_s: warmMs / 1000,
  warm_same_token: warmSame,
  rss_gib: rssLoaded / 2 ** 30,
  model_rss_gib: (rssLoaded - rssBefore) / 2 ** 30,
  wasm_gib: wasmBytes / 2 ** 30,
  weight_memories: placement,
  prefill_tok_s: (1000 * prompt.length) / prefillMs,
  decode_tok_s: 1000 / st.median,
  roofline_tok_s: 1000 / rf.median,
  decode_over_roofline: rf.median / st.median,
  logits_finite: finite,
  ...(cpp ? { llamacpp_decode_tok_s: 1000 / cpp.stepMs, ratio_vs_llamacpp: cpp.stepMs / st.median, llamacpp_load_s: cpp.loadMs / 1000, llamacpp_rss_gib: cpp.rssGib } : {}),
});
