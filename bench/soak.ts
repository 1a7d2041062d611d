// Soak: `airm up`'s defaults under mixed traffic for --minutes, loopback only. --clients loops each
// pick, in turn from a fixed mix: streaming chat, JSON completions, a stream cancelled after its
// first chunk, a request with a short deadline, and (at a low rate) bad input that must get a 4xx.
// Every --sample-s seconds each part's RSS and open fds, the KV blob links under the shm folder
// and the open leases are sampled. The reference is the run itself: RSS a tenth of the way in
// (after warm-up) against the end, and requests per second in the first and the last tenth.
//
//   pnpm bench soak [--minutes 10] [--clients 4]
//
// With --faults it is the fault soak instead (soak/faults.ts): KV over tcp, 16 streaming clients,
// a decode worker, the prefill worker and the relay killed in turn every --fault-every-s, every
// answer checked against an undisturbed run of the same requests.
//
//   pnpm bench soak --faults [--minutes 30] [--clients 16] [--fault-every-s 120]

import { flagOf, int, switchOf, text } from "../packages/rm-core/src/index.ts";
import { benchArgs, finalLine, sseEvents } from "./lib.ts";
import { faultSoak } from "./soak/faults.ts";
import { sample, span, upDefaults, type Sample } from "./soak/sample.ts";

const args = benchArgs("soak", "airm up's defaults under mixed traffic (streams, cancels, deadlines, bad input) for N minutes: RSS, fds, blobs, leases", {
  minutes: flagOf(int({ min: 1 }), { defaultText: "10; 30 with --faults", doc: "how long the traffic runs" }),
  clients: flagOf(int({ min: 1 }), { defaultText: "4; 16 with --faults", doc: "concurrent closed-loop clients" }),
  sampleS: flagOf(int({ min: 1 }), { default: 10, doc: "seconds between samples" }),
  model: flagOf(text({ label: "path" }), { defaultText: "airm up's default", doc: "model to serve" }),
  faults: switchOf({
    doc: "the fault soak: KV over tcp, streaming clients, a decode worker, the prefill worker and the relay killed in turn; answers checked against an undisturbed run",
  }),
  faultEveryS: flagOf(int({ min: 5 }), { default: 120, doc: "with --faults: seconds between two kills" }),
});
if (args.faults) {
  await faultSoak({ minutes: args.minutes ?? 30, clients: args.clients ?? 16, sampleS: args.sampleS, faultEveryS: args.faultEveryS, model: args.model });
  process.exit(0);
}
const minutes = args.minutes ?? 10;
const clients = args.clients ?? 4;

type Kind = "stream" | "json" | "cancel" | "deadline" | "bad";
/** The mix each client walks through: bad input once in twenty requests. */
const MIX: Kind[] = [
  "stream",
  "json",
  "stream",
  "cancel",
  "json",
  "stream",
  "deadline",
  "json",
  "stream",
  "json",
  "stream",
  "json",
  "cancel",
  "stream",
  "json",
  "stream",
  "json",
  "stream",
  "json",
  "bad",
];
const BAD_BODIES = ["{not json", JSON.stringify({ messages: [] }), JSON.stringify({ messages: [{ role: "user", content: "hi" }], max_tokens: 10_000_000 })];
const prompts = ["What is the capital of France?", "Name three primary colours.", "Write a haiku about rain.", "What is 12 times 12?", "Tell me a fact about the Moon."];

interface Count {
  done: number;
  /** An answer other than the one the kind expects (the figure that must stay 0). */
  unexpected: number;
  examples: string[];
}

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

const { cluster, modelNote } = await upDefaults(args.model ? ["--model", args.model] : []);
const counts = Object.fromEntries(MIX.map((k) => [k, { done: 0, unexpected: 0, examples: [] } as Count])) as Record<Kind, Count>;
const finishedAt: number[] = [];

/** One request of `kind`; throws with a short reason when the answer is not the expected one. */
async function one(kind: Kind, url: string, modelId: string, n: number): Promise<void> {
  const chat = (extra: Record<string, unknown>) =>
    fetch(`${url}/v1/chat/completions`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({ model: modelId, messages: [{ role: "user", content: prompts[n % prompts.length] }], max_tokens: 32, temperature: 0, ...extra }),
    });
  if (kind === "bad") {
    const r = await fetch(`${url}/v1/chat/completions`, { method: "POST", headers: { "content-type": "application/json" }, body: BAD_BODIES[n % BAD_BODIES.length] });
    await r.arrayBuffer();
    if (r.status < 400 || r.status >= 500) throw new Error(`bad input answered ${r.status}`);
    return;
  }
  if (kind === "json") {
    const r = await chat({});
    const b = (await r.json()) as { choices?: unknown[] };
    if (r.status !== 200 || !b.choices?.length) throw new Error(`json answered ${r.status}`);
    return;
  }
  if (kind === "deadline") {
    // a deadline shorter than the answer takes: 504 request_timeout (or 200 if it was quick)
    const r = await chat({ max_tokens: 128, timeout: 0.3 });
    const b = (await r.json()) as { error?: { code: string } };
    if (r.status !== 200 && !(r.status === 504 && b.error?.code === "request_timeout")) throw new Error(`deadline answered ${r.status} ${b.error?.code}`);
    return;
  }
  const ac = new AbortController();
  const r = await chat({ stream: true });
  if (r.status !== 200) throw new Error(`${kind} answered ${r.status}`);
  let chunks = 0;
  for await (const ev of sseEvents(r.body!)) {
    if (ev.error) throw new Error(`${kind} stream error ${ev.error.code}`);
    chunks++;
    if (kind === "cancel" && chunks === 2) {
      ac.abort();
      await r.body!.cancel().catch(() => {});
      return;
    }
  }
  if (chunks === 0) throw new Error(`${kind} stream had no chunk`);
}

const modelId = ((await (await fetch(`${cluster.url}/v1/models`)).json()) as { data: { id: string }[] }).data[0].id;
console.log(`soak: ${modelNote}; ${clients} clients for ${minutes} min; sample every ${args.sampleS} s`);
const t0 = performance.now();
const endAt = t0 + minutes * 60_000;
const samples: Sample[] = [await sample(cluster, t0)];
let running = true;
const sampler = (async () => {
  while (running) {
    await sleep(args.sampleS * 1000);
    if (running) samples.push(await sample(cluster, t0));
  }
})();
await Promise.all(
  Array.from({ length: clients }, async (_, c) => {
    for (let i = c; performance.now() < endAt; i++) {
      const kind = MIX[i % MIX.length];
      try {
        await one(kind, cluster.url, modelId, i);
      } catch (e) {
        counts[kind].unexpected++;
        if (counts[kind].examples.length < 3) counts[kind].examples.push((e as Error).message);
      }
      counts[kind].done++;
      finishedAt.push((performance.now() - t0) / 1000);
    }
  }),
);
running = false;
await sampler;
// quiescence: cancelled and timed-out requests have been released
let last = await sample(cluster, t0);
for (let i = 0; i < 50 && (last.blobs > 0 || last.leases > 0); i++) {
  await sleep(200);
  last = await sample(cluster, t0);
}
samples.push(last);
await cluster.stop();

const total = minutes * 60;
const warmAt = samples.findIndex((s) => s.t >= total / 10);
const parts = Object.fromEntries(
  Object.keys(samples[0].parts).map((name) => {
    const rss = samples.map((s) => s.parts[name]?.rssKb ?? 0);
    const fds = samples.map((s) => s.parts[name]?.fds ?? 0);
    const warm = rss[warmAt] ?? rss[0];
    return [name, { rss_kb: { ...span(rss), warm }, rss_growth_after_warmup_pct: Number((((rss.at(-1)! - warm) / warm) * 100).toFixed(2)), fds: span(fds) }];
  }),
);
const rate = (from: number, to: number) => finishedAt.filter((t) => t >= from && t < to).length / (to - from);
const firstTenth = rate(0, total / 10);
const lastTenth = rate((total * 9) / 10, total);
for (const [k, c] of Object.entries(counts))
  console.log(`  ${k.padEnd(8)} ${c.done} requests, ${c.unexpected} unexpected${c.examples.length ? ` (${c.examples.join("; ")})` : ""}`);
for (const [name, p] of Object.entries(parts)) {
  console.log(
    `  ${name.padEnd(9)} RSS ${p.rss_kb.start} -> warm ${p.rss_kb.warm} -> end ${p.rss_kb.end} kB (max ${p.rss_kb.max}; ${p.rss_growth_after_warmup_pct}% after warm-up); fds ${p.fds.start} -> ${p.fds.end} (max ${p.fds.max})`,
  );
}
console.log(`  blobs max ${Math.max(...samples.map((s) => s.blobs))}, end ${last.blobs}; leases max ${Math.max(...samples.map((s) => s.leases))}, end ${last.leases}`);
console.log(`  requests/s: first tenth ${firstTenth.toFixed(2)}, last tenth ${lastTenth.toFixed(2)}`);
finalLine({
  bench: "soak",
  minutes: minutes,
  clients: clients,
  requests: Object.fromEntries(Object.entries(counts).map(([k, c]) => [k, c.done])),
  unexpected: Object.values(counts).reduce((a, c) => a + c.unexpected, 0),
  parts,
  blobs: { max: Math.max(...samples.map((s) => s.blobs)), end: last.blobs },
  leases: { max: Math.max(...samples.map((s) => s.leases)), end: last.leases },
  req_per_s_first_tenth: firstTenth,
  req_per_s_last_tenth: lastTenth,
  last_over_first: lastTenth / firstTenth,
});
