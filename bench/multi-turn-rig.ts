// pnpm bench multi-turn-rig [--model NAME|FILE] [--conversations 8] [--turns 3] [--max-tokens 24] [--routing load,prefix]
// `pnpm bench multi-turn`'s conversations on the Kubernetes rig: the chart (two PD pods, each a
// prefill worker, a decode worker and a gateway; the workers' KV events on, kvEvents.enabled)
// behind Envoy 1.40.0 and our endpoint picker (epp.enabled), once per picker routing
// (epp.routing, changed by `helm upgrade`): prefix (the share of a prompt's blocks each pod's
// decode worker holds, from its KV events) against load (queue, KV usage, running). Per routing:
// the share of prompt tokens served from a cache against the workload's ideal, TTFT p50/p90,
// output tok/s, KV bytes that crossed per request, and how the requests split over the pods. Each
// run has its own cache_salt, so no run meets another's cached blocks. The rig binds every
// interface it needs on its own, so the bench re-runs itself inside a network namespace (unshare
// -rn) after building what it needs (helm, the rig, Envoy: cached).
import { execFileSync } from "node:child_process";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { flagOf, list, oneOf } from "../packages/rm-core/src/index.ts";
import { chooseDefaultModel, resolveModelArg } from "../packages/workload-runner/src/default-model.ts";
import { applyGieCrds, envoyToPicker, llmdBinaries, type Proc } from "../scripts/k8s-rig/llm-d.ts";
import { PodRunner } from "../scripts/k8s-rig/pod-runner.ts";
import { gatewayServed, metricSum, type PodAt, Release } from "../scripts/k8s-rig/release.ts";
import { NPU_BOTH_NODE, rerunInNetns, rigBinaries, startRig } from "../scripts/k8s-rig/rig.ts";
import { benchArgs, finalLine, progress, progressDone } from "./lib.ts";
import { idealShare, kvCounters, type RunResult, row, runConversations, WORKLOAD_FLAGS } from "./multi-turn/conversations.ts";

const INSIDE = "--inside-netns";
const inside = process.argv[2] === INSIDE;
const argv = process.argv.slice(inside ? 3 : 2);
const ROUTINGS = ["prefix", "load", "approx-prefix", "random"] as const;
const args = benchArgs(
  "multi-turn-rig",
  "interleaved multi-turn chat through Envoy and airm-epp on the Kubernetes rig (two PD pods) per picker routing: prefix reuse against the ideal, TTFT, tok/s, KV bytes moved",
  {
    ...WORKLOAD_FLAGS,
    routing: flagOf(list(oneOf(ROUTINGS), /,/), { default: ["load", "prefix"], doc: "picker routings to run, in this order (epp.routing)" }),
  },
  argv,
);

const repo = fileURLToPath(new URL("..", import.meta.url));

if (!inside) {
  // Build and fetch while the network is there, then run in a namespace with only lo.
  execFileSync("bash", [join(repo, "scripts", "tools", "helm.sh")], { stdio: ["ignore", "ignore", "inherit"] });
  rigBinaries();
  llmdBinaries();
  const model = (args.model ? await resolveModelArg(args.model, process.env) : await chooseDefaultModel(process.env)).path;
  const rest = [...argv];
  const at = rest.indexOf("--model");
  if (at >= 0) rest.splice(at, 2);
  rerunInNetns(fileURLToPath(import.meta.url), [INSIDE, "--model", model, ...rest]);
}

const NS = "bench";
const POOL = "bench-pool";
const EPP_METRICS = 9090;
const DECODE_PORT = 8102;
const helm = execFileSync("bash", [join(repo, "scripts", "tools", "helm.sh")], { encoding: "utf8" }).trim();
const llmd = llmdBinaries();
const chart = join(repo, "charts", "rngd-pd");
console.log(`model: ${args.model}; ${args.conversations} conversations x ${args.turns} turns, ${args.maxTokens} new tokens, interleaved; two PD pods`);
progress("starting the Kubernetes rig");
const rig = await startRig([NPU_BOTH_NODE]);
const runner = new PodRunner(rig, repo, NS);
const fronted: { envoy: Proc | null } = { envoy: null };

/** Envoy (re)started in front of the picker pod, once a request passes; its URL and the picker's metrics URL. */
async function front(release: Release): Promise<{ url: string; metrics: string }> {
  await fronted.envoy?.stop();
  const { envoy, front, epp } = await envoyToPicker(release, llmd, { port: 18280, adminPort: 18990, ready: async (url) => (await fetch(`${url}/v1/models`)).status === 200 });
  fronted.envoy = envoy;
  return { url: front, metrics: `http://${epp.ip}:${EPP_METRICS}/metrics` };
}

interface RigRun extends RunResult {
  routing: string;
  perPod: number[];
  eppLookups: number;
  eppTokenizeFailures: number;
  eppIndexBlocks: number;
}

async function measure(release: Release, pods: PodAt[], routing: string, model: string): Promise<RigRun> {
  const f = await front(release);
  if (routing === "prefix") {
    // The picker follows the pods' events: its index holds the warm-up's blocks before the run.
    await release.until("the picker's index following the pods' KV events", async () => metricSum(await (await fetch(f.metrics)).text(), "airm_epp_index_blocks") > 0, 60_000);
  }
  const decodes = pods.map((p) => `http://${p.ip}:${DECODE_PORT}`);
  const served0 = await Promise.all(pods.map((p) => gatewayServed(p.ip)));
  const kv0 = await kvCounters(decodes);
  const e0 = await (await fetch(f.metrics)).text();
  progress(`routing ${routing}: ${args.conversations} conversations x ${args.turns} turns`);
  const r = await runConversations(f.url, model, `Envoy + airm-epp, ${routing}`, args, `multi-turn-rig-${routing}`);
  progressDone();
  const kv1 = await kvCounters(decodes);
  const served1 = await Promise.all(pods.map((p) => gatewayServed(p.ip)));
  const e1 = await (await fetch(f.metrics)).text();
  const pulls = kv1.pulls - kv0.pulls;
  r.kvBytesPerRequest = pulls > 0 ? (kv1.pulled - kv0.pulled) / pulls : null;
  r.kvHeldBytesPerRequest = pulls > 0 ? (kv1.skipped - kv0.skipped) / pulls : null;
  const delta = (name: string) => metricSum(e1, name) - metricSum(e0, name);
  return {
    ...r,
    routing,
    perPod: served1.map((n, i) => n - served0[i]!),
    eppLookups: delta("airm_epp_prefix_lookups_total"),
    eppTokenizeFailures: delta("airm_epp_tokenize_failures_total"),
    eppIndexBlocks: metricSum(e1, "airm_epp_index_blocks"),
  };
}

const results: RigRun[] = [];
let ideal: { all: number; fromTurn2: number } | null = null;
try {
  rig.kubectl(["create", "namespace", NS]);
  applyGieCrds(rig, llmd);
  runner.start();
  const release = new Release(rig, runner, helm, NS);
  progress("installing the chart: two PD pods with KV events, an InferencePool and our picker");
  await release.installPdPool(chart, {
    model: args.model,
    maxModelLen: null,
    pool: POOL,
    set: ["kvEvents.enabled=true", "epp.enabled=true", `epp.routing=${args.routing[0]}`, "inferencePool.endpointPickerRef.name=rngd-pd-epp"],
  });
  const pods = await release.serving("pd", 2, 8000);
  const model = ((await (await fetch(`http://${pods[0]!.ip}:8000/v1/models`)).json()) as { data: { id: string }[] }).data[0]!.id;
  // Warm each pod (first compiles, the workers' first blocks) with a request of its own tenant.
  for (const p of pods) await runConversations(`http://${p.ip}:8000`, model, "warm-up", { ...args, conversations: 1, turns: 1 }, `warm-up-${p.name}`);
  for (const [i, routing] of args.routing.entries()) {
    if (i > 0) {
      progress(`helm upgrade: epp.routing=${routing}`);
      await release.helmRun(["upgrade", "rngd-pd", chart, "--reuse-values", "--set", `epp.routing=${routing}`, "--wait", "--timeout", "180s"]);
    }
    const r = await measure(release, pods, routing, model);
    ideal ??= await idealShare(`http://${pods[0]!.ip}:8000`, model, r.turns, args);
    results.push(r);
    console.log(`${row(r, ideal)}  per pod ${r.perPod.join("/")}, picker lookups ${r.eppLookups}, tokenize failures ${r.eppTokenizeFailures}`);
  }
} finally {
  await fronted.envoy?.stop();
  await runner.stop();
  await rig.stop();
}

console.log("");
console.log("| system                   | cached share all / from turn 2 | TTFT p50 / p90 ms | out tok/s | KV crossed per request | errors |");
console.log("| ------------------------ | ------------------------------ | ----------------- | --------: | ---------------------- | -----: |");
for (const r of results) console.log(row(r, ideal));
finalLine({
  bench: "multi-turn-rig",
  model: args.model,
  pods: 2,
  conversations: args.conversations,
  turns: args.turns,
  ideal_hit_share: ideal?.all ?? null,
  ideal_hit_share_from_turn2: ideal?.fromTurn2 ?? null,
  ...Object.fromEntries(
    results.map((r) => [
      r.routing.replace(/\W+/g, "_"),
      {
        hit_share: r.hitShare,
        hit_share_from_turn2: r.hitShareFromTurn2,
        ttft_p50_ms: r.ttftP50,
        ttft_p90_ms: r.ttftP90,
        tok_s: r.tokS,
        kv_bytes_per_request: r.kvBytesPerRequest,
        kv_held_bytes_per_request: r.kvHeldBytesPerRequest,
        requests_per_pod: r.perPod,
        picker_prefix_lookups: r.eppLookups,
        picker_tokenize_failures: r.eppTokenizeFailures,
        errors: r.errors,
      },
    ]),
  ),
});
