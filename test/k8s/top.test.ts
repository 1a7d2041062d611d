// `airm top --k8s` against the chart installed in a real control plane (scripts/k8s-rig: the API
// server, kwok for the kubelets, the pod runner for the containers at their pod IPs): the tcp
// shape (a prefill pod, a decode pod, the KV relay, two gateways) found through the API server,
// `--once --json` checked against the pods' own /metrics, and the console in tmux draining the
// decode worker of the pool and resuming it.
import { execFile, execFileSync } from "node:child_process";
import { rmSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { promisify } from "node:util";
import { afterAll, beforeAll, describe, expect, test } from "vitest";
import { makeTinyModel } from "../../packages/llama/src/index.ts";
import { Tmux } from "../../packages/workload-runner/test/helpers/tmux.ts";
import type { Snapshot } from "../../packages/workload-runner/src/top/snapshot.ts";
import { PodRunner } from "../../scripts/k8s-rig/pod-runner.ts";
import { chartCompletion, helm as runHelm } from "../../scripts/k8s-rig/release.ts";
import { type Rig, startRig } from "../../scripts/k8s-rig/rig.ts";

const repo = join(dirname(fileURLToPath(import.meta.url)), "..", "..");
const chart = join(repo, "charts", "rngd-pd");
const airm = join(repo, "packages", "workload-runner", "bin", "airm.mjs");
const NS = "serving";
const run = promisify(execFile);
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

let rig: Rig;
let runner: PodRunner;
let model: string;

/** The running pods' component -> pod IP. */
function podIps(): Map<string, string[]> {
  const out = new Map<string, string[]>();
  for (const p of JSON.parse(rig.kubectl(["get", "pods", "-n", NS, "-o", "json"])).items as any[]) {
    if (p.metadata.deletionTimestamp || !p.status.podIP) continue;
    const c = p.metadata.labels["app.kubernetes.io/component"];
    out.set(c, [...(out.get(c) ?? []), p.status.podIP]);
  }
  return out;
}

/** Waits until every gateway pod answers /health 200 (the workers are then healthy too). */
async function gatewaysHealthy(): Promise<string[]> {
  const end = Date.now() + 180_000;
  for (;;) {
    const ips = podIps().get("gateway") ?? [];
    const ok = await Promise.all(
      ips.map((ip) =>
        fetch(`http://${ip}:8000/health`).then(
          (r) => r.status === 200,
          () => false,
        ),
      ),
    );
    if (ips.length === 2 && ok.every(Boolean)) return ips;
    if (Date.now() > end) throw new Error(`the gateways are not healthy: ${JSON.stringify([...podIps()])}\n${runner.podLogs(1500)}`);
    await sleep(500);
  }
}

/** A page's sum of the series of `name` whose label text contains `having`. */
async function total(url: string, name: string, having = ""): Promise<number> {
  const text = await (await fetch(`${url}/metrics`)).text();
  return [...text.matchAll(/^([a-zA-Z_:][\w:]*)(\{[^}]*\})? (\S+)$/gm)].filter((m) => m[1] === name && (m[2] ?? "").includes(having)).reduce((a, m) => a + Number(m[3]), 0);
}

beforeAll(async () => {
  const helm = execFileSync("bash", [join(repo, "scripts", "tools", "helm.sh")], { encoding: "utf8", stdio: ["ignore", "pipe", "inherit"] }).trim();
  model = join(repo, "node_modules", ".cache", `airm-k8s-top-tiny-${process.pid}`);
  makeTinyModel({ arch: "llama", out: model });
  rig = await startRig([
    { name: "npu-rngd", labels: { "airm.ai-computing.io/furiosa.RNGD": "true" }, devices: { "furiosa.ai/rngd": 2 } },
    { name: "npu-atom", labels: { "airm.ai-computing.io/rebellions.ATOM": "true" }, devices: { "rebellions.ai/ATOM": 2 } },
    { name: "cpu", labels: {} },
  ]);
  rig.kubectl(["create", "namespace", NS]);
  runner = new PodRunner(rig, repo, NS);
  runner.start();
  const values = ["--set", `model.path=${model}`, "--set", "maxModelLen=128", "-f", join(chart, "examples", "tcp.yaml")];
  await runHelm(helm, ["install", "rngd-pd", chart, ...values, "--wait", "--timeout", "180s", "--kubeconfig", rig.kubeconfig, "--namespace", NS]);
}, 900_000);

afterAll(async () => {
  await runner?.stop();
  await rig?.stop();
  if (model) rmSync(model, { recursive: true, force: true });
});

describe("airm top --k8s on the chart's pods", () => {
  test("--once --json finds the tcp shape through the API server and reads each pod at its IP", async () => {
    const gateways = await gatewaysHealthy();
    for (const ip of gateways) await chartCompletion(`http://${ip}:8000`);
    const r = await run(process.execPath, [airm, "top", "--k8s", NS, "--once", "--json"], { env: { ...process.env, KUBECONFIG: rig.kubeconfig } });
    const snap = JSON.parse(r.stdout) as Snapshot;
    expect(snap.unreachable).toEqual([]);
    const byKind = (k: string) => snap.parts.filter((p) => p.kind === k);
    expect(
      byKind("gateway")
        .map((p) => p.url)
        .sort(),
    ).toEqual(gateways.map((ip) => `http://${ip}:8000`).sort());
    expect(
      byKind("worker")
        .map((p) => `${p.role} ${p.url}`)
        .sort(),
    ).toEqual([`decode http://${podIps().get("decode")![0]}:8102`, `prefill http://${podIps().get("prefill")![0]}:8101`]);
    expect(byKind("relay").map((p) => p.url)).toEqual([`http://${podIps().get("kv-relay")![0]}:9401`]);
    for (const p of snap.parts) expect(p.state, p.name).toBe("ok");
    // no traffic now: the figures are the pages' own, summed over both gateways
    let ok = 0;
    for (const ip of gateways) ok += await total(`http://${ip}:8000`, "airm_gateway_requests_total", 'status="200"');
    expect(snap.cluster.requests["200"]).toBe(ok);
    expect(snap.cluster.ttftS.count).toBe(ok);
    const decode = (await (await fetch(`http://${podIps().get("decode")![0]}:8102/health`)).json()) as { kvCache: { totalBlocks: number } };
    expect(byKind("worker").find((p) => p.role === "decode")!.kvTotalBlocks).toBe(decode.kvCache.totalBlocks);
    expect(byKind("worker").every((p) => p.restarts === 0)).toBe(true); // the containers' restart counts
  });

  test("the console drains the pool's decode worker (warning that it is the last) and resumes it", async () => {
    await gatewaysHealthy();
    const decode = `http://${podIps().get("decode")![0]}:8102`;
    const tmux = new Tmux();
    try {
      tmux.start([process.execPath, airm, "top", "--k8s", NS], { width: 100, height: 30, env: { KUBECONFIG: rig.kubeconfig }, unset: ["CI"] });
      await tmux.waitFor((s) => (s.match(/ ok /g) ?? []).length >= 5, 60_000, "five parts ok");
      tmux.keys("/", "decode", "Enter");
      await tmux.waitFor((s) => /^>decode-\S+/m.test(s), 10_000, "the decode pod selected");
      tmux.keys("d");
      await tmux.waitFor((s) => s.includes("no other decode worker takes requests"), 10_000, "the last-of-its-role warning");
      tmux.keys("y");
      await tmux.waitFor((s) => / drains: it takes no new request/.test(s), 10_000, "the drain");
      const h = await fetch(`${decode}/health`);
      expect([h.status, ((await h.json()) as { status: string }).status]).toEqual([503, "draining"]);
      await tmux.waitFor((s) => /^>decode-\S+\s+decode\s+draining/m.test(s), 10_000, "the row draining");
      tmux.keys("u");
      await tmux.waitFor((s) => s.includes("takes requests again"), 10_000, "the resume");
      expect((await fetch(`${decode}/health`)).status).toBe(200);
      tmux.keys("Escape", "q");
      await tmux.waitFor(() => !tmux.running(), 10_000, "airm top to quit");
    } finally {
      tmux.kill();
    }
  });
});
