// What operators look at (issue 39): the chart's Grafana dashboard ConfigMap, PrometheusRule,
// PodMonitor and tracing env, rendered with the real helm (as test/chart.test.ts does); the rules
// checked and unit-tested with promtool (Debian's `prometheus` package; CI installs it, and this
// test fails without it); and every metric the dashboard's and the rules' PromQL names checked
// against what the parts' prom-client registries really export.
import { spawnSync } from "node:child_process";
import { mkdtempSync, readFileSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { beforeAll, describe, expect, test } from "vitest";
import { parse, stringify } from "yaml";
import { declaredVariables } from "../scripts/gen-docs.ts";
import { helmBinary, type Manifest, manifests as manifestsOf, render as renderChart } from "./chart-render.ts";
import { LATENCY_BUCKETS } from "../packages/gateway/src/gateway-metrics.ts";
import {
  chartDir,
  dashboardFile,
  dashboardQueries,
  EXTERNAL_METRICS,
  exportedMetrics,
  metricNames,
  ruleGroups,
  ruleQueries,
  rulesFile,
  rulesTestFile,
  unknownMetrics,
} from "./observability-queries.ts";

const example = (name: string) => join(chartDir, "examples", `${name}.yaml`);
let helm = "";
const render = (files: string[] = [], set: string[] = []) => renderChart(helm, files, set);
const manifests = (files: string[] = [], set: string[] = []): Manifest[] => manifestsOf(helm, files, set);
let promtool = "";
let exported = new Map<string, string>();

beforeAll(async () => {
  helm = helmBinary();
  promtool = spawnSync("bash", ["-c", "command -v promtool"], { encoding: "utf8" }).stdout.trim();
  exported = await exportedMetrics();
}, 1_200_000);

const containers = (ms: Manifest[]) =>
  ms.filter((m) => m.kind === "Deployment").flatMap((d) => d.spec.template.spec.containers.map((c: Manifest) => ({ pod: d.metadata.name, c })));

/** promtool with these arguments, in the chart folder; fails the test when it is missing. */
function runPromtool(args: string[]): string {
  expect(promtool, "promtool is missing: apt-get install -y prometheus (scripts/setup.sh installs it)").not.toBe("");
  const r = spawnSync(promtool, args, { encoding: "utf8", cwd: chartDir });
  expect(r.status, `promtool ${args.join(" ")}\n${r.stdout}${r.stderr}`).toBe(0);
  return r.stdout;
}

const recorded = () => new Set(ruleGroups().flatMap((g) => g.rules.flatMap((r) => (r.record ? [r.record] : []))));

describe("the parts' exported metrics", () => {
  test("are read from the registries: gateway, worker, relay and picker (each with the prom-client defaults)", () => {
    for (const [name, part] of [
      ["airm_tpot_p90_ms", "gateway"],
      ["airm_tpot_seconds_bucket", "gateway"],
      ["airm_ttft_seconds_count", "gateway"],
      ["airm_endpoint_healthy", "gateway"],
      ["airm_endpoint_circuit_state", "gateway"],
      ["airm_gateway_requests_total", "gateway"],
      ["airm_worker_decode_batch_size_bucket", "worker"],
      ["airm_kv_leases_outstanding", "worker"],
      ["process_start_time_seconds", "gateway, worker, kv-relay, epp"],
      ["airm_kv_relay_frames_rejected_total", "kv-relay"],
      ["airm_epp_immediate_responses_total", "epp"],
    ]) {
      expect(exported.get(name), name).toBe(part);
    }
    expect(exported.get("vllm:num_requests_waiting")).toBe("gateway, worker");
  });

  test("the metric check finds names no part exports, in selectors, ranges, functions and __name__ regexes", () => {
    const q = (expr: string, needs: string | null = null) => ({ where: "x", expr, needs });
    expect(metricNames('sum by (pod, le) (rate(airm_worker_kv_push_ms_bucket{pod=~"$pod"}[$__rate_interval]))')).toEqual(["airm_worker_kv_push_ms_bucket"]);
    expect(metricNames('label_replace(vllm:num_requests_waiting{namespace="a"}, "role", "gateway", "role", "") > bool 1e-3')).toEqual(["vllm:num_requests_waiting"]);
    expect(unknownMetrics(q("histogram_quantile(0.99, sum by (le) (rate(airm_queue_seconds_bucket[5m])))"), exported, new Set())).toEqual(["airm_queue_seconds_bucket"]);
    expect(unknownMetrics(q('histogram_quantile(0.99, sum by (le) (rate(airm_tpot_seconds_bucket{le="0.15"}[5m])))'), exported, new Set())).toEqual([]);
    expect(unknownMetrics(q("airm_tok_s / on (pod) group_left kv_bytes_total"), exported, new Set())).toEqual(["kv_bytes_total"]);
    expect(unknownMetrics(q('count({__name__=~"airm_breaker_.*"})'), exported, new Set())).toEqual(["~airm_breaker_.*"]);
    expect(unknownMetrics(q("increase(kube_pod_container_status_restarts_total[1h])"), exported, new Set())).toEqual(["kube_pod_container_status_restarts_total"]);
    expect(unknownMetrics(q("increase(kube_pod_container_status_restarts_total[1h])", "kube-state-metrics"), exported, new Set())).toEqual([]);
    expect(unknownMetrics(q("1 - ns:x:ratio_5m"), exported, new Set(["ns:x:ratio_5m"]))).toEqual([]);
  });
});

describe("Grafana dashboard", () => {
  const dashboard = JSON.parse(readFileSync(dashboardFile, "utf8"));
  const panels = dashboard.panels.filter((p: Manifest) => p.type !== "row");
  /** Grafana's data source variable, as every panel and target names it. */
  // biome-ignore lint/suspicious/noTemplateCurlyInString: Grafana's variable syntax, not a template
  const DATASOURCE = { type: "prometheus", uid: "${datasource}" };

  test("names only metrics the parts export (kube-state-metrics only in a panel marked as needing it)", () => {
    const queries = dashboardQueries(dashboard);
    expect(queries.length).toBeGreaterThan(20);
    const rec = recorded();
    expect(queries.flatMap((q) => unknownMetrics(q, exported, rec).map((n) => `${q.where}: ${n}`))).toEqual([]);
    // The external metric is used, and only where its panel says so.
    expect(queries.filter((q) => metricNames(q.expr).some((n) => n in EXTERNAL_METRICS)).map((q) => q.needs)).toEqual(["kube-state-metrics"]);
  });

  test("has the panels operators asked for, on a datasource variable and namespace/pod filters", () => {
    const titles = panels.map((p: Manifest) => p.title);
    for (const want of [
      /TTFT p50, p90, p99/,
      /TPOT p50, p90, p99/,
      /SLO: share of requests within TPOT 150 ms/,
      /tokens\/s/,
      /KV transfer time by transport/,
      /Queue depth/,
      /Decode batch size/,
      /KV leases outstanding/,
      /429s/,
      /Part restarts/,
      /Circuit breakers/,
      /Endpoint health/,
      /Container restarts \(needs kube-state-metrics\)/,
      /Migrations/,
      /KV transfer errors/,
    ]) {
      expect(
        titles.some((t: string) => want.test(t)),
        `${want}`,
      ).toBe(true);
    }
    const vars = Object.fromEntries(dashboard.templating.list.map((v: Manifest) => [v.name, v]));
    expect(vars.datasource).toMatchObject({ type: "datasource", query: "prometheus" });
    expect(vars.namespace.type).toBe("query");
    expect(vars.pod.type).toBe("query");
    const ids = dashboard.panels.map((p: Manifest) => p.id);
    expect(new Set(ids).size).toBe(ids.length);
    for (const p of panels) {
      expect(p.datasource, p.title).toEqual(DATASOURCE);
      expect(p.description, p.title).toBeTruthy();
      for (const t of p.targets) {
        expect(t.datasource, p.title).toEqual(DATASOURCE);
        // Every selector is filtered by the namespace and pod variables.
        const selectors = [...t.expr.matchAll(/[a-zA-Z_:][\w:]*\{([^}]*)\}/g)];
        expect(selectors.length, t.expr).toBeGreaterThan(0);
        for (const [, matchers] of selectors) expect(matchers, t.expr).toContain('namespace=~"$namespace", pod=~"$pod"');
      }
    }
  });

  test("every query parses (promtool, with the Grafana variables filled in)", () => {
    const fill = (e: string) => e.replaceAll("$__rate_interval", "5m").replaceAll("$__range", "3h").replaceAll("$namespace", ".*").replaceAll("$pod", ".*");
    const rules = dashboardQueries(dashboard).map((q, i) => ({ record: `dashboard:query_${i}`, expr: fill(q.expr) }));
    const file = join(mkdtempSync(join(tmpdir(), "airm-dashboard-")), "queries.yaml");
    writeFileSync(file, stringify({ groups: [{ name: "dashboard", rules }] }));
    runPromtool(["check", "rules", file]);
  });

  test("ships as a ConfigMap by default, with the Grafana sidecar's label (configurable), holding the file as is", () => {
    const cm = manifests().find((m) => m.kind === "ConfigMap");
    expect(cm.metadata.name).toBe("rngd-pd-dashboard");
    expect(cm.metadata.labels.grafana_dashboard).toBe("1");
    expect(cm.metadata.namespace).toBeUndefined();
    expect(JSON.parse(cm.data["rngd-pd.json"])).toEqual(dashboard);
    const custom = manifests(
      [],
      ["dashboards.label=grafana.com/dashboard", "dashboards.labelValue=rngd", "dashboards.namespace=monitoring", "dashboards.annotations.grafana_folder=LLM serving"],
    ).find((m) => m.kind === "ConfigMap");
    expect(custom.metadata.namespace).toBe("monitoring");
    expect(custom.metadata.labels["grafana.com/dashboard"]).toBe("rngd");
    expect(custom.metadata.labels.grafana_dashboard).toBeUndefined();
    expect(custom.metadata.annotations).toEqual({ grafana_folder: "LLM serving" });
    expect(manifests([], ["dashboards.enabled=false"]).some((m) => m.kind === "ConfigMap")).toBe(false);
    const bad = render([], ["dashboards.label=bad key"]);
    expect(bad.ok).toBe(false);
    expect(bad.err).toContain("/dashboards/label");
  });
});

describe("Prometheus rules", () => {
  test("off by default; with rules.enabled a PrometheusRule whose spec is rules/rngd-pd.rules.yaml", () => {
    for (const files of [[], [example("tcp")], [example("llm-d-sidecar")]]) {
      expect(manifests(files).some((m) => m.apiVersion?.startsWith("monitoring.coreos.com/"))).toBe(false);
    }
    const rule = manifests([], ["rules.enabled=true", "rules.labels.release=kube-prometheus-stack", "rules.namespace=monitoring"]).find((m) => m.kind === "PrometheusRule");
    expect(rule.apiVersion).toBe("monitoring.coreos.com/v1");
    expect(rule.metadata).toMatchObject({ name: "rngd-pd", namespace: "monitoring" });
    expect(rule.metadata.labels.release).toBe("kube-prometheus-stack");
    expect(rule.spec).toEqual(parse(readFileSync(rulesFile, "utf8")));
  });

  test("name only metrics the parts export, or series the rules record", () => {
    const rec = recorded();
    const queries = ruleQueries();
    expect(queries.flatMap((q) => unknownMetrics(q, exported, rec).map((n) => `${q.where}: ${n}`))).toEqual([]);
    expect(queries.map((q) => q.where)).toEqual([
      "record namespace:airm_tpot_within_150ms:ratio_rate5m",
      "record namespace:airm_tpot_within_150ms:ratio_rate30m",
      "record namespace:airm_tpot_within_150ms:ratio_rate1h",
      "record namespace:airm_tpot_within_150ms:ratio_rate6h",
      "alert RngdPdTpotSloFastBurn",
      "alert RngdPdTpotSloSlowBurn",
      "alert RngdPdKvTransferErrors",
      "alert RngdPdKvRelayRejects",
      "alert RngdPdKvLeasesStuck",
      "alert RngdPdKvLeasesExpiring",
      "alert RngdPdPartRestarted",
      "alert RngdPdCircuitOpen",
    ]);
  });

  test('the TPOT SLO reads the bucket le="0.15" of airm_tpot_seconds, a boundary of the gateway\'s LATENCY_BUCKETS', () => {
    expect(LATENCY_BUCKETS).toContain(0.15);
    const slo = ruleQueries().filter((q) => q.where.startsWith("record namespace:airm_tpot_within_150ms:ratio_rate"));
    expect(slo.map((q) => q.where.split("ratio_rate")[1])).toEqual(["5m", "30m", "1h", "6h"]);
    for (const q of slo) {
      const w = q.where.split("ratio_rate")[1];
      expect(q.expr).toBe(`sum by (namespace) (rate(airm_tpot_seconds_bucket{le="0.15"}[${w}])) / sum by (namespace) (rate(airm_tpot_seconds_count[${w}]))`);
    }
  });

  test("promtool check rules and promtool test rules pass", () => {
    expect(runPromtool(["check", "rules", rulesFile])).toContain("SUCCESS: 12 rules found");
    expect(runPromtool(["test", "rules", rulesTestFile])).toContain("SUCCESS");
  }, 60_000); // promtool evaluates hours of fixture series: ~2 s idle, several on a loaded machine

  test("the promtool tests cover every alert firing and not firing, and every SLO ratio by value", () => {
    const tests = parse(readFileSync(rulesTestFile, "utf8"));
    expect(tests.rule_files).toEqual(["../rules/rngd-pd.rules.yaml"]);
    const cases = tests.tests.flatMap((t: Manifest) => t.alert_rule_test ?? []);
    for (const q of ruleQueries()) {
      const [kind, name] = q.where.split(" ");
      if (kind === "alert") {
        const mine = cases.filter((c: Manifest) => c.alertname === name);
        expect(
          mine.some((c: Manifest) => c.exp_alerts.length > 0),
          `${name} fires in a test`,
        ).toBe(true);
        expect(
          mine.some((c: Manifest) => c.exp_alerts.length === 0),
          `${name} stays quiet in a test`,
        ).toBe(true);
      } else if (name.includes("ratio")) {
        const exprs = tests.tests.flatMap((t: Manifest) => (t.promql_expr_test ?? []).map((e: Manifest) => e.expr));
        expect(exprs, name).toContain(name);
      }
    }
  });
});

describe("PodMonitor", () => {
  test("off by default; on, it scrapes the release's pods on every port that serves /metrics", () => {
    for (const files of [[], [example("tcp")], [example("llm-d-sidecar")]]) {
      const ms = manifests(files, ["podMonitor.enabled=true", "podMonitor.interval=15s", "podMonitor.labels.release=kps", "epp.enabled=true"]);
      const pm = ms.find((m) => m.kind === "PodMonitor");
      expect(pm.apiVersion).toBe("monitoring.coreos.com/v1");
      expect(pm.metadata.labels.release).toBe("kps");
      expect(pm.spec.selector.matchLabels).toEqual({ "app.kubernetes.io/name": "rngd-pd", "app.kubernetes.io/instance": "rngd-pd" });
      expect(pm.spec.namespaceSelector).toEqual({ matchNames: ["serving"] });
      const ports = pm.spec.podMetricsEndpoints.map((e: Manifest) => e.port);
      expect(ports).toEqual(["metrics", "prefill", "decode"]);
      for (const e of pm.spec.podMetricsEndpoints) {
        expect(e).toMatchObject({ path: "/metrics", interval: "15s" });
        expect(e.relabelings).toEqual([{ sourceLabels: ["__meta_kubernetes_pod_label_app_kubernetes_io_component"], targetLabel: "component" }]);
      }
      // Every Deployment is selected, and every part's metrics port is one the monitor scrapes.
      for (const d of ms.filter((m) => m.kind === "Deployment")) {
        for (const [k, v] of Object.entries(pm.spec.selector.matchLabels)) expect(d.spec.template.metadata.labels[k]).toBe(v);
        for (const c of d.spec.template.spec.containers) {
          if (c.name === "nixl-agent") continue;
          expect(
            (c.ports ?? []).some((p: Manifest) => ports.includes(p.name)),
            `${d.metadata.name}/${c.name}`,
          ).toBe(true);
        }
      }
    }
  });
});

describe("tracing", () => {
  const on = ["tracing.enabled=true", "tracing.otlpEndpoint=http://otel-collector.observability:4318"];

  test("off by default: no OTEL_* variable anywhere", () => {
    for (const files of [[], [example("tcp")], [example("llm-d-sidecar")], [example("nixl")]]) {
      for (const { c } of containers(manifests(files))) expect((c.env ?? []).filter((e: Manifest) => e.name.startsWith("OTEL_"))).toEqual([]);
    }
  });

  test("on: the gateway and worker containers (and nothing else) get the OTEL_* variables, the pod's name and namespace from the downward API", () => {
    const declared = declaredVariables();
    for (const files of [[], [example("tcp")], [example("llm-d-sidecar")], [example("nixl")]]) {
      const ms = manifests(files, [...on, "epp.enabled=true", "tracing.resourceAttributes.deployment\\.environment\\.name=prod eu"]);
      for (const { pod, c } of containers(ms)) {
        const names = (c.env ?? []).map((e: Manifest) => e.name);
        expect(new Set(names).size, `${pod}/${c.name}: ${names}`).toBe(names.length);
        const env = Object.fromEntries((c.env ?? []).map((e: Manifest) => [e.name, e.value ?? e.valueFrom]));
        const service = c.name === "gateway" ? "airm-gateway" : ["prefill", "decode"].includes(c.name) ? "airm-worker" : null;
        if (!service) {
          expect(
            names.filter((n: string) => n.startsWith("OTEL_")),
            `${pod}/${c.name}`,
          ).toEqual([]);
          continue;
        }
        expect(env).toMatchObject({
          OTEL_EXPORTER_OTLP_ENDPOINT: "http://otel-collector.observability:4318",
          OTEL_EXPORTER_OTLP_PROTOCOL: "http/protobuf",
          OTEL_TRACES_SAMPLER: "parentbased_always_on",
          OTEL_SERVICE_NAME: service,
          POD_NAME: { fieldRef: { fieldPath: "metadata.name" } },
          POD_NAMESPACE: { fieldRef: { fieldPath: "metadata.namespace" } },
        });
        expect(env.OTEL_TRACES_SAMPLER_ARG).toBeUndefined();
        expect(env.OTEL_RESOURCE_ATTRIBUTES).toBe(
          `k8s.pod.name=$(POD_NAME),k8s.namespace.name=$(POD_NAMESPACE),k8s.container.name=${c.name},deployment.environment.name=prod%20eu`,
        );
        // $(VAR) expands only variables defined earlier in the list.
        const at = (n: string) => names.indexOf(n);
        expect(at("POD_NAME")).toBeLessThan(at("OTEL_RESOURCE_ATTRIBUTES"));
        expect(at("POD_NAMESPACE")).toBeLessThan(at("OTEL_RESOURCE_ATTRIBUTES"));
        // Every variable is one the code declares but POD_NAME, read only by that expansion.
        expect(names.filter((n: string) => !declared.has(n) && n !== "POD_NAME")).toEqual([]);
      }
    }
  });

  test("the sampler argument is set only when given, and only for a ratio sampler; the endpoint is required", () => {
    const ms = manifests([], [...on, "tracing.sampler=parentbased_traceidratio", "tracing.samplerArg=0.25", "tracing.protocol=grpc"]);
    for (const { c } of containers(ms)) {
      const env = Object.fromEntries((c.env ?? []).map((e: Manifest) => [e.name, e.value]));
      expect([env.OTEL_TRACES_SAMPLER, env.OTEL_TRACES_SAMPLER_ARG, env.OTEL_EXPORTER_OTLP_PROTOCOL]).toEqual(["parentbased_traceidratio", "0.25", "grpc"]);
    }
    const cases: [string[], RegExp][] = [
      [["tracing.enabled=true"], /tracing.otlpEndpoint is required/],
      [[...on, "tracing.samplerArg=0.5"], /tracing.samplerArg is read by the traceidratio and parentbased_traceidratio samplers only/],
      [[...on, "tracing.samplerArg=2"], /\/tracing\/samplerArg/],
      [[...on, "tracing.protocol=thrift"], /\/tracing\/protocol/],
      [[...on, "tracing.sampler=sometimes"], /\/tracing\/sampler/],
      [["tracing.otlpEndpoint=otel:4318"], /\/tracing\/otlpEndpoint/],
    ];
    for (const [set, message] of cases) {
      const r = render([], set);
      expect(r.ok, set.join(" ")).toBe(false);
      expect(r.err).toMatch(message);
    }
  });
});
