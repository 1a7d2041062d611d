// pnpm bench pd-vs-solo [--model DIR] [--seq-len 512] [--prompts 12] [--max-tokens 32]
//                       [--decode-backend atom] [--transport shm] [--warmup 2] [--clean] [--sequential]
// --sequential runs the PD cluster through every prompt, stops it, then the solo worker: for models
// of which the machine holds two copies but not three (PD's two workers and solo's one).
// The same prompts through a PD cluster (prefill + decode workers, KV over the transport) and a
// solo worker, each behind its own gateway, in one run, alternating which goes first. Measures
// at the client over SSE: TTFT (request sent -> first token chunk) and TPOT ((last - first) /
// (completion tokens - 1)); KV handoff ms from the PD gateway's airm_kv_transfer_ms. Without
// --model it generates the 135m preset (SmolLM2-135M's shape) once into a temp folder.
import { existsSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { makeTinyModel } from "../packages/llama/src/index.ts";
import { flagOf, int, switchOf, text } from "../packages/rm-core/src/index.ts";
import { startLocalCluster, type ClusterOptions, type RunningCluster } from "../packages/workload-runner/src/index.ts";
import { benchArgs, finalLine, fmt, progress, progressDone, sseEvents, summarize } from "./lib.ts";

const args = benchArgs("pd-vs-solo", "the same prompts through a PD cluster and a solo worker, each behind its own gateway, in one run", {
  model: flagOf(text({ label: "path" }), { defaultText: "the generated 135m preset", doc: "model folder or .gguf" }),
  seqLen: flagOf(int({ min: 8 }), { default: 512, doc: "compiled context" }),
  prompts: flagOf(int({ min: 1 }), { default: 12, doc: "prompts, of lengths spread up to seq-len - max-tokens" }),
  maxTokens: flagOf(int({ min: 2 }), { default: 32, doc: "tokens per completion" }),
  warmup: flagOf(int({ min: 0 }), { default: 2, doc: "unmeasured requests first" }),
  decodeBackend: flagOf(text({ label: "name" }), { default: "atom", doc: "decode engine backend" }),
  transport: flagOf(text({ label: "name" }), { default: "shm", doc: "KV transport" }),
  clean: switchOf({ doc: "remove the generated model afterwards" }),
  sequential: switchOf({ doc: "PD first, stopped, then solo (two copies of the weights at a time, not three)" }),
  readyTimeout: flagOf(int({ min: 1 }), { default: 300, doc: "seconds a cluster may take to become ready (a cold load of a large model is minutes)" }),
});
const { seqLen, maxTokens, warmup, decodeBackend, transport } = args;
const nPrompts = args.prompts;
let model = args.model;
let madeModel = false;

if (!model) {
  model = join(tmpdir(), "airm-bench-135m");
  if (!existsSync(join(model, "config.json"))) {
    progress("generating the 135m preset model...");
    makeTinyModel({ arch: "llama", preset: "135m", out: model });
    progressDone();
    madeModel = true;
  }
}

/** A cluster through the launcher on free ports (the gateway exports airm_* metrics). */
function cluster(o: Partial<ClusterOptions>): Promise<RunningCluster> {
  const free = [{ port: 0 }];
  return startLocalCluster({
    model: model!,
    maxModelLen: seqLen,
    port: 0,
    metricsPort: 0,
    sidecarPort: 0,
    prefill: free,
    decode: free,
    solo: free,
    env: { AIRM_LOG_LEVEL: "warn", AIRM_ENGINE_LOG: "0" },
    readyTimeoutMs: args.readyTimeout * 1000,
    ...o,
  });
}

/** Prompts of varied token lengths up to seqLen - maxTokens (token ids avoid the special tokens). */
function prompts(): number[][] {
  const maxLen = seqLen - maxTokens;
  return Array.from({ length: nPrompts }, (_, i) => {
    const len = Math.max(4, Math.round(((i + 1) / nPrompts) * maxLen));
    return Array.from({ length: len }, (_, j) => 3 + ((j * 31 + i * 17) % 400));
  });
}

interface Sample {
  ttftMs: number;
  tpotMs: number | null;
  tokens: number;
  text: string;
}

async function once(c: RunningCluster, modelId: string, prompt: number[]): Promise<Sample> {
  const t0 = performance.now();
  const r = await fetch(`${c.url}/v1/completions`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify({ model: modelId, prompt, max_tokens: maxTokens, temperature: 0, stream: true, stream_options: { include_usage: true } }),
  });
  if (!r.ok) throw new Error(`gateway answered ${r.status}: ${await r.text()}`);
  let first: number | null = null;
  let last = 0;
  let text = "";
  let tokens = 0;
  for await (const j of sseEvents(r.body!)) {
    if (j.error) throw new Error(`stream error: ${j.error.message}`);
    if (j.usage) tokens = j.usage.completion_tokens;
    const ch = j.choices?.[0];
    if (!ch) continue;
    const now = performance.now();
    first ??= now;
    if (ch.finish_reason) last = now;
    text += ch.text ?? "";
  }
  if (first === null) throw new Error("no token chunk arrived");
  return { ttftMs: first - t0, tpotMs: tokens > 1 ? (last - first) / (tokens - 1) : null, tokens, text };
}

/** Each part's resident and peak resident memory in GiB (/proc/<pid>/status), by part name. */
function partMemory(c: RunningCluster): Record<string, { rssGib: number; peakGib: number }> {
  const out: Record<string, { rssGib: number; peakGib: number }> = {};
  for (const p of c.parts) {
    try {
      const status = readFileSync(`/proc/${p.child.pid}/status`, "utf8");
      const kib = (k: string) => Number(new RegExp(`^${k}:\\s+(\\d+) kB`, "m").exec(status)?.[1] ?? Number.NaN);
      out[p.spec.name] = { rssGib: kib("VmRSS") / 2 ** 20, peakGib: kib("VmHWM") / 2 ** 20 };
    } catch {
      // a part that has exited has no status
    }
  }
  return out;
}
const memoryLine = (m: Record<string, { rssGib: number; peakGib: number }>) =>
  Object.entries(m)
    .map(([name, v]) => `${name} ${v.rssGib.toFixed(2)} (peak ${v.peakGib.toFixed(2)})`)
    .join(", ");

async function metricValue(url: string, name: string): Promise<number | null> {
  const m = new RegExp(`^${name}(?:\\{[^}]*\\})? (\\S+)$`, "m").exec(await (await fetch(url)).text());
  return m ? Number(m[1]) : null;
}

const modelIdOf = async (c: RunningCluster) => ((await (await fetch(`${c.url}/v1/models`)).json()) as { data: { id: string }[] }).data[0].id;
/** Every prompt through one system (warm-up requests first). */
async function all(c: RunningCluster, name: string, ps: number[][]): Promise<Sample[]> {
  const modelId = await modelIdOf(c);
  for (let w = 0; w < warmup; w++) await once(c, modelId, ps[w % ps.length]);
  const out: Sample[] = [];
  for (const [i, p] of ps.entries()) {
    progress(`${name}: prompt ${i + 1}/${ps.length} (${p.length} tokens)`);
    out.push(await once(c, modelId, p));
  }
  return out;
}

progress(args.sequential ? "starting the PD cluster (solo follows once it is stopped)" : "starting the PD cluster and the solo worker");
let pd: RunningCluster | undefined = await cluster({ kvTransport: transport, decode: [{ port: 0, backend: decodeBackend }] });
let solo: RunningCluster | undefined;
try {
  const ps = prompts();
  let pdS: Sample[] = [];
  let soloS: Sample[] = [];
  let kvMs: number | null;
  let pdMem: ReturnType<typeof partMemory>;
  let soloMem: ReturnType<typeof partMemory>;
  if (args.sequential) {
    pdS = await all(pd, "PD", ps);
    kvMs = await metricValue(pd.metricsUrl!, "airm_kv_transfer_ms");
    pdMem = partMemory(pd);
    await pd.stop();
    pd = undefined;
    progress("starting the solo worker");
    solo = await cluster({ mode: "solo", solo: [{ port: 0, backend: "rngd" }] });
    soloS = await all(solo, "solo", ps);
    soloMem = partMemory(solo);
  } else {
    solo = await cluster({ mode: "solo", solo: [{ port: 0, backend: "rngd" }] });
    const modelId = await modelIdOf(pd);
    for (let w = 0; w < warmup; w++) {
      await once(pd, modelId, ps[w % ps.length]);
      await once(solo, modelId, ps[w % ps.length]);
    }
    for (const [i, p] of ps.entries()) {
      progress(`prompt ${i + 1}/${ps.length} (${p.length} tokens)`);
      const order = i % 2 === 0 ? ([pd, solo] as const) : ([solo, pd] as const);
      const a = await once(order[0], modelId, p);
      const b = await once(order[1], modelId, p);
      const [x, y] = order[0] === pd ? [a, b] : [b, a];
      pdS.push(x);
      soloS.push(y);
    }
    kvMs = await metricValue(pd.metricsUrl!, "airm_kv_transfer_ms");
    pdMem = partMemory(pd);
    soloMem = partMemory(solo);
  }
  let mismatches = 0;
  for (const [i, x] of pdS.entries()) if (x.text !== soloS[i].text || x.tokens !== soloS[i].tokens) mismatches++;
  progressDone();
  const q = (xs: number[], p: number) => [...xs].sort((a, b) => a - b)[Math.min(xs.length - 1, Math.ceil(p * xs.length) - 1)];
  const stats = (ss: Sample[]) => {
    const ttft = ss.map((s) => s.ttftMs);
    const tpot = ss.flatMap((s) => (s.tpotMs === null ? [] : [s.tpotMs]));
    return { ttft: summarize(ttft), ttftP90: q(ttft, 0.9), tpot: summarize(tpot), tpotP90: q(tpot, 0.9) };
  };
  const P = stats(pdS);
  const R = stats(soloS);
  console.log(`model ${model} S=${seqLen} prompts=${ps.length} max_tokens=${maxTokens} decode=${decodeBackend} transport=${transport}${args.sequential ? " (sequential)" : ""}`);
  console.log(`TTFT  PD   ${fmt(P.ttft)} p90 ${P.ttftP90.toFixed(2)} ms`);
  console.log(`TTFT  solo ${fmt(R.ttft)} p90 ${R.ttftP90.toFixed(2)} ms`);
  console.log(`TPOT  PD   ${fmt(P.tpot)} p90 ${P.tpotP90.toFixed(2)} ms`);
  console.log(`TPOT  solo ${fmt(R.tpot)} p90 ${R.tpotP90.toFixed(2)} ms`);
  console.log(`KV handoff (push + load, median) ${kvMs?.toFixed(2)} ms; token mismatches PD vs solo: ${mismatches}`);
  console.log(`RSS per part, GiB: PD ${memoryLine(pdMem)}; solo ${memoryLine(soloMem)}`);
  finalLine({
    bench: "pd-vs-solo",
    median_ms: P.ttft.median,
    ref_median_ms: R.ttft.median,
    ratio: P.ttft.median / R.ttft.median,
    ttft_ratio: P.ttft.median / R.ttft.median,
    tpot_ratio: P.tpot.median / R.tpot.median,
    pd_ttft_p50_ms: P.ttft.median,
    pd_ttft_p90_ms: P.ttftP90,
    solo_ttft_p50_ms: R.ttft.median,
    solo_ttft_p90_ms: R.ttftP90,
    pd_tpot_p50_ms: P.tpot.median,
    pd_tpot_p90_ms: P.tpotP90,
    solo_tpot_p50_ms: R.tpot.median,
    solo_tpot_p90_ms: R.tpotP90,
    kv_handoff_ms: kvMs,
    mismatches,
    seq_len: seqLen,
    prompts: ps.length,
    transport,
    decode_backend: decodeBackend,
    sequential: args.sequential,
    rss_gib: Object.fromEntries([
      ...Object.entries(pdMem).map(([k, v]) => [k, Number(v.rssGib.toFixed(3))]),
      ...Object.entries(soloMem).map(([k, v]) => [`solo:${k}`, Number(v.rssGib.toFixed(3))]),
    ]),
  });
} finally {
  await solo?.stop();
  await pd?.stop();
  if (madeModel && args.clean) rmSync(model, { recursive: true, force: true });
}
