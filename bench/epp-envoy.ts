// pnpm bench epp-envoy [--probes 20] [--rounds 2]
// Time to first token through Envoy 1.40.0 with our endpoint picker (airm-epp) against the stock
// Gateway API Inference Extension EPP v1.5.0 (its default plugins), under the same skewed load:
// the chart (two PD pods, 135M-shaped model with random weights) on the Kubernetes rig, one pod
// holding 4 long streamed requests, then `probes` short streamed completions one by one through
// Envoy. Per picker: TTFT p50/p90, the whole answer's p50 and the share that went to the idle pod. References in the same
// run: the same probes sent straight to the idle pod (perfect routing) and to the busy pod (the
// worst). The four paths are interleaved probe by probe (the held load is renewed as its requests
// end, so all meet the same load), over `rounds` rounds (the busy pod swaps each round).
// The stock EPP binds every interface, so the bench re-runs itself inside a network namespace of
// its own (unshare -rn) after building what it needs (helm, the rig, the EPP and Envoy: cached).
import { execFileSync } from "node:child_process";
import { rmSync } from "node:fs";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { makeTinyModel } from "../packages/llama/src/index.ts";
import { flagOf, int } from "../packages/rm-core/src/index.ts";
import { applyGieCrds, llmdBinaries, type Proc, startEnvoy, startOurEpp, startStockEpp } from "../scripts/k8s-rig/llm-d.ts";
import { PodRunner } from "../scripts/k8s-rig/pod-runner.ts";
import { gatewayServed, holdOpen, Release } from "../scripts/k8s-rig/release.ts";
import { NPU_BOTH_NODE, rerunInNetns, rigBinaries, startRig } from "../scripts/k8s-rig/rig.ts";
import { benchArgs, finalLine, progress, progressDone, sseEvents, summarize } from "./lib.ts";

// The run inside the namespace is marked by a first argument of its own.
const INSIDE = "--inside-netns";
const inside = process.argv[2] === INSIDE;
const argv = process.argv.slice(inside ? 3 : 2);
const args = benchArgs(
  "epp-envoy",
  "TTFT through Envoy with our picker vs the stock GIE EPP under a skewed two-replica load (Kubernetes rig)",
  {
    probes: flagOf(int({ min: 2, max: 200 }), { default: 20, doc: "short streamed requests per picker per round" }),
    rounds: flagOf(int({ min: 1, max: 10 }), { default: 2, doc: "rounds (the busy pod swaps each round)" }),
  },
  argv,
);

const repo = fileURLToPath(new URL("..", import.meta.url));
const here = fileURLToPath(import.meta.url);

if (!inside) {
  // Build while the network is there, then run in a namespace with only lo.
  execFileSync("bash", [join(repo, "scripts", "tools", "helm.sh")], { stdio: ["ignore", "ignore", "inherit"] });
  rigBinaries();
  llmdBinaries();
  rerunInNetns(here, [INSIDE, ...argv]);
}

const NS = "bench";
const POOL = "bench-pool";
const helm = execFileSync("bash", [join(repo, "scripts", "tools", "helm.sh")], { encoding: "utf8" }).trim();
const llmd = llmdBinaries();
const model = join(repo, "node_modules", ".cache", `airm-bench-135m-${process.pid}`);
progress("generating the 135M-shaped model");
makeTinyModel({ arch: "llama", out: model, preset: "135m" });
progress("starting the Kubernetes rig");
const rig = await startRig([NPU_BOTH_NODE]);
const procs: Proc[] = [];
const runner = new PodRunner(rig, repo, NS);

/** One streamed completion through `url`: the time to its first event and to its end (ms). */
async function probe(url: string, modelId: string, i: number): Promise<{ ttft: number; total: number }> {
  const t0 = performance.now();
  const r = await fetch(`${url}/v1/completions`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify({ model: modelId, prompt: `probe ${i}: which replica answers first?`, max_tokens: 8, temperature: 0, stream: true }),
  });
  if (r.status !== 200) throw new Error(`probe ${i} through ${url}: ${r.status} ${await r.text()}`);
  let ttft = Number.NaN;
  for await (const _ of sseEvents(r.body!)) if (Number.isNaN(ttft)) ttft = performance.now() - t0;
  return { ttft, total: performance.now() - t0 };
}

try {
  rig.kubectl(["create", "namespace", NS]);
  applyGieCrds(rig, llmd);
  runner.start();
  const release = new Release(rig, runner, helm, NS);
  progress("installing the chart: two PD pods and an InferencePool");
  await release.installPdPool(join(repo, "charts", "rngd-pd"), { model, maxModelLen: 512, pool: POOL });
  const pods = await release.serving("pd", 2, 8000);
  const modelId = ((await (await fetch(`http://${pods[0]!.ip}:8000/v1/models`)).json()) as { data: { id: string }[] }).data[0]!.id;

  progress("starting the stock EPP, our EPP and an Envoy in front of each");
  const stock = await startStockEpp(rig, llmd, POOL, NS);
  procs.push(stock);
  const ours = await startOurEpp(rig, repo, POOL, NS, { grpc: 9102, health: 9103, metrics: 9190 });
  procs.push(ours);
  const fronts: Record<string, string> = { stock: "http://127.0.0.1:18180", ours: "http://127.0.0.1:18181" };
  procs.push(await startEnvoy(rig.dir, llmd, { port: 18180, adminPort: 18990, extProc: { host: "127.0.0.1", port: 9002 } }));
  procs.push(await startEnvoy(rig.dir, llmd, { port: 18181, adminPort: 18991, extProc: { host: "127.0.0.1", port: 9102 } }));
  for (const url of Object.values(fronts)) await release.until(`a request through ${url}`, async () => (await fetch(`${url}/v1/models`).catch(() => null))?.status === 200, 60_000);

  const results: Record<string, { ttft: number[]; total: number[]; toIdle: number }> = {};
  for (let round = 0; round < args.rounds; round++) {
    const busy = pods[round % 2]!;
    const idle = pods[(round + 1) % 2]!;
    const letGo = await holdOpen(release, `http://${busy.ip}:8000`, modelId);
    try {
      await new Promise((r) => setTimeout(r, 500));
      const paths = [
        ["stock", fronts.stock!],
        ["ours", fronts.ours!],
        ["direct_idle", `http://${idle.ip}:8000`],
        ["direct_busy", `http://${busy.ip}:8000`],
      ] as const;
      // Interleaved, the order rotating per probe, so every path meets the same load.
      for (let i = 0; i < args.probes; i++) {
        progress(`round ${round + 1}/${args.rounds}: probe ${i + 1}/${args.probes}`);
        for (let k = 0; k < paths.length; k++) {
          const [name, url] = paths[(i + k) % paths.length]!;
          const before = await gatewayServed(idle.ip);
          const p = await probe(url, modelId, i);
          const r = (results[name] ??= { ttft: [], total: [], toIdle: 0 });
          r.ttft.push(p.ttft);
          r.total.push(p.total);
          if ((await gatewayServed(idle.ip)) > before) r.toIdle++;
        }
      }
    } finally {
      await letGo();
    }
  }
  progressDone();
  const line: Record<string, unknown> = { bench: "epp-envoy", probes_per_picker: args.probes * args.rounds };
  for (const [name, r] of Object.entries(results)) {
    const s = summarize(r.ttft);
    const p90 = [...r.ttft].sort((a, b) => a - b)[Math.ceil(0.9 * r.ttft.length) - 1]!;
    const total = summarize(r.total).median;
    console.log(
      `${name.padEnd(12)} TTFT p50 ${s.median.toFixed(1)} ms  p90 ${p90.toFixed(1)} ms  whole answer p50 ${total.toFixed(1)} ms  to the idle pod ${r.toIdle}/${r.ttft.length}`,
    );
    line[`${name}_ttft_p50_ms`] = Number(s.median.toFixed(1));
    line[`${name}_ttft_p90_ms`] = Number(p90.toFixed(1));
    line[`${name}_total_p50_ms`] = Number(total.toFixed(1));
    line[`${name}_to_idle`] = Number((r.toIdle / r.ttft.length).toFixed(3));
  }
  line.ours_over_stock_ttft_p50 = Number(((line.ours_ttft_p50_ms as number) / (line.stock_ttft_p50_ms as number)).toFixed(3));
  line.ours_over_direct_idle_ttft_p50 = Number(((line.ours_ttft_p50_ms as number) / (line.direct_idle_ttft_p50_ms as number)).toFixed(3));
  finalLine(line);
} finally {
  for (const p of procs.reverse()) await p.stop();
  await runner.stop();
  await rig.stop();
  rmSync(model, { recursive: true, force: true });
}
