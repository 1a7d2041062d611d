import { flagOf, int, list } from "../packages/rm-core/src/index.ts";
import { startLocalCluster, startUpCluster, type RunningCluster } from "../packages/workload-runner/src/index.ts";
import { benchArgs, finalLine, fmt, progress, progressDone, sseEvents, summarize, type Summary } from "./lib.ts";
import { benchModel } from "./serve-load/model.ts";
import { chatPrompts, type ChatPrompt } from "./serve-load/prompts.ts";

const args = benchArgs("structured", "json_schema-constrained against unconstrained streams, same prompts, PD (airm up) and solo, by concurrency", {
  levels: flagOf(list(int({ min: 1, max: 64 }), /,/), { default: [1, 8], doc: "concurrency levels, comma-separated" }),
  samples: flagOf(int({ min: 1 }), {
    default: 24,
    doc: "answers of each kind per level, in rounds of `level` requests: unconstrained then constrained, the order alternating",
  }),
  maxTokens: flagOf(int({ min: 8, max: 256 }), { default: 64, doc: "tokens per answer" }),
  seed: flagOf(int({ min: 0 }), { default: 1, doc: "seed of the prompts and of sampling" }),
});

/**
 * More items than any answer of max_tokens holds: the grammar keeps the answer going. No string
 * length bound: xgrammar's maxLength costs compile and mask time of its own (docs/decisions.md).
 */
const SCHEMA = {
  type: "object",
  properties: {
    items: {
      type: "array",
      minItems: 64,
      items: {
        type: "object",
        properties: { name: { type: "string" }, count: { type: "integer", minimum: 0, maximum: 999 }, ok: { type: "boolean" } },
        required: ["name", "count", "ok"],
      },
    },
  },
  required: ["items"],
};

interface Sample {
  ttftMs: number;
  tpotMs: number | null;
  tokens: number;
}

async function stream(url: string, model: string, p: ChatPrompt, constrained: boolean, seed: number): Promise<Sample> {
  const body = {
    model,
    messages: p.messages,
    max_tokens: args.maxTokens,
    temperature: 0.7,
    seed,
    stream: true,
    stream_options: { include_usage: true },
    ...(constrained ? { response_format: { type: "json_schema", json_schema: { name: "items", schema: SCHEMA } } } : { ignore_eos: true }),
  };
  const t0 = performance.now();
  const r = await fetch(`${url}/v1/chat/completions`, { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify(body) });
  if (r.status !== 200) throw new Error(`${r.status}: ${await r.text()}`);
  let first = 0;
  let last = 0;
  let tokens = 0;
  for await (const ev of sseEvents(r.body!)) {
    if (ev.error) throw new Error(ev.error.message);
    if (ev.usage) tokens = ev.usage.completion_tokens;
    if (ev.choices?.[0]?.delta?.content !== undefined || ev.choices?.[0]?.finish_reason) {
      const now = performance.now();
      if (!first && ev.choices[0].delta?.role === undefined) first = now;
      last = now;
    }
  }
  return { ttftMs: first - t0, tpotMs: tokens > 1 ? (last - first) / (tokens - 1) : null, tokens };
}

/** Sum of a counter over the decode workers' /metrics. */
async function counter(c: RunningCluster, name: string, role: "decode" | "solo"): Promise<number> {
  let sum = 0;
  for (const p of c.parts.filter((x) => x.name.startsWith(role))) {
    const text = await (await fetch(`${p.spec.url}/metrics`)).text();
    for (const line of text.split("\n")) if (line.startsWith(`${name}{`) || line.startsWith(`${name} `)) sum += Number(line.split(" ").at(-1));
  }
  return sum;
}

interface Row {
  system: string;
  level: number;
  plain: { ttft: Summary; tpot: Summary };
  json: { ttft: Summary; tpot: Summary };
  tokens: { plain: number; json: number };
  maskFillUs: number;
  maskWaitUs: number;
}

async function measure(system: string, c: RunningCluster, role: "decode" | "solo", model: string, level: number): Promise<Row> {
  const rounds = Math.ceil(args.samples / level);
  const prompts = chatPrompts(args.seed + level, level * rounds);
  const plain: Sample[] = [];
  const json: Sample[] = [];
  const before = {
    masks: await counter(c, "airm_grammar_masks_total", role),
    fill: await counter(c, "airm_grammar_mask_seconds_total", role),
    wait: await counter(c, "airm_grammar_mask_wait_seconds_total", role),
  };
  for (let r = 0; r < rounds; r++) {
    const batch = prompts.slice(r * level, (r + 1) * level);
    for (const constrained of r % 2 ? [true, false] : [false, true]) {
      progress(`${system} c${level} round ${r + 1}/${rounds} ${constrained ? "json_schema" : "unconstrained"}`);
      const out = await Promise.all(batch.map((p, i) => stream(c.url, model, p, constrained, args.seed * 1000 + r * level + i)));
      (constrained ? json : plain).push(...out);
    }
  }
  progressDone();
  const masks = (await counter(c, "airm_grammar_masks_total", role)) - before.masks;
  const fill = (await counter(c, "airm_grammar_mask_seconds_total", role)) - before.fill;
  const wait = (await counter(c, "airm_grammar_mask_wait_seconds_total", role)) - before.wait;
  const tpots = (xs: Sample[]) => summarize(xs.flatMap((x) => (x.tpotMs === null ? [] : [x.tpotMs])));
  return {
    system,
    level,
    plain: { ttft: summarize(plain.map((x) => x.ttftMs)), tpot: tpots(plain) },
    json: { ttft: summarize(json.map((x) => x.ttftMs)), tpot: tpots(json) },
    tokens: { plain: plain.reduce((a, x) => a + x.tokens, 0), json: json.reduce((a, x) => a + x.tokens, 0) },
    maskFillUs: masks ? (fill * 1e6) / masks : 0,
    maskWaitUs: masks ? (wait * 1e6) / masks : 0,
  };
}

async function modelIdOf(url: string): Promise<string> {
  return ((await (await fetch(`${url}/v1/models`)).json()) as { data: { id: string }[] }).data[0].id;
}

const modelPath = benchModel();
const rows: Row[] = [];
const pd = (await startUpCluster(["--model", modelPath, "--quiet"], { env: process.env })).cluster;
const solo = await startLocalCluster({
  mode: "solo",
  model: modelPath,
  maxModelLen: 512,
  port: 0,
  solo: [{ port: 0, backend: "rngd", batch: 16 }],
  env: { AIRM_LOG_LEVEL: "warn", AIRM_ENGINE_LOG: "0" },
});
try {
  const model = await modelIdOf(pd.url);
  for (const level of args.levels) {
    rows.push(await measure("pd", pd, "decode", model, level));
    rows.push(await measure("solo", solo, "solo", model, level));
  }
} finally {
  await pd.stop();
  await solo.stop();
}

console.log(`\nmodel ${modelPath}; ${args.samples} answers of each kind per level, ${args.maxTokens} tokens each, temperature 0.7`);
console.log("system  level  TTFT plain / json (ms)            TPOT plain / json (ms)             TPOT ratio  mask fill / wait (us per token)");
for (const r of rows) {
  console.log(
    `${r.system.padEnd(7)} c${String(r.level).padEnd(5)} ${fmt(r.plain.ttft, "", 1)} / ${fmt(r.json.ttft, "", 1)}   ${fmt(r.plain.tpot, "", 2)} / ${fmt(r.json.tpot, "", 2)}   ${(r.json.tpot.median / r.plain.tpot.median).toFixed(3)}   ${r.maskFillUs.toFixed(1)} / ${r.maskWaitUs.toFixed(1)}`,
  );
  if (r.tokens.plain !== r.tokens.json) console.log(`  (tokens decoded differ: plain ${r.tokens.plain}, json ${r.tokens.json})`);
}
const top = rows.filter((r) => r.system === "pd").at(-1)!;
finalLine({
  bench: "structured",
  level: top.level,
  median_ms: top.json.tpot.median,
  ref_median_ms: top.plain.tpot.median,
  ratio: top.json.tpot.median / top.plain.tpot.median,
  rows: rows.map((r) => ({
    system: r.system,
    level: r.level,
    ttft_plain_ms: r.plain.ttft.median,
    ttft_json_ms: r.json.ttft.median,
    tpot_plain_ms: r.plain.tpot.median,
    tpot_json_ms: r.json.tpot.median,
    tpot_ratio: r.json.tpot.median / r.plain.tpot.median,
    mask_fill_us: r.maskFillUs,
    mask_wait_us: r.maskWaitUs,
  })),
});
