// The chart's dashboard and rules against a real Prometheus scraping the rig (3.16, built by
// scripts/k8s-rig/build-prometheus.sh with Kubernetes discovery: Debian's 2.42 has none):
// kubernetes_sd_configs (role pod) against the rig's API server, keeping the pods that carry
// `airm.ai-computing.io/scrape: "true"` on their metrics ports (`metrics`, and the workers'
// `prefill` / `decode`), relabelled to namespace, pod, component and container; the chart's rules
// file loaded as is. The release runs the tcp topology (gateway, prefill, decode and relay pods)
// and the project's endpoint picker over an InferencePool. Under a short load every PromQL expression the dashboard
// shows and every recording rule returns series; an expression may come back empty only when a
// metric it needs has no sample yet although a scraped target exports it (an event counter: 429s,
// migrations, errors), which the target metadata shows. Every metric an alert names is exported by
// a scraped target. Nothing listens beyond loopback (the test runs in its own network namespace).
import { type ChildProcess, execFileSync, spawn } from "node:child_process";
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, test } from "vitest";
import { makeTinyModel } from "../../packages/llama/src/index.ts";
import { applyGieCrds, llmdBinaries } from "../../scripts/k8s-rig/llm-d.ts";
import { PodRunner } from "../../scripts/k8s-rig/pod-runner.ts";
import { Release } from "../../scripts/k8s-rig/release.ts";
import { freePort, type Rig, startRig } from "../../scripts/k8s-rig/rig.ts";
import { killOnInterrupt } from "../../scripts/rig-cleanup.ts";
import { dashboardQueries, metricNames, type Query, ruleQueries, rulesFile } from "../observability-queries.ts";

const repo = join(import.meta.dirname, "..", "..");
const chart = join(repo, "charts", "rngd-pd");
const NS = "serving";
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

let rig: Rig;
let runner: PodRunner;
let release: Release;
let model: string;
let prom: ChildProcess | undefined;
let promUrl: string;
const promDir = mkdtempSync(join(tmpdir(), "airm-prometheus-"));
let promLog = "";

/** The Prometheus configuration: the rig's API server with its admin certificate, the chart's rules. */
function promConfig(): string {
  const server = /server: (\S+)/.exec(readFileSync(rig.kubeconfig, "utf8"))![1];
  const tls = `{ca_file: "${join(rig.dir, "ca.crt")}", cert_file: "${join(rig.dir, "admin.crt")}", key_file: "${join(rig.dir, "admin.key")}"}`;
  return [
    "global: {scrape_interval: 1s, scrape_timeout: 1s, evaluation_interval: 1s}",
    `rule_files: ["${rulesFile}"]`,
    "scrape_configs:",
    "  - job_name: rngd-pd",
    "    kubernetes_sd_configs:",
    `      - {role: pod, api_server: "${server}", tls_config: ${tls}, namespaces: {names: [${NS}]}}`,
    "    relabel_configs:",
    "      - {source_labels: [__meta_kubernetes_pod_annotation_airm_ai_computing_io_scrape], regex: 'true', action: keep}",
    "      - {source_labels: [__meta_kubernetes_pod_container_port_name], regex: 'metrics|prefill|decode', action: keep}",
    "      - {source_labels: [__meta_kubernetes_namespace], target_label: namespace}",
    "      - {source_labels: [__meta_kubernetes_pod_name], target_label: pod}",
    "      - {source_labels: [__meta_kubernetes_pod_label_app_kubernetes_io_component], target_label: component}",
    "      - {source_labels: [__meta_kubernetes_pod_container_name], target_label: container}",
    "",
  ].join("\n");
}

async function api(path: string): Promise<any> {
  const r = await fetch(`${promUrl}${path}`);
  const body = (await r.json()) as { status: string; data: any; error?: string };
  if (body.status !== "success") throw new Error(`${path}: ${body.error}`);
  return body.data;
}

/** Series an instant query returns (Grafana's variables as "all", rate windows of a minute). */
async function series(expr: string): Promise<number> {
  const q = expr.replace(/\$__rate_interval|\$\{__rate_interval\}|\$__range|\$\{__range\}/g, "1m").replace(/\$\{?(namespace|pod)\}?/g, ".*");
  const data = await api(`/api/v1/query?query=${encodeURIComponent(q)}`);
  return data.result.length;
}

beforeAll(async () => {
  const helm = execFileSync("bash", [join(repo, "scripts", "tools", "helm.sh")], { encoding: "utf8", stdio: ["ignore", "pipe", "inherit"] }).trim();
  model = join(repo, "node_modules", ".cache", `airm-k8s-prom-${process.pid}`);
  makeTinyModel({ arch: "llama", out: model });
  rig = await startRig([
    { name: "npu-rngd", labels: { "airm.ai-computing.io/furiosa.RNGD": "true" }, devices: { "furiosa.ai/rngd": 2 } },
    { name: "npu-atom", labels: { "airm.ai-computing.io/rebellions.ATOM": "true" }, devices: { "rebellions.ai/ATOM": 2 } },
    { name: "cpu", labels: {} },
  ]);
  rig.kubectl(["create", "namespace", NS]);
  // The picker follows an InferencePool: its CRD, and a pool the release creates.
  applyGieCrds(rig, llmdBinaries());
  runner = new PodRunner(rig, repo, NS);
  runner.start();
  release = new Release(rig, runner, helm, NS);
  await release.helmRun([
    "install",
    "rngd-pd",
    chart,
    ...[`model.path=${model}`, "maxModelLen=128", "epp.enabled=true", "inferencePool.create=true", "inferencePool.name=rngd-pd-pool"].flatMap((v) => ["--set", v]),
    "-f",
    join(chart, "examples", "tcp.yaml"),
    "--wait",
    "--timeout",
    "180s",
  ]);
  const prometheus = execFileSync("bash", [join(repo, "scripts", "k8s-rig", "build-prometheus.sh")], { encoding: "utf8", stdio: ["ignore", "pipe", "inherit"] })
    .trim()
    .split("\n")
    .pop()!;
  const port = await freePort();
  promUrl = `http://127.0.0.1:${port}`;
  writeFileSync(join(promDir, "prometheus.yml"), promConfig());
  // killed with the rig if a signal stops the run (its folder is in test.sh's TMPDIR)
  prom = killOnInterrupt(
    spawn(prometheus, [`--config.file=${join(promDir, "prometheus.yml")}`, `--storage.tsdb.path=${join(promDir, "data")}`, `--web.listen-address=127.0.0.1:${port}`], {
      stdio: ["ignore", "ignore", "pipe"],
    }),
  );
  prom.stderr!.on("data", (d) => (promLog = (promLog + d).slice(-20_000)));
  await release.until(
    "Prometheus ready",
    () =>
      fetch(`${promUrl}/-/ready`).then(
        (r) => r.ok,
        () => false,
      ),
    60_000,
  );
}, 1_800_000);

afterAll(async () => {
  prom?.kill("SIGTERM");
  await runner?.stop();
  await rig?.stop();
  if (model) rmSync(model, { recursive: true, force: true });
  rmSync(promDir, { recursive: true, force: true });
});

describe("the chart's dashboard and rules against a real Prometheus scraping the rig", () => {
  test("every panel's and every recording rule's query returns series under a short load; every metric the alerts name is scraped", async () => {
    // Every scraped part is up: gateway, prefill, decode, relay, picker.
    const targets = await release
      .until(
        "Prometheus scraping five parts",
        async () => {
          const active = (await api("/api/v1/targets")).activeTargets as { labels: Record<string, string>; health: string; lastError: string }[];
          return active.length >= 5 && active.every((t) => t.health === "up") ? active : null;
        },
        90_000,
      )
      .catch((e: Error) => {
        throw new Error(`${e.message}\n${promLog.slice(-3000)}`);
      });
    const components = [...new Set(targets.map((t) => t.labels.component))].sort();
    expect(components).toEqual(["decode", "epp", "gateway", "kv-relay", "prefill"]);

    // A short load through one of the two gateway pods (the chart's default with tcp): 24 streamed
    // completions, two at a time.
    const [gw] = await release.serving("gateway", 2, 8000);
    const model = ((await (await fetch(`http://${gw!.ip}:8000/v1/models`)).json()) as { data: { id: string }[] }).data[0]!.id;
    for (let i = 0; i < 12; i++) {
      await Promise.all(
        [0, 1].map(async (j) => {
          const r = await fetch(`http://${gw!.ip}:8000/v1/completions`, {
            method: "POST",
            headers: { "content-type": "application/json" },
            body: JSON.stringify({ model, prompt: `load ${i}.${j}`, max_tokens: 12, ignore_eos: true, stream: true }),
          });
          expect(r.status).toBe(200);
          await r.text();
        }),
      );
    }
    // Two scrapes and two rule evaluations after the last request, and a rate window with samples on both sides.
    await sleep(5000);

    const queries: Query[] = [...dashboardQueries(), ...ruleQueries()];
    const recorded = new Set(queries.filter((q) => q.where.startsWith("record ")).map((q) => q.where.slice("record ".length)));
    const lines: string[] = [];
    const empty: string[] = [];
    const exportedButEmpty = async (q: Query) => {
      for (const name of metricNames(q.expr).filter((n) => !n.startsWith("~"))) {
        if ((await series(name)) > 0) continue;
        const meta = (await api(`/api/v1/targets/metadata?metric=${encodeURIComponent(name)}`)) as unknown[];
        if (meta.length === 0) return false; // not even exported by a scraped target
      }
      return true;
    };
    for (const q of queries) {
      if (q.needs) {
        lines.push(`${q.where}: skipped (needs ${q.needs})`);
        continue;
      }
      if (q.where.startsWith("alert ")) {
        // An alert's expression is empty while all is well; what it names must be scraped (or
        // recorded by a rule, whose own expression is checked above).
        const names = metricNames(q.expr).filter((n) => !n.startsWith("~") && !recorded.has(n));
        const missing: string[] = [];
        for (const n of names) if ((await series(n)) === 0 && ((await api(`/api/v1/targets/metadata?metric=${encodeURIComponent(n)}`)) as unknown[]).length === 0) missing.push(n);
        const own = metricNames(q.expr).filter((n) => recorded.has(n)).length;
        lines.push(`${q.where}: ${names.length} scraped metrics${own ? `, ${own} recorded by the rules` : ""}${missing.length ? `, missing ${missing.join(", ")}` : ""}`);
        if (missing.length) empty.push(`${q.where}: ${missing.join(", ")} not scraped`);
        continue;
      }
      const n = await series(q.expr);
      const why = n > 0 ? "" : (await exportedButEmpty(q)) ? " (no event yet: its counter is exported, with no sample)" : " EMPTY";
      lines.push(`${q.where}: ${n} series${why}`);
      if (why === " EMPTY" || (n === 0 && q.where.startsWith("record "))) empty.push(`${q.where}: ${q.expr}`);
    }
    console.log(`Prometheus ${targets.length} targets (${components.join(", ")}); the chart's queries:\n${lines.join("\n")}`);
    expect(empty).toEqual([]);
  });
});
