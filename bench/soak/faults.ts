// The fault soak (`pnpm bench soak --faults`): `airm up`'s defaults with KV over tcp (so the KV
// relay runs), --clients closed-loop streaming clients, and every --fault-every-s one part killed
// with SIGKILL, in turn: a decode worker, the prefill worker, the relay. The launcher starts each
// again (airm up's restart policy) and the gateway moves broken streams to another worker.
//
// The reference is measured in the same run, before the first fault: every distinct request once,
// undisturbed. The requests are greedy or seeded, so each answer under faults must be whole and
// token-identical to its reference (token ids, with return_tokens_as_token_ids). Sampled all along:
// each part's RSS (a killed part's is its new process's), open leases over the workers, blobs held
// by the relay. At the end, once the traffic stopped: leases and blobs left (0 expected), and each
// part's RSS growth from a tenth of the way in (after warm-up) to the end.

import { performance } from "node:perf_hooks";
import { sseEvents, type RunningCluster } from "../../packages/workload-runner/src/index.ts";
import { freePort } from "../../packages/workload-runner/src/cluster-plan.ts";
import { finalLine } from "../lib.ts";
import { sample, span, upDefaults, type Sample } from "./sample.ts";

export interface FaultSoakOptions {
  minutes: number;
  clients: number;
  sampleS: number;
  faultEveryS: number;
  model?: string;
}

/** Distinct requests: prompts × (greedy, seeded at 0.8). */
const PROMPTS = [
  "The history of the lighthouse begins",
  "A recipe for bread needs",
  "The three laws of motion say",
  "In the middle of the forest there was",
  "The best way to learn a language is",
  "Rivers reach the sea because",
  "A good night's sleep depends on",
  "The first computers were",
];
const MAX_TOKENS = 48;

interface Answer {
  ids: string[];
  error: string | null;
}

const bodyOf = (model: string, i: number) => {
  const prompt = PROMPTS[i % PROMPTS.length]!;
  const seeded = Math.floor(i / PROMPTS.length) % 2 === 1;
  return {
    model,
    prompt,
    max_tokens: MAX_TOKENS,
    stream: true,
    logprobs: 0,
    return_tokens_as_token_ids: true,
    ...(seeded ? { temperature: 0.8, seed: 100 + i } : { temperature: 0 }),
  };
};
const DISTINCT = PROMPTS.length * 2;

/** One streamed completion: its token ids, or what went wrong (status, error event, no [DONE]). */
async function ask(url: string, body: unknown): Promise<Answer> {
  try {
    const r = await fetch(`${url}/v1/completions`, { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify(body) });
    if (r.status !== 200) return { ids: [], error: `${r.status} ${(await r.text()).slice(0, 200)}` };
    const ids: string[] = [];
    let done = false;
    for await (const ev of sseEvents<any>(r.body!, { onDone: () => (done = true) })) {
      if (ev.error) return { ids, error: `stream error ${ev.error.code}: ${String(ev.error.message).slice(0, 160)}` };
      for (const c of ev.choices ?? []) ids.push(...(c.logprobs?.tokens ?? []));
    }
    return { ids, error: done ? null : "the stream ended without [DONE]" };
  } catch (e) {
    return { ids: [], error: `connection: ${(e as Error).message}` };
  }
}

/** The part to kill at fault number `n`: decode, prefill, relay in turn (by the launcher's part names). */
function victim(c: RunningCluster, n: number): RunningCluster["parts"][number] {
  const kinds = [/^decode/, /^prefill/, /relay/];
  const found = c.parts.filter((p) => kinds[n % 3]!.test(p.name) && p.alive);
  if (!found.length) throw new Error(`soak --faults: no live part matches ${kinds[n % 3]} (parts: ${c.parts.map((p) => p.name).join(", ")})`);
  return found[Math.floor(n / 3) % found.length]!;
}

async function relayBlobs(metricsUrl: string): Promise<number> {
  try {
    const m = await (await fetch(metricsUrl, { signal: AbortSignal.timeout(5000) })).text();
    return Number(/^airm_kv_relay_blobs(?:\{[^}]*\})? (\d+)$/m.exec(m)?.[1] ?? 0);
  } catch {
    return Number.NaN; // restarting
  }
}

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

export async function faultSoak(o: FaultSoakOptions): Promise<void> {
  const relayMetricsPort = await freePort();
  const relayMetrics = `http://127.0.0.1:${relayMetricsPort}/metrics`;
  const { cluster, modelNote } = await upDefaults([...(o.model ? ["--model", o.model] : []), "--kv-transport", "tcp"], {}, (c) => ({
    ...c,
    onPartExit: "restart",
    sidecarEnv: { ...c.sidecarEnv, AIRM_METRICS_PORT: String(relayMetricsPort) },
  }));
  try {
    const model = ((await (await fetch(`${cluster.url}/v1/models`)).json()) as { data: { id: string }[] }).data[0]!.id;
    console.log(`soak --faults: ${modelNote}; KV over tcp; parts ${cluster.parts.map((p) => p.name).join(", ")}`);
    console.log(`  ${o.clients} clients for ${o.minutes} min, a part killed every ${o.faultEveryS} s (decode, prefill, relay in turn)`);

    // The reference: each distinct request once, undisturbed, in the same run.
    const reference = await Promise.all(Array.from({ length: DISTINCT }, (_, i) => ask(cluster.url, bodyOf(model, i))));
    const refFailed = reference.find((a) => a.error);
    if (refFailed) throw new Error(`soak --faults: the undisturbed reference run failed: ${refFailed.error}`);

    const t0 = performance.now();
    const endAt = t0 + o.minutes * 60_000;
    const samples: (Sample & { relayBlobs: number })[] = [];
    const faults: { t: number; part: string }[] = [];
    const tally = { requests: 0, whole: 0, mismatched: 0, failed: 0, examples: [] as string[] };
    let running = true;
    const sampler = (async () => {
      while (running) {
        samples.push({ ...(await sample(cluster, t0)), relayBlobs: await relayBlobs(relayMetrics) });
        await sleep(o.sampleS * 1000);
      }
    })();
    const injector = (async () => {
      for (let n = 0; running; n++) {
        await sleep(o.faultEveryS * 1000);
        if (!running || performance.now() > endAt - 10_000) break;
        const p = victim(cluster, n);
        faults.push({ t: Math.round((performance.now() - t0) / 1000), part: p.name });
        console.log(`  t=${faults.at(-1)!.t}s: SIGKILL ${p.name}`);
        p.child.kill("SIGKILL");
      }
    })();
    await Promise.all(
      Array.from({ length: o.clients }, async (_, c) => {
        for (let i = c; performance.now() < endAt; i++) {
          const k = i % DISTINCT;
          const a = await ask(cluster.url, bodyOf(model, k));
          tally.requests++;
          const note = (what: string) => tally.examples.length < 8 && tally.examples.push(`t=${Math.round((performance.now() - t0) / 1000)}s: ${what}`);
          if (a.error) {
            tally.failed++;
            note(a.error);
          } else if (a.ids.join(",") !== reference[k]!.ids.join(",")) {
            tally.mismatched++;
            note(`request ${k}: ${a.ids.length} tokens, not the reference's ${reference[k]!.ids.length}`);
          } else tally.whole++;
        }
      }),
    );
    running = false;
    await Promise.all([sampler, injector]);

    // Quiescence: what the killed parts held is released or swept.
    let last = { ...(await sample(cluster, t0)), relayBlobs: await relayBlobs(relayMetrics) };
    for (let i = 0; i < 100 && (last.leases > 0 || last.relayBlobs !== 0); i++) {
      await sleep(200);
      last = { ...(await sample(cluster, t0)), relayBlobs: await relayBlobs(relayMetrics) };
    }
    samples.push(last);
    report(o, tally, faults, samples, last);
  } finally {
    await cluster.stop();
  }
}

function report(
  o: FaultSoakOptions,
  tally: { requests: number; whole: number; mismatched: number; failed: number; examples: string[] },
  faults: { t: number; part: string }[],
  samples: (Sample & { relayBlobs: number })[],
  last: Sample & { relayBlobs: number },
): void {
  const names = [...new Set(samples.flatMap((s) => Object.keys(s.parts)))];
  // Warm: the first sample a tenth of the way in (the gateway's heap and the JIT settle first).
  const warmAt = Math.max(
    0,
    samples.findIndex((s) => s.t >= (o.minutes * 60) / 10),
  );
  const parts = Object.fromEntries(
    names.map((name) => {
      const series = samples.map((s) => s.parts[name]?.rssKb ?? 0);
      const rss = series.filter((x) => x > 0);
      const warm = series[warmAt] || rss[0] || 0;
      const growth = warm ? Number((((rss.at(-1)! - warm) / warm) * 100).toFixed(2)) : 0;
      return [name, { rss_kb: { ...span(rss), warm }, rss_growth_after_warmup_pct: growth, killed: faults.filter((f) => f.part === name).length }];
    }),
  );
  console.log(`  ${tally.requests} requests: ${tally.whole} whole and identical to the reference, ${tally.mismatched} different, ${tally.failed} failed`);
  for (const e of tally.examples) console.log(`    ${e}`);
  console.log(`  faults: ${faults.length} (${faults.map((f) => `${f.part}@${f.t}s`).join(", ")})`);
  for (const [name, p] of Object.entries(parts))
    console.log(
      `  ${name.padEnd(9)} RSS ${p.rss_kb.start} -> warm ${p.rss_kb.warm} -> end ${p.rss_kb.end} kB (max ${p.rss_kb.max}; ${p.rss_growth_after_warmup_pct}% after warm-up); killed ${p.killed}x`,
    );
  const validBlobs = samples.map((s) => s.relayBlobs).filter((x) => Number.isFinite(x));
  console.log(`  leases max ${Math.max(...samples.map((s) => s.leases))}, end ${last.leases}; relay blobs max ${Math.max(0, ...validBlobs)}, end ${last.relayBlobs}`);
  finalLine({
    bench: "soak",
    faults_mode: true,
    minutes: o.minutes,
    clients: o.clients,
    fault_every_s: o.faultEveryS,
    requests: tally.requests,
    whole: tally.whole,
    mismatched: tally.mismatched,
    failed: tally.failed,
    faults: faults.length,
    faults_by_part: Object.fromEntries(Object.entries(parts).map(([n, p]) => [n, p.killed])),
    parts,
    leases: { max: Math.max(...samples.map((s) => s.leases)), end: last.leases },
    relay_blobs: { max: Math.max(0, ...validBlobs), end: last.relayBlobs },
  });
}
