// The llm-d data path on a real control plane (scripts/k8s-rig): Envoy 1.40.0 with the ext_proc
// filter and an ORIGINAL_DST cluster, an InferencePool selecting the chart's pods, and an endpoint
// picker: the stock Gateway API Inference Extension EPP v1.5.0 (its default plugins: queue, KV
// usage and prefix scorers over the vllm:* gauges it scrapes from the pool's target port), then
// the project's own (packages/epp). Checks: completions and streamed chat through Envoy reach our
// pods with the tokens a direct request gives; with one replica busy with held-open requests, a
// picker sends >= 9 of 10 new requests to the idle one; with the workers' KV events (the chart's
// default) our picker sends a prompt's continuation to the pod that holds its blocks; llm-d's sidecar topology (the picker
// names the prefill pod in x-prefiller-host-port, the decode pod's gateway honours it) works, and
// a prefill host outside the pool is refused. The model is the 135M shape with random weights, so
// that a request of 400 tokens stays in flight for seconds.
import { execFileSync } from "node:child_process";
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import { request as httpsRequest } from "node:https";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { afterAll, beforeAll, describe, expect, test } from "vitest";
import { loadCheckpoint, makeTinyLora, makeTinyModel } from "../../packages/llama/src/index.ts";
import { makeTlsTestDirs } from "../../packages/rm-core/src/index.ts";
import { applyGieCrds, envoyToPicker, llmdBinaries, type Proc, startEnvoy, startStockEpp } from "../../scripts/k8s-rig/llm-d.ts";
import { isReady, PodRunner } from "../../scripts/k8s-rig/pod-runner.ts";
import { gatewayServed, holdOpen, metricSum, Release } from "../../scripts/k8s-rig/release.ts";
import { NPU_BOTH_NODE, type Rig, startRig } from "../../scripts/k8s-rig/rig.ts";

const repo = join(dirname(fileURLToPath(import.meta.url)), "..", "..");
const chart = join(repo, "charts", "rngd-pd");
const NS = "llm-d";
const POOL = "rngd-pd-pool";
const S = 512;

let rig: Rig;
let runner: PodRunner;
let release: Release;
let llmd: string;
let model: string;
const procs: Proc[] = [];

async function post(url: string, body: unknown, headers: Record<string, string> = {}): Promise<{ status: number; body: any; text: string }> {
  const r = await fetch(url, { method: "POST", headers: { "content-type": "application/json", ...headers }, body: JSON.stringify(body) });
  const text = await r.text();
  let parsed: any = null;
  try {
    parsed = JSON.parse(text);
  } catch {}
  return { status: r.status, body: parsed, text };
}

/** The text of a streamed chat answer (SSE deltas joined). */
function sseText(text: string): string {
  return text
    .split("\n")
    .filter((l) => l.startsWith("data: ") && l !== "data: [DONE]")
    .map((l) => JSON.parse(l.slice(6)).choices[0]?.delta?.content ?? "")
    .join("");
}

// The model's id (the pods serve the generated folder; its id is the folder's name). The stock EPP
// refuses a body without `model` (400 "model not found in request body").
let modelId: string;
const completionBody = () => ({ model: modelId, prompt: "Envoy hands this to the picker and then to", max_tokens: 12, temperature: 0 });
const chatBody = () => ({ model: modelId, messages: [{ role: "user", content: "Say something through Envoy." }], max_tokens: 12, temperature: 0, stream: true });
/** True when a completion through `front` answers 200 (the picker behind it is routing). */
const completes = async (front: string) => (await post(`${front}/v1/completions`, completionBody()).catch(() => ({ status: 0 }))).status === 200;

/** Completion and streamed chat through `front` give what a direct request to `direct` gives. */
async function samePassThrough(front: string, direct: string): Promise<void> {
  const [viaEnvoy, straight] = await Promise.all([post(`${front}/v1/completions`, completionBody()), post(`${direct}/v1/completions`, completionBody())]);
  expect(viaEnvoy.status, viaEnvoy.text).toBe(200);
  expect(viaEnvoy.body.choices[0].text).toBe(straight.body.choices[0].text);
  expect(viaEnvoy.body.usage.completion_tokens).toBe(12);
  const [chatEnvoy, chatDirect] = [await post(`${front}/v1/chat/completions`, chatBody()), await post(`${direct}/v1/chat/completions`, chatBody())];
  expect(chatEnvoy.status, chatEnvoy.text).toBe(200);
  expect(chatEnvoy.text.trim().endsWith("data: [DONE]")).toBe(true);
  expect(sseText(chatEnvoy.text)).toBe(sseText(chatDirect.text));
  expect(sseText(chatEnvoy.text).length).toBeGreaterThan(0);
}

/**
 * Holds 4 long streamed requests open on the gateway at `busyIp`, waits until its /metrics shows
 * them, then sends 10 short requests (distinct prompts, starting with `tag`) one by one through
 * `front` and counts where each went. Returns the count on the idle replica. Each caller tags its
 * prompts: a pod that already holds a prompt's blocks draws it under prefix routing, which is
 * routing by prefix, not by load.
 */
async function skewed(front: string, busyIp: string, idleIp: string, tag: string): Promise<{ idle: number; busy: number }> {
  const letGo = await holdOpen(release, `http://${busyIp}:8000`, modelId);
  try {
    await new Promise((r) => setTimeout(r, 500)); // a few of the picker's 50 ms scrapes
    const before = { idle: await gatewayServed(idleIp), busy: await gatewayServed(busyIp) };
    for (let i = 0; i < 10; i++) {
      const r = await post(`${front}/v1/completions`, { model: modelId, prompt: `${tag} probe ${i}: which replica answers?`, max_tokens: 4, temperature: 0 });
      expect(r.status, r.text).toBe(200);
    }
    const after = { idle: await gatewayServed(idleIp), busy: await gatewayServed(busyIp) };
    return { idle: after.idle - before.idle, busy: after.busy - before.busy };
  } finally {
    await letGo();
  }
}

/**
 * `n` clients through `front`, each sending its next streamed completion (48 tokens, ignore_eos)
 * as soon as one ends, until stopped; an answer counts as whole with status 200, no error event,
 * 48 completion tokens and the closing [DONE]. Anything else is a failure, kept with its text.
 */
function holdWhole(front: string, n: number): { whole: number; failures: string[]; stop(): Promise<void> } {
  let holding = true;
  const o = { whole: 0, failures: [] as string[], stop: async () => {} };
  const client = async (i: number) => {
    while (holding) {
      const body = { model: modelId, prompt: `rolling ${i}`, max_tokens: 48, ignore_eos: true, temperature: 0, stream: true, stream_options: { include_usage: true } };
      const r = await fetch(`${front}/v1/completions`, { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify(body) }).catch((e: Error) => e);
      if (r instanceof Error) {
        o.failures.push(`client ${i}: ${r.message}`);
        continue;
      }
      const text = await r.text().catch((e: Error) => `(body cut: ${e.message})`);
      const whole = r.status === 200 && !text.includes('"error"') && text.trimEnd().endsWith("data: [DONE]") && /"completion_tokens":48\b/.test(text);
      if (whole) o.whole++;
      else o.failures.push(`client ${i}: ${r.status} ${text.slice(-300)}`);
    }
  };
  const clients = Array.from({ length: n }, (_, i) => client(i));
  o.stop = async () => {
    holding = false;
    await Promise.all(clients);
  };
  return o;
}

beforeAll(async () => {
  const helm = execFileSync("bash", [join(repo, "scripts", "tools", "helm.sh")], { encoding: "utf8", stdio: ["ignore", "pipe", "inherit"] }).trim();
  llmd = llmdBinaries();
  model = join(repo, "node_modules", ".cache", `airm-k8s-135m-${process.pid}`);
  makeTinyModel({ arch: "llama", out: model, preset: "135m" });
  rig = await startRig([NPU_BOTH_NODE]);
  rig.kubectl(["create", "namespace", NS]);
  applyGieCrds(rig, llmd);
  runner = new PodRunner(rig, repo, NS);
  runner.start();
  release = new Release(rig, runner, helm, NS);
}, 1_800_000);

afterAll(async () => {
  for (const p of procs.reverse()) await p.stop();
  await runner?.stop();
  await rig?.stop();
  if (model) rmSync(model, { recursive: true, force: true });
});

describe("the llm-d path: Envoy -> InferencePool -> endpoint picker -> our pods", () => {
  let pods: { name: string; ip: string }[];

  test("the stock GIE EPP v1.5.0: requests pass through Envoy unchanged, and a skewed load goes to the idle replica", async () => {
    await release.installPdPool(chart, { model, maxModelLen: S, pool: POOL });
    pods = await release.serving("pd", 2, 8000);
    modelId = ((await (await fetch(`http://${pods[0]!.ip}:8000/v1/models`)).json()) as any).data[0].id;
    const epp = await startStockEpp(rig, llmd, POOL, NS);
    procs.push(epp);
    const envoy = await startEnvoy(rig.dir, llmd, { port: 18080, adminPort: 18901, extProc: { host: "127.0.0.1", port: 9002 } });
    procs.push(envoy);
    const front = "http://127.0.0.1:18080";
    let last = "";
    await release
      .until(
        "the picker sending a request through Envoy",
        async () => {
          const r = await post(`${front}/v1/completions`, completionBody()).catch((e: Error) => ({ status: 0, text: e.message }));
          last = `${r.status} ${r.text.slice(0, 300)}`;
          return r.status === 200;
        },
        60_000,
      )
      .catch((e: Error) => {
        throw new Error(`${e.message.split("\n")[0]}; last answer: ${last}\n--- epp\n${epp.log.join("").slice(-4000)}\n--- envoy\n${envoy.log.join("").slice(-2000)}`);
      });
    await samePassThrough(front, `http://${pods[0]!.ip}:8000`);
    const [busy, idle] = [pods[0]!, pods[1]!];
    const got = await skewed(front, busy.ip, idle.ip, "Stock");
    console.log(`stock EPP, skewed load: ${got.idle} of 10 to the idle replica, ${got.busy} to the busy one`);
    expect(got.idle + got.busy).toBe(10);
    expect(got.idle).toBeGreaterThanOrEqual(9);
    // The picker read our gauges: no extract errors for the metrics it needs.
    const log = epp.log.join("");
    expect(log).not.toMatch(/vllm:(num_requests_waiting|num_requests_running|kv_cache_usage_perc|lora_requests_info|cache_config_info)[^\n]*not found/i);
    await envoy.stop();
    await epp.stop();
    await epp.stop();
  });

  test("our picker (epp.enabled, packages/epp; routing prefix by default): the same pass-through and the same shift to the idle replica", async () => {
    await release.helmRun([
      "upgrade",
      "rngd-pd",
      chart,
      "--reuse-values",
      "--set",
      "epp.enabled=true",
      "--set",
      `inferencePool.endpointPickerRef.name=rngd-pd-epp`,
      "--wait",
      "--timeout",
      "180s",
    ]);
    pods = await release.serving("pd", 2, 8000);
    const { envoy, front, epp } = await envoyToPicker(release, llmd, { port: 18081, adminPort: 18902, ready: completes });
    procs.push(envoy);
    await samePassThrough(front, `http://${pods[0]!.ip}:8000`);
    // Skew the other way this time: the second pod is busy.
    const got = await skewed(front, pods[1]!.ip, pods[0]!.ip, "Ours");
    console.log(`our EPP, skewed load: ${got.idle} of 10 to the idle replica, ${got.busy} to the busy one`);
    expect(got.idle + got.busy).toBe(10);
    expect(got.idle).toBeGreaterThanOrEqual(9);
    const metrics = await (await fetch(`http://${epp.ip}:9090/metrics`)).text();
    expect(metrics).toMatch(/^airm_epp_picks_total\{[^}]*\} \d+/m);
    await envoy.stop();
  });

  test("precise prefix routing (kvEvents.enabled, epp.routing prefix): each prompt's continuation goes to the pod whose decode worker holds its blocks", async () => {
    await release.helmRun(["upgrade", "rngd-pd", chart, "--reuse-values", "--set", "kvEvents.enabled=true", "--set", "epp.routing=prefix", "--wait", "--timeout", "180s"]);
    pods = await release.serving("pd", 2, 8000);
    const { envoy, front, epp } = await envoyToPicker(release, llmd, { port: 18082, adminPort: 18903, ready: completes });
    procs.push(envoy);
    const eppMetrics = async () => (await fetch(`http://${epp.ip}:9090/metrics`)).text();
    const where = async (prompt: string): Promise<number> => {
      const before = await Promise.all(pods.map((p) => gatewayServed(p.ip)));
      const r = await post(`${front}/v1/completions`, { model: modelId, prompt, max_tokens: 4, temperature: 0 });
      expect(r.status, r.text).toBe(200);
      const after = await Promise.all(pods.map((p) => gatewayServed(p.ip)));
      return after.findIndex((n, i) => n > before[i]!);
    };
    // Four first turns (long enough for several blocks of 16), then each one's continuation.
    const firsts = [0, 1, 2, 3].map((i) => `Conversation ${i} about ${["rivers", "clocks", "bees", "maps"][i]}: ${"tell me more and more about it, ".repeat(6)}`);
    const at: number[] = [];
    for (const p of firsts) at.push(await where(p));
    await release.until("the picker's index holding the pods' blocks", async () => metricSum(await eppMetrics(), "airm_epp_index_blocks") > 0, 30_000);
    const affine = async () => Number(/^airm_epp_picks_total\{reason="prefix_affinity"[^}]*\} (\d+)/m.exec(await eppMetrics())?.[1] ?? 0);
    const affine0 = await affine();
    // The continuations in the reverse order: routing by load (ties in turn) would put them on
    // the pods in the same alternation as the first turns, so on the other pod each time.
    const next: number[] = [];
    for (const p of [...firsts].reverse()) next.unshift(await where(`${p} And then?`));
    console.log(`prefix routing: first turns on pods ${at.join(",")}, continuations on ${next.join(",")}`);
    expect(new Set(at).size).toBe(2);
    expect(next).toEqual(at);
    expect((await affine()) - affine0).toBe(4);
    expect(metricSum(await eppMetrics(), "airm_epp_prefix_lookups_total")).toBeGreaterThanOrEqual(4);
    await envoy.stop();
  });

  test("LoRA affinity: requests naming an adapter loaded on one of the two PD pods go to that pod, through our picker and through the stock EPP's lora-affinity-scorer", async () => {
    await release.helmRun(["upgrade", "rngd-pd", chart, "--reuse-values", "--set", "lora.enabled=true", "--wait", "--timeout", "180s"]);
    pods = await release.serving("pd", 2, 8000);
    const [holder, other] = [pods[0]!, pods[1]!];
    const ckpt = await loadCheckpoint(model);
    const adapter = join(rig.dir, "lora-sql");
    makeTinyLora({ out: adapter, model: ckpt.config, baseModel: model, r: 4, seed: 3 });
    ckpt.tensors.close();
    const loaded = await post(`http://${holder.ip}:8000/v1/load_lora_adapter`, { lora_name: "sql", lora_path: adapter });
    expect(loaded.status, loaded.text).toBe(200);
    // The pod says so in vllm:lora_requests_info (running_lora_adapters), which both pickers read.
    await release.until("the holder's gateway reporting the adapter", async () =>
      /running_lora_adapters="sql"/.test(await (await fetch(`http://${holder.ip}:8000/metrics`)).text()),
    );
    // A new prompt each time: a picker's prefix affinity (the stock one's prefix-cache-scorer
    // remembers where it sent a prompt) is not what this measures.
    let n = 0;
    const body = () => ({ model: "sql", prompt: `Routed to where the adapter is, request ${n++}`, max_tokens: 4, temperature: 0 });
    const through = async (front: string, who: string) => {
      const [h0, o0] = await Promise.all([gatewayServed(holder.ip), gatewayServed(other.ip)]);
      const statuses: number[] = [];
      for (let i = 0; i < 6; i++) statuses.push((await post(`${front}/v1/completions`, body())).status);
      const [h1, o1] = await Promise.all([gatewayServed(holder.ip), gatewayServed(other.ip)]);
      console.log(`LoRA affinity (${who}): ${h1 - h0} of 6 to the pod holding the adapter, ${o1 - o0} to the other; statuses ${statuses.join(",")}`);
      expect(statuses).toEqual([200, 200, 200, 200, 200, 200]);
      expect(h1 - h0).toBe(6);
      expect(o1 - o0).toBe(0);
    };
    const ours = await envoyToPicker(release, llmd, { port: 18085, adminPort: 18906, ready: completes });
    procs.push(ours.envoy);
    // Our picker scrapes every 50 ms: once it has seen the adapter, every request naming it goes to the holder.
    await release.until("our picker seeing the adapter", async () => (await post(`${ours.front}/v1/completions`, body())).status === 200);
    await through(ours.front, "ours");
    await ours.envoy.stop();
    // A stock picker (with the lora-affinity-scorer), started now the pool has its pods.
    // Ports of its own: our picker's pod holds 9002, 9003 and 9090 on its address.
    const stockEpp = await startStockEpp(rig, llmd, POOL, NS, { grpc: 19002, health: 19003, metrics: 19090 });
    procs.push(stockEpp);
    const stock = await startEnvoy(rig.dir, llmd, { port: 18086, adminPort: 18907, extProc: { host: "127.0.0.1", port: 19002 } });
    procs.push(stock);
    const stockLog = () => `\n--- stock epp\n${stockEpp.log.join("").slice(-6000)}`;
    await release
      .until("a base-model request through the stock picker", () => completes("http://127.0.0.1:18086"))
      .catch((e: Error) => {
        throw new Error(`${e.message.split("\n")[0]}${stockLog()}`);
      });
    let last = "";
    await release
      .until("the stock picker seeing the adapter", async () => {
        const r = await post("http://127.0.0.1:18086/v1/completions", body());
        last = `${r.status} ${r.text.slice(0, 200)}`;
        return r.status === 200;
      })
      .catch((e: Error) => {
        throw new Error(`${e.message.split("\n")[0]}; last answer: ${last}${stockLog()}`);
      });
    await through("http://127.0.0.1:18086", "stock");
    await stock.stop();
    await stockEpp.stop();
  });

  test("llm-d's sidecar topology: our picker names the prefill pod, the decode pod's gateway prefills there; a host outside the pool is refused", async () => {
    await release.helmRun([
      "upgrade",
      "rngd-pd",
      chart,
      "--reuse-values",
      "-f",
      join(chart, "examples", "llm-d-sidecar.yaml"),
      "--set",
      "prefill.replicas=2",
      "--set",
      "decode.replicas=2",
      "--set",
      "epp.disaggregation=prompt-length",
      "--set",
      "epp.localPrefillMaxTokens=4",
      "--wait",
      "--timeout",
      "180s",
    ]);
    const prefills = await release.serving("prefill", 2, 8000);
    const decodes = await release.serving("decode", 2, 8000);
    const [epp] = await release.listening("epp", 1, 9002);
    const envoy = await startEnvoy(rig.dir, llmd, { port: 18082, adminPort: 18903, extProc: { host: epp!.ip, port: 9002 } });
    procs.push(envoy);
    const front = "http://127.0.0.1:18082";
    // The sidecars know the prefill pods from the pool before the first request goes through.
    await release.until("a sidecar's prefill pool filled from the InferencePool", async () => {
      const h = (await (await fetch(`http://${decodes[0]!.ip}:8000/health`)).json()) as any;
      return h.roles.find((r: any) => r.role === "prefill")?.endpoints.filter((e: any) => e.healthy).length === 2;
    });
    await release.until("our picker sending a request through Envoy", () => completes(front), 60_000);
    const prefilled = async () =>
      Promise.all(
        prefills.map(async (p) => {
          const t = await (await fetch(`http://${p.ip}:8000/metrics`)).text();
          return Number(/^airm_worker_requests_total\{route="prefill",outcome="ok"[^}]*\} (\d+)$/m.exec(t)?.[1] ?? 0);
        }),
      );
    const prefillPicks = async () => {
      const t = await (await fetch(`http://${epp!.ip}:9090/metrics`)).text();
      return [...t.matchAll(/^airm_epp_picks_total\{([^}]*)\} (\d+)/gm)].filter((m) => m[1]!.includes('role="prefill"')).reduce((a, m) => a + Number(m[2]), 0);
    };
    const generated = async () => {
      let n = 0;
      // The decode worker's own metrics, on its port beside the sidecar gateway's.
      for (const d of decodes) {
        const w = await (await fetch(`http://${d.ip}:8102/metrics`)).text();
        n += Number(/^airm_worker_requests_total\{route="generate",outcome="ok"[^}]*\} (\d+)$/m.exec(w)?.[1] ?? 0);
      }
      return n;
    };
    const sum = (xs: number[]) => xs.reduce((a, b) => a + b, 0);
    const before = { prefilled: sum(await prefilled()), picks: await prefillPicks(), generated: await generated() };
    await samePassThrough(front, `http://${decodes[0]!.ip}:8000`);
    // Through Envoy (2 requests, prompts longer than 4 tokens): the picker named a prefill pod and
    // the prefill ran there. Direct to a decode pod's gateway (2, no header): prefilled locally.
    expect(sum(await prefilled()) - before.prefilled).toBe(2);
    expect((await prefillPicks()) - before.picks).toBe(2);
    expect((await generated()) - before.generated).toBe(2);
    // A prompt of at most 4 tokens through Envoy is not disaggregated: no prefill pod, the decode pod prefills it.
    const tiny = await post(`${front}/v1/completions`, { model: modelId, prompt: "Hi!", max_tokens: 4, temperature: 0 });
    expect(tiny.status, tiny.text).toBe(200);
    expect(sum(await prefilled()) - before.prefilled).toBe(2);
    expect((await generated()) - before.generated).toBe(3);

    // Skewed: one decode pod holds 4 long requests; new requests go to the other.
    const got = await skewed(front, decodes[0]!.ip, decodes[1]!.ip, "Sidecar");
    console.log(`sidecar topology, our EPP, skewed load: ${got.idle} of 10 to the idle decode pod, ${got.busy} to the busy one`);
    expect(got.idle).toBeGreaterThanOrEqual(9);

    // The header names the prefill pod; a name outside the pool's prefill pods is refused.
    const named = await post(`http://${decodes[1]!.ip}:8000/v1/completions`, completionBody(), { "x-prefiller-host-port": `${prefills[1]!.ip}:8000` });
    expect(named.status, named.text).toBe(200);
    for (const other of [`${decodes[0]!.ip}:8000`, "127.0.0.1:6443", "10.0.0.1:8000"]) {
      const r = await post(`http://${decodes[1]!.ip}:8000/v1/completions`, completionBody(), { "x-prefiller-host-port": other });
      expect(r.status, `${other}: ${r.text}`).toBe(403);
      expect(r.body.error.code).toBe("prefiller_not_in_pool");
    }
    await envoy.stop();
  });

  test("a rolling restart of the gateway Deployment (tcp, two gateway pods) under held-open streaming load through Envoy: no client error, every answer whole", async () => {
    // From the sidecar topology back to the gateway topology with tcp: the pool selects the two
    // gateway pods; our picker behind Envoy.
    await release
      .helmRun([
        "upgrade",
        "--install",
        "rngd-pd",
        chart,
        "--reset-values",
        "-f",
        join(chart, "examples", "tcp.yaml"),
        ...[
          `model.path=${model}`,
          `maxModelLen=${S}`,
          "inferencePool.create=true",
          `inferencePool.name=${POOL}`,
          "epp.enabled=true",
          "inferencePool.endpointPickerRef.name=rngd-pd-epp",
        ].flatMap((v) => ["--set", v]),
        "--wait",
        "--timeout",
        "180s",
      ])
      .catch((e: Error) => {
        throw new Error(`${e.message}\n${rig.kubectl(["get", "pods", "-n", NS, "-o", "wide"])}\n${release.podLogs()}`);
      });
    const gateways = await release.serving("gateway", 2, 8000);
    modelId ??= ((await (await fetch(`http://${gateways[0]!.ip}:8000/v1/models`)).json()) as any).data[0].id;
    const { envoy, front } = await envoyToPicker(release, llmd, { port: 18083, adminPort: 18904, ready: completes });
    procs.push(envoy);
    const load = holdWhole(front, 4);
    await release.until("the load running through Envoy", () => load.whole >= 4 || null);
    const old = new Set(gateways.map((g) => g.name));
    rig.kubectl(["rollout", "restart", "deployment/rngd-pd-gateway", "-n", NS]);
    const ready = () => JSON.parse(rig.kubectl(["get", "pods", "-n", NS, "-l", "app.kubernetes.io/component=gateway", "-o", "json"])).items.filter(isReady);
    await release.until(
      "the rollout done: two new gateway pods ready, the old ones' processes gone",
      () => {
        const now = ready().map((p: { metadata: { name: string } }) => p.metadata.name);
        return (now.length === 2 && now.every((n: string) => !old.has(n)) && ![...runner.pods.values()].some((p) => old.has(p.name))) || null;
      },
      240_000,
    );
    await release.serving("gateway", 2, 8000);
    const after = load.whole;
    await release.until("more answers after the rollout", () => load.whole >= after + 4 || null);
    await load.stop();
    console.log(`gateway rolling restart through Envoy: ${load.whole} whole answers, ${load.failures.length} failures`);
    expect(load.failures).toEqual([]);
    await envoy.stop();
  });

  test("mutual TLS between the parts (tls.existingSecret): Envoy reaches our picker over TLS, gateways reach workers over https, workers the relay over TLS; a worker refuses a caller without a certificate of the CA", async () => {
    // The tcp gateway topology of the test before, now with a Secret of a CA of this test.
    const dirs = makeTlsTestDirs(mkdtempSync(join(rig.dir, "tls-")));
    const file = (dir: string, name: string) => join(dir, name);
    rig.kubectl(["create", "secret", "generic", "airm-tls", "-n", NS, ...["tls.crt", "tls.key", "ca.crt"].map((k) => `--from-file=${k}=${file(dirs.good, k)}`)]);
    await release
      .helmRun(["upgrade", "rngd-pd", chart, "--reuse-values", "--set", "tls.enabled=true", "--set", "tls.existingSecret=airm-tls", "--wait", "--timeout", "240s"])
      .catch((e: Error) => {
        throw new Error(`${e.message}\n${rig.kubectl(["get", "pods", "-n", NS, "-o", "wide"])}\n${release.podLogs()}`);
      });
    const gateways = await release.serving("gateway", 2, 8000);
    const [prefill] = await release.listening("prefill", 1, 8101);
    // The worker's serving port: mutual TLS only. Its plain port answers the kubelet's probes.
    const get = (cert?: string) =>
      new Promise<string>((resolve) => {
        const own = cert ? { cert: readFileSync(file(cert, "tls.crt")), key: readFileSync(file(cert, "tls.key")) } : {};
        const req = httpsRequest(
          { host: prefill!.ip, port: 8101, path: "/health", ca: readFileSync(file(dirs.good, "ca.crt")), ...own, agent: false, checkServerIdentity: () => undefined },
          (r) => {
            r.resume();
            resolve(`status ${r.statusCode}`);
          },
        );
        req.on("error", (e: NodeJS.ErrnoException) => resolve(e.code ?? e.message));
        req.end();
      });
    expect(await get(dirs.good)).toBe("status 200");
    expect(await get()).not.toMatch(/^status/);
    expect(await get(dirs.foreign)).not.toMatch(/^status/);
    const plainOnServing = await fetch(`http://${prefill!.ip}:8101/health`, { signal: AbortSignal.timeout(5000) }).then(
      (r) => `status ${r.status}`,
      (e: Error) => e.message,
    );
    expect(plainOnServing).toBe("fetch failed");
    expect((await fetch(`http://${prefill!.ip}:9411/health`)).status).toBe(200);
    // Envoy checks the picker's certificate against the deployment's CA; the answer is what a gateway gives directly.
    const { envoy, front, epp } = await envoyToPicker(release, llmd, { port: 18084, adminPort: 18905, ready: completes, tlsCa: file(dirs.good, "ca.crt") });
    procs.push(envoy);
    await samePassThrough(front, `http://${gateways[0]!.ip}:8000`);
    const [relay] = release.pods("kv-relay");
    expect(runner.logs(relay!.name, "kv-relay")).toMatch(/airm-kv-relay listening on \S+ \(mutual TLS/);
    const prefillLog = runner.logs(prefill!.name, "prefill");
    expect(prefillLog).toMatch(/"url":"https:\/\/[^"]+:8101"/);
    const plainCalls = prefillLog.split("\n").filter((l) => l.includes("ERR_SSL_HTTP_REQUEST"));
    console.log(`TLS through the chart: ${plainCalls.length} plain-HTTP calls refused at the prefill worker; first: ${plainCalls[0]?.slice(0, 300)}`);
    const pickerMetrics = await (await fetch(`http://${epp.ip}:9090/metrics`)).text();
    expect(pickerMetrics).toMatch(/^airm_epp_picks_total\{[^}]*\} \d+/m);
    await envoy.stop();
  });

  test("uninstall leaves no pod and no process", async () => {
    const pids = runner.pids();
    expect(pids.length).toBeGreaterThan(0);
    await release.helmRun(["uninstall", "rngd-pd", "--wait", "--timeout", "120s"]);
    await release.until("every pod gone and its processes stopped", () => runner.pods.size === 0 && runner.pids().length === 0);
    for (const pid of pids) expect(() => process.kill(pid, 0)).toThrow();
  });
});
