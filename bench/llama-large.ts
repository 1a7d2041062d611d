// A generated GGUF of a real 1.5 B or 3 B model shape (Qwen2.5-1.5B / -3B: layers, widths, GQA,
// q/k/v bias, the 151936-token vocabulary, tied embeddings) with random quantized blocks: it is
// written to a temp file, loaded by our CPU engine with the blocks resident, and decoded. Prints
// load time, resident memory, prefill and decode tokens/s, against the streaming roofline of the
// same weight bytes measured in the same run. No such checkpoint ships here; the weights are
// noise, so the tokens mean nothing; shape, bytes and speed are what this measures.
// Usage: pnpm bench llama-large [--preset 1.5b|3b] [--type Q4_1|Q4_0|Q8_0|Q4_K] [--steps N] [--keep]
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
import { flag, flagOf, int, oneOf } from "../packages/rm-core/src/index.ts";
import { benchArgs, finalLine, fmt, progress, progressDone, summarize } from "./lib.ts";

const PRESETS = {
  "1.5b": { hidden: 1536, layers: 28, heads: 12, kv: 2, ffn: 8960, vocab: 151936 },
  "3b": { hidden: 2048, layers: 36, heads: 16, kv: 2, ffn: 11008, vocab: 151936 },
} as const;

const args = benchArgs("llama-large", "load and decode a generated 1.5 B / 3 B parameter quantized GGUF", {
  preset: flagOf(oneOf(["1.5b", "3b"] as const), { default: "1.5b", doc: "model shape (Qwen2.5)" }),
  type: flagOf(oneOf(["Q4_1", "Q4_0", "Q8_0", "Q4_K"] as const), { default: "Q4_1", doc: "block type of every matrix" }),
  steps: flagOf(int({ min: 1 }), { default: 16, doc: "decode steps" }),
  keep: flagOf(flag(), { default: false, doc: "keep the generated file" }),
});
const shape = PRESETS[args.preset];
// the block type's ggml id, elements and bytes per block
const [typeId, ggml] = Object.entries(GGML_TYPES).find(([, t]) => t.name === args.type)!;
const type = { id: Number(typeId), n: ggml.blockSize, bytes: ggml.typeSize };
const hd = shape.hidden / shape.heads;

// ---- the file: the test fixtures' GGUF header, then tensor data written in chunks
const dir = mkdtempSync(join(tmpdir(), "airm-large-"));
const path = join(dir, `generated-${args.preset}-${args.type}.gguf`);
// a byte-level BPE vocabulary of the model's size: the 256 byte tokens, fillers, two specials
const tokens = [...bytesToUnicode(), ...Array.from({ length: shape.vocab - 256 - 2 }, (_, i) => `Ġw${i}`), "<|endoftext|>", "<|im_end|>"];
const metadata: Record<string, MetaValue> = {
  "general.architecture": str("qwen2"),
  "general.name": str(`generated-${args.preset}`),
  "qwen2.block_count": u32(shape.layers),
  "qwen2.context_length": u32(32768),
  "qwen2.embedding_length": u32(shape.hidden),
  "qwen2.feed_forward_length": u32(shape.ffn),
  "qwen2.attention.head_count": u32(shape.heads),
  "qwen2.attention.head_count_kv": u32(shape.kv),
  "qwen2.rope.freq_base": f32(1000000),
  "qwen2.attention.layer_norm_rms_epsilon": f32(1e-6),
  "tokenizer.ggml.model": str("gpt2"),
  "tokenizer.ggml.pre": str("qwen2"),
  "tokenizer.ggml.tokens": strs(tokens),
  "tokenizer.ggml.merges": strs([]),
  "tokenizer.ggml.eos_token_id": u32(shape.vocab - 1),
};
const tensors: GgufTensorInfo[] = [];
const mat = (name: string, rows: number, cols: number) => tensors.push({ name, dims: [cols, rows], typeId: type.id, bytes: (rows * cols * type.bytes) / type.n });
const vec = (name: string, n: number) => tensors.push({ name, dims: [n], typeId: TYPE_IDS.F32, bytes: 4 * n });
mat("token_embd.weight", shape.vocab, shape.hidden);
vec("output_norm.weight", shape.hidden);
for (let l = 0; l < shape.layers; l++) {
  const p = `blk.${l}.`;
  vec(`${p}attn_norm.weight`, shape.hidden);
  vec(`${p}ffn_norm.weight`, shape.hidden);
  mat(`${p}attn_q.weight`, shape.heads * hd, shape.hidden);
  mat(`${p}attn_k.weight`, shape.kv * hd, shape.hidden);
  mat(`${p}attn_v.weight`, shape.kv * hd, shape.hidden);
  vec(`${p}attn_q.bias`, shape.heads * hd);
  vec(`${p}attn_k.bias`, shape.kv * hd);
  vec(`${p}attn_v.bias`, shape.kv * hd);
  mat(`${p}attn_output.weight`, shape.hidden, shape.heads * hd);
  mat(`${p}ffn_gate.weight`, shape.ffn, shape.hidden);
  mat(`${p}ffn_up.weight`, shape.ffn, shape.hidden);
  mat(`${p}ffn_down.weight`, shape.hidden, shape.ffn);
}
const { header, offsets, alignment } = ggufHeader({ metadata, tensors });

/** Random blocks with small finite scales (f16 fields overwritten), or unit norms and zero biases. */
function fillTensor(t: GgufTensorInfo, buf: Uint8Array): void {
  if (t.typeId === TYPE_IDS.F32) {
    new Float32Array(buf.buffer, buf.byteOffset, buf.byteLength / 4).fill(t.name.endsWith("norm.weight") ? 1 : 0);
    return;
  }
  randomFillSync(buf);
  const setF16 = (at: number, h: number) => {
    buf[at] = h & 0xff;
    buf[at + 1] = h >> 8;
  };
  for (let o = 0; o < buf.byteLength; o += type.bytes) {
    if (args.type === "Q4_K") {
      setF16(o, 0x1400); // d = 2^-10
      setF16(o + 2, 0x1000); // dmin = 2^-11
    } else if (args.type === "Q8_0")
      setF16(o, 0x1c00); // 2^-8
    else {
      setF16(o, 0x1c00);
      if (args.type === "Q4_1") setF16(o + 2, 0xa000); // m = -2^-7
    }
  }
}

progress(`writing ${path}`);
const t0 = performance.now();
const fd = openSync(path, "w");
writeSync(fd, header);
const chunkBlocks = 1 << 16;
for (const t of tensors) {
  const per = t.typeId === TYPE_IDS.F32 ? t.bytes : chunkBlocks * type.bytes;
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

progress("loading");
const rssBefore = process.memoryUsage().rss;
const t1 = performance.now();
const ckpt = await loadCheckpoint(path);
const model = await LlamaModel.load(ckpt, { threads: 1 });
const loadMs = performance.now() - t1;
const rssLoaded = process.memoryUsage().rss;
const c = ckpt.config;
const params =
  c.vocabSize * c.hiddenSize * (c.tieWordEmbeddings ? 1 : 2) +
  c.numLayers * (c.hiddenSize * (c.numHeads + 2 * c.numKvHeads) * c.headDim + c.numHeads * c.headDim * c.hiddenSize + 3 * c.hiddenSize * c.intermediateSize);

progress("prefill and decode");
const prompt = Array.from({ length: 16 }, (_, i) => 300 + i * 7);
const cache = model.newCache(prompt.length + args.steps + 1);
const t2 = performance.now();
let logits = model.prefill(prompt, cache);
const prefillMs = performance.now() - t2;
const stepMs: number[] = [];
for (let i = 0; i < args.steps; i++) {
  const s = performance.now();
  [logits] = model.decode([{ cache, token: argmax(logits) }]);
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
progressDone();
const st = summarize(stepMs);
const rf = summarize(roof);
console.log(
  `model: generated ${args.preset} (Qwen2.5 shape: ${c.numLayers} layers, hidden ${c.hiddenSize}, ffn ${c.intermediateSize}, vocab ${c.vocabSize}), ${(params / 1e9).toFixed(2)} B parameters, every matrix ${args.type}`,
);
console.log(
  `file: ${(fileBytes / 1e9).toFixed(2)} GB written in ${(writeMs / 1000).toFixed(1)} s; loaded in ${(loadMs / 1000).toFixed(1)} s; matrices held: ${JSON.stringify(model.weightKinds)}`,
);
console.log(
  `resident: RSS ${(rssLoaded / 2 ** 30).toFixed(2)} GiB after load (${((rssLoaded - rssBefore) / 2 ** 30).toFixed(2)} GiB for the model), ${(rssEnd / 2 ** 30).toFixed(2)} GiB at the end; wasm memory ${(model.rt.byteLength / 2 ** 30).toFixed(2)} GiB of the 4 GiB cap`,
);
console.log(`prefill ${prompt.length} tokens: ${prefillMs.toFixed(0)} ms = ${((1000 * prompt.length) / prefillMs).toFixed(1)} tok/s`);
console.log(`decode B=1: ${fmt(st, "ms/token")} -> ${(1000 / st.median).toFixed(2)} tok/s; logits finite: ${finite}`);
console.log(
  `roofline (plain read of the ${(model.weightBytesPerToken / 1e9).toFixed(2)} GB held): ${fmt(rf)} -> at most ${(1000 / rf.median).toFixed(2)} tok/s; decode at ${((100 * rf.median) / st.median).toFixed(0)}% of it`,
);
model.close();
ckpt.tensors.close();
if (!args.keep) rmSync(dir, { recursive: true, force: true });
else console.log(`kept ${path}`);
finalLine({
  bench: "llama-large",
  preset: args.preset,
  type: args.type,
  params,
  file_bytes: fileBytes,
  load_s: loadMs / 1000,
  rss_gib: rssLoaded / 2 ** 30,
  model_rss_gib: (rssLoaded - rssBefore) / 2 ** 30,
  prefill_tok_s: (1000 * prompt.length) / prefillMs,
  decode_tok_s: 1000 / st.median,
  roofline_tok_s: 1000 / rf.median,
  decode_over_roofline: rf.median / st.median,
  logits_finite: finite,
});
