// Overload control as a client sees it: `airm up`'s defaults with the gateway's waiting bound set
// to --queue, then a closed loop of chat requests at 1x that bound (the reference, measured in the
// same run) and at --factor x it (default 4). Counts answers by status (200, 429 with and without
// Retry-After, 5xx), goodput, and each part's resident memory through the overloaded phase: its
// growth is measured from a quarter into the phase (the decode workers first grow into their
// wider batch buckets) to its end. A client that gets 429 waits --backoff-ms (not the 1 s Retry-After: the
// point is to keep the pressure on) and asks again.
//
//   pnpm bench overload [--queue 8] [--factor 4] [--seconds 60] [--max-tokens 32]

import { flagOf, int, text } from "../packages/rm-core/src/index.ts";
import { benchArgs, finalLine, summarize } from "./lib.ts";
import { sample, span, upDefaults, type Sample } from "./soak/sample.ts";

const args = benchArgs("overload", "closed-loop chat at 1x and Nx the gateway's waiting bound: 429s with Retry-After, no 5xx, flat memory", {
  queue: flagOf(int({ min: 1 }), { default: 8, doc: "the gateway's AIRM_MAX_WAITING for the run" }),
  factor: flagOf(int({ min: 2 }), { default: 4, doc: "clients of the overloaded phase, as a multiple of --queue" }),
  seconds: flagOf(int({ min: 5 }), { default: 60, doc: "length of each phase" }),
  maxTokens: flagOf(int({ min: 1 }), { default: 32, doc: "max_tokens of each request" }),
  backoffMs: flagOf(int({ min: 0 }), { default: 50, doc: "wait after a 429 before the next request" }),
  model: flagOf(text({ label: "path" }), { defaultText: "airm up's default", doc: "model to serve" }),
});

interface Phase {
  clients: number;
  ok: number;
  r429: number;
  r429WithoutRetryAfter: number;
  r5xx: number;
  other: number;
  okLatencyMs: number[];
  seconds: number;
}

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
const prompts = ["What is the capital of France?", "Name three primary colours.", "Write a haiku about rain.", "What is 12 times 12?", "Say hello in Spanish."];

async function phase(url: string, modelId: string, clients: number, seconds: number): Promise<Phase> {
  const p: Phase = { clients, ok: 0, r429: 0, r429WithoutRetryAfter: 0, r5xx: 0, other: 0, okLatencyMs: [], seconds };
  const end = performance.now() + seconds * 1000;
  const client = async (c: number) => {
    for (let i = 0; performance.now() < end; i++) {
      const t0 = performance.now();
      const r = await fetch(`${url}/v1/chat/completions`, {
        method: "POST",
        headers: { "content-type": "application/json" },
        body: JSON.stringify({ model: modelId, messages: [{ role: "user", content: prompts[(c + i) % prompts.length] }], max_tokens: args.maxTokens, temperature: 0 }),
      }).catch(() => null);
      const status = r?.status ?? 599;
      await r?.arrayBuffer().catch(() => {});
      if (status === 200) {
        p.ok++;
        p.okLatencyMs.push(performance.now() - t0);
      } else if (status === 429) {
        p.r429++;
        if (!r?.headers.get("retry-after")) p.r429WithoutRetryAfter++;
        await sleep(args.backoffMs);
      } else if (status >= 500) p.r5xx++;
      else p.other++;
    }
  };
  await Promise.all(Array.from({ length: clients }, (_, c) => client(c)));
  return p;
}

const { cluster, modelNote } = await upDefaults(args.model ? ["--model", args.model] : [], { AIRM_MAX_WAITING: String(args.queue) });
try {
  const modelId = ((await (await fetch(`${cluster.url}/v1/models`)).json()) as { data: { id: string }[] }).data[0].id;
  console.log(`overload: ${modelNote}; gateway AIRM_MAX_WAITING=${args.queue}; ${args.seconds} s per phase`);
  await phase(cluster.url, modelId, args.queue, 5); // warm-up
  const t0 = performance.now();
  const ref = await phase(cluster.url, modelId, args.queue, args.seconds);
  const before = await sample(cluster, t0);
  const samples: Sample[] = [before];
  let sampling = true;
  const sampler = (async () => {
    while (sampling) {
      await sleep(2000);
      samples.push(await sample(cluster, t0));
    }
  })();
  const over = await phase(cluster.url, modelId, args.queue * args.factor, args.seconds);
  sampling = false;
  await sampler;
  samples.push(await sample(cluster, t0));
  const overStart = before.t;
  const warmAt = samples.findIndex((x) => x.t >= overStart + args.seconds / 4);
  const rss = Object.fromEntries(
    Object.keys(before.parts).map((name) => {
      const series = samples.map((x) => x.parts[name]?.rssKb ?? 0);
      const s = span(series);
      const warm = series[warmAt] ?? s.start;
      return [name, { ...s, warm, growthPct: Number((((s.end - warm) / warm) * 100).toFixed(1)) }];
    }),
  );
  const show = (name: string, x: Phase) => {
    const lat = summarize(x.okLatencyMs);
    console.log(
      `${name}: ${x.clients} clients, ${x.ok} ok (${(x.ok / x.seconds).toFixed(2)}/s, p50 ${lat.median.toFixed(0)} ms), ${x.r429} x 429 (${x.r429WithoutRetryAfter} without Retry-After), ${x.r5xx} x 5xx, ${x.other} other`,
    );
  };
  show("reference (1x bound)", ref);
  show(`overloaded (${args.factor}x bound)`, over);
  for (const [name, r] of Object.entries(rss)) {
    console.log(`  ${name.padEnd(9)} RSS ${r.start} kB at the start, ${r.warm} a quarter in, ${r.end} at the end (max ${r.max}): ${r.growthPct}% after warm-up`);
  }
  finalLine({
    bench: "overload",
    queue: args.queue,
    factor: args.factor,
    seconds: args.seconds,
    ref_clients: ref.clients,
    ref_ok_per_s: ref.ok / ref.seconds,
    ref_p50_ms: summarize(ref.okLatencyMs).median,
    ref_429: ref.r429,
    ref_5xx: ref.r5xx,
    over_clients: over.clients,
    over_ok_per_s: over.ok / over.seconds,
    over_p50_ms: summarize(over.okLatencyMs).median,
    over_429: over.r429,
    over_429_without_retry_after: over.r429WithoutRetryAfter,
    over_5xx: over.r5xx,
    over_other: over.other,
    goodput_ratio: over.ok / over.seconds / (ref.ok / ref.seconds),
    rss_growth_pct: Object.fromEntries(Object.entries(rss).map(([k, v]) => [k, v.growthPct])),
    gateway_rss_kb: rss.gateway,
  });
} finally {
  await cluster.stop();
}
