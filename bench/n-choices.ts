import { flagOf, int } from "../packages/rm-core/src/index.ts";
import { startUpCluster } from "../packages/workload-runner/src/index.ts";
import { benchArgs, finalLine, fmt, progress, progressDone, summarize } from "./lib.ts";
import { airmPart, cpuByPart } from "./serve-load/cpu-time.ts";
import { benchModel } from "./serve-load/model.ts";

const args = benchArgs("n-choices", "one request with n choices against n separate requests, through airm up's defaults", {
  n: flagOf(int({ min: 2, max: 16 }), { default: 4, doc: "choices" }),
  maxTokens: flagOf(int({ min: 2, max: 256 }), { default: 64, doc: "tokens per choice (ignore_eos)" }),
  rounds: flagOf(int({ min: 1 }), { default: 5, doc: "rounds; each runs both ways" }),
  seed: flagOf(int({ min: 0 }), { default: 11, doc: "seed of the first choice" }),
});

const PROMPT = "Write a short story about a lighthouse keeper who finds a message in a bottle.";

const modelPath = benchModel();
const { cluster } = await startUpCluster(["--model", modelPath, "--quiet"], { env: process.env });
const prefillUrl = cluster.parts.find((p) => p.name.startsWith("prefill"))!.spec.url;

async function chat(model: string, n: number, seed: number): Promise<string[]> {
  const r = await fetch(`${cluster.url}/v1/chat/completions`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify({ model, messages: [{ role: "user", content: PROMPT }], max_tokens: args.maxTokens, temperature: 0.8, seed, n, ignore_eos: true }),
  });
  const body = (await r.json()) as { choices: { index: number; message: { content: string } }[]; error?: { message: string } };
  if (r.status !== 200) throw new Error(`${r.status}: ${body.error?.message}`);
  return body.choices.sort((a, b) => a.index - b.index).map((c) => c.message.content);
}

async function prefills(): Promise<number> {
  const text = await (await fetch(`${prefillUrl}/metrics`)).text();
  return text
    .split("\n")
    .filter((l) => l.startsWith("airm_worker_requests_total{") && l.includes('route="prefill"'))
    .reduce((a, l) => a + Number(l.split(" ").at(-1)), 0);
}

/** Runs `fn`, measuring its wall time, the prefill worker's and every part's CPU seconds, and the prefills. */
async function measured(fn: () => Promise<string[]>): Promise<{ ms: number; prefillCpuMs: number; totalCpuMs: number; prefills: number; texts: string[] }> {
  const total = (m: Map<string, number>) => [...m.values()].reduce((a, x) => a + x, 0);
  const cpu0 = cpuByPart(process.pid, airmPart);
  const p0 = await prefills();
  const t0 = performance.now();
  const texts = await fn();
  const ms = performance.now() - t0;
  const cpu1 = cpuByPart(process.pid, airmPart);
  const prefillCpuMs = ((cpu1.get("prefill workers") ?? 0) - (cpu0.get("prefill workers") ?? 0)) * 1000;
  return { ms, prefillCpuMs, totalCpuMs: (total(cpu1) - total(cpu0)) * 1000, prefills: (await prefills()) - p0, texts };
}

const one: Awaited<ReturnType<typeof measured>>[] = [];
const separate: Awaited<ReturnType<typeof measured>>[] = [];
try {
  const model = ((await (await fetch(`${cluster.url}/v1/models`)).json()) as { data: { id: string }[] }).data[0].id;
  await chat(model, 1, 1); // warm-up: compiles, caches
  for (let r = 0; r < args.rounds; r++) {
    const seed = args.seed + 100 * r;
    const ways = [
      () => measured(() => chat(model, args.n, seed)).then((m) => one.push(m)),
      () => measured(async () => (await Promise.all(Array.from({ length: args.n }, (_, i) => chat(model, 1, seed + i)))).flat()).then((m) => separate.push(m)),
    ];
    progress(`round ${r + 1}/${args.rounds}`);
    for (const way of r % 2 ? ways.reverse() : ways) await way();
    if (one.at(-1)!.texts.join("\u0000") !== separate.at(-1)!.texts.join("\u0000")) throw new Error(`round ${r + 1}: n choices differ from the separate requests`);
  }
  progressDone();
} finally {
  await cluster.stop();
}

const s = (xs: number[]) => summarize(xs);
const wall = { one: s(one.map((m) => m.ms)), separate: s(separate.map((m) => m.ms)) };
const cpu = { one: s(one.map((m) => m.prefillCpuMs)), separate: s(separate.map((m) => m.prefillCpuMs)) };
console.log(`\nmodel ${modelPath}; n=${args.n}, ${args.maxTokens} tokens each (ignore_eos), temperature 0.8; ${args.rounds} rounds; tokens identical both ways`);
console.log(`wall time           one request, n=${args.n}: ${fmt(wall.one)}   ${args.n} requests: ${fmt(wall.separate)}`);
console.log(`prefill worker CPU  one request: ${fmt(cpu.one)}   ${args.n} requests: ${fmt(cpu.separate)}`);
console.log(`prefills per round  one request: ${one.map((m) => m.prefills).join(", ")}   ${args.n} requests: ${separate.map((m) => m.prefills).join(", ")}`);
const total = { one: s(one.map((m) => m.totalCpuMs)), separate: s(separate.map((m) => m.totalCpuMs)) };
console.log(`CPU of every part   one request: ${fmt(total.one)}   ${args.n} requests: ${fmt(total.separate)}`);
finalLine({
  bench: "n-choices",
  n: args.n,
  median_ms: wall.one.median,
  ref_median_ms: wall.separate.median,
  ratio: wall.one.median / wall.separate.median,
  prefill_cpu_ms: cpu.one.median,
  ref_prefill_cpu_ms: cpu.separate.median,
  cpu_ms: total.one.median,
  ref_cpu_ms: total.separate.median,
  prefills: one.map((m) => m.prefills),
  ref_prefills: separate.map((m) => m.prefills),
});
