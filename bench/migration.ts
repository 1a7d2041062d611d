import { flagOf, int, list } from "../packages/rm-core/src/index.ts";
import { startUpCluster } from "../packages/workload-runner/src/index.ts";
import { benchArgs, finalLine, fmt, progress, progressDone, sseEvents, summarize } from "./lib.ts";
import { benchModel } from "./serve-load/model.ts";

const args = benchArgs("migration", "the extra latency of one migration (a decode worker killed mid-stream) at several token counts, through airm up's defaults", {
  at: flagOf(list(int({ min: 1, max: 2000 })), { default: [64, 128, 256], doc: "tokens a stream has sent when its decode worker is killed" }),
  rounds: flagOf(int({ min: 1 }), { default: 3, doc: "rounds per point" }),
  after: flagOf(int({ min: 2, max: 256 }), { default: 16, doc: "tokens after the break" }),
});

const PROMPT = "Write a long story about a lighthouse keeper who finds a message in a bottle.";

const modelPath = benchModel();
const maxAt = Math.max(...args.at);
const { cluster } = await startUpCluster(["--model", modelPath, "--quiet", "--max-model-len", String(Math.max(512, 2 ** Math.ceil(Math.log2(maxAt + args.after + 64))))], {
  env: process.env,
  adjust: (c) => ({ ...c, onPartExit: "restart" }),
});
const decodes = cluster.parts.filter((p) => p.name.startsWith("decode")).map((p) => p.name);
if (decodes.length < 2) throw new Error(`the bench needs two decode workers, airm up started ${decodes.length}`);

interface Run {
  ids: string[];
  arrivals: number[];
}

/** Streams one greedy completion of `tokens` tokens; `onToken(n)` runs as token n arrives. */
async function stream(model: string, tokens: number, onToken: (n: number) => void): Promise<Run> {
  const r = await fetch(`${cluster.url}/v1/completions`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify({ model, prompt: PROMPT, max_tokens: tokens, temperature: 0, ignore_eos: true, stream: true, logprobs: 0, return_tokens_as_token_ids: true }),
  });
  if (r.status !== 200) throw new Error(`${r.status}: ${await r.text()}`);
  const out: Run = { ids: [], arrivals: [] };
  for await (const chunk of sseEvents(r.body!)) {
    if (chunk.error) throw new Error(`stream error: ${JSON.stringify(chunk.error)}`);
    for (const c of chunk.choices ?? [])
      for (const t of c.logprobs?.tokens ?? []) {
        out.ids.push(t);
        out.arrivals.push(performance.now());
        onToken(out.ids.length);
      }
  }
  return out;
}

async function healthy(url: string): Promise<boolean> {
  try {
    return (await fetch(`${url}/health`)).status === 200;
  } catch {
    return false;
  }
}

async function migrationSeconds(): Promise<{ sum: number; count: number }> {
  const text = await (await fetch(`${cluster.url}/metrics`)).text();
  const v = (name: string) => Number(new RegExp(`^${name} (\\S+)$`, "m").exec(text)?.[1] ?? 0);
  return { sum: v("airm_migration_seconds_sum"), count: v("airm_migration_seconds_count") };
}

const results: { at: number; extraMs: number[]; gapMs: number[]; tpotMs: number[]; gatewayMs: number[] }[] = [];
try {
  const model = ((await (await fetch(`${cluster.url}/v1/models`)).json()) as { data: { id: string }[] }).data[0].id;
  await stream(model, 8, () => {}); // warm-up
  for (const at of args.at) {
    const row = { at, extraMs: [] as number[], gapMs: [] as number[], tpotMs: [] as number[], gatewayMs: [] as number[] };
    for (let r = 0; r < args.rounds; r++) {
      progress(`${at} tokens, round ${r + 1}/${args.rounds}`);
      // Both decode workers serving before each round (the one killed last round was restarted).
      for (const name of decodes) {
        const end = performance.now() + 120_000;
        while (!(await healthy(cluster.part(name).spec.url))) {
          if (performance.now() > end) throw new Error(`${name} not healthy again within 120 s`);
          await new Promise((res) => setTimeout(res, 100));
        }
      }
      await new Promise((res) => setTimeout(res, 1500)); // the gateway's probe sees them too
      const calm = await stream(model, at + args.after, () => {});
      const gaps = calm.arrivals.slice(1).map((t, i) => t - calm.arrivals[i]);
      const tpot = summarize(gaps).median;
      const before = await migrationSeconds();
      let killed: Promise<void> | null = null;
      const hit = await stream(model, at + args.after, (n) => {
        if (n !== at) return;
        killed = (async () => {
          for (const name of decodes) {
            const part = cluster.part(name);
            const h = (await (await fetch(`${part.spec.url}/health`)).json()) as { requests: { running: number } };
            if (h.requests.running > 0) part.child.kill("SIGKILL");
          }
        })();
      });
      await killed;
      if (hit.ids.join(",") !== calm.ids.join(",")) throw new Error(`${at} tokens, round ${r + 1}: the migrated stream's tokens differ from the undisturbed run`);
      const after = await migrationSeconds();
      if (after.count - before.count !== 1) throw new Error(`${at} tokens, round ${r + 1}: the gateway counted ${after.count - before.count} migrations, not 1`);
      // The kill lands a few tokens after `at` (the tokens the worker wrote before it died still
      // arrive): the break is the longest gap from there on.
      const gap = Math.max(...hit.arrivals.slice(at).map((t, i) => t - hit.arrivals[at - 1 + i]));
      row.gapMs.push(gap);
      row.tpotMs.push(tpot);
      row.extraMs.push(gap - tpot);
      row.gatewayMs.push((after.sum - before.sum) * 1000);
    }
    results.push(row);
  }
  progressDone();
} finally {
  await cluster.stop();
}

console.log(`\nmodel ${modelPath}; greedy, ${args.after} tokens after the break; ${args.rounds} rounds per point; tokens identical to the undisturbed run every time`);
for (const r of results) {
  console.log(
    `at ${String(r.at).padStart(4)} tokens  extra latency ${fmt(summarize(r.extraMs))}  longest gap after the kill ${fmt(summarize(r.gapMs))}  undisturbed gap ${fmt(summarize(r.tpotMs))}  gateway's airm_migration_seconds ${fmt(summarize(r.gatewayMs))}`,
  );
}
const first = results[0];
finalLine({
  bench: "migration",
  at: results.map((r) => r.at),
  extra_ms: results.map((r) => summarize(r.extraMs).median),
  gateway_ms: results.map((r) => summarize(r.gatewayMs).median),
  ref_tpot_ms: results.map((r) => summarize(r.tpotMs).median),
  median_ms: summarize(first.gapMs).median,
  ref_median_ms: summarize(first.tpotMs).median,
  ratio: summarize(first.gapMs).median / summarize(first.tpotMs).median,
});
