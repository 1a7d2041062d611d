// The PromQL the chart ships (the Grafana dashboard's panels and variables, the Prometheus rules)
// and the metric names the parts really export, read from their prom-client registries (the
// gateway's with the vllm:* gauges, estimate gauges and endpoint gauges gateway-server.ts adds, the
// worker's, the KV relay's, the endpoint picker's; each with prom-client's default metrics), for test/observability.test.ts and for a rig test that wants
// the queries that must return series.
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { parse } from "yaml";
import { EppMetrics } from "../packages/epp/src/epp-metrics.ts";
import { GatewayMetrics } from "../packages/gateway/src/gateway-metrics.ts";
import { registerVllmGauges } from "../packages/internal-api/src/index.ts";
import { RelayMetrics } from "../packages/kv-relay/src/relay-metrics.ts";
import { WorkerMetrics } from "../packages/worker/src/worker-metrics.ts";
import { root } from "./source-files.ts";

export const chartDir = join(root, "charts", "rngd-pd");
export const dashboardFile = join(chartDir, "dashboards", "rngd-pd.json");
export const rulesFile = join(chartDir, "rules", "rngd-pd.rules.yaml");
export const rulesTestFile = join(chartDir, "test", "rules.test.yaml");

/** Metrics of other exporters a query may name, and the mark its panel must carry. */
export const EXTERNAL_METRICS: Record<string, string> = { kube_pod_container_status_restarts_total: "kube-state-metrics" };

export interface Query {
  /** Where it is: `panel <title>`, `variable <name>`, `record <name>`, `alert <name>`. */
  where: string;
  expr: string;
  /** The external exporter the panel says it needs (its title names it), or null. */
  needs: string | null;
}

/** A part's prom-client registry (prom-client is the parts' dependency, not the repository's). */
type Registry = GatewayMetrics["registry"];

/** Series names a registry exposes: histograms as _bucket, _sum and _count; summaries also bare. */
async function seriesNames(registry: Registry, part: string, into: Map<string, string>): Promise<void> {
  for (const m of await registry.getMetricsAsJSON()) {
    // The typings say an enum; the value is the exposition's type name ("histogram", ...).
    const type = String(m.type);
    const names = type === "histogram" ? [`${m.name}_bucket`, `${m.name}_sum`, `${m.name}_count`] : type === "summary" ? [m.name, `${m.name}_sum`, `${m.name}_count`] : [m.name];
    for (const n of names) into.set(n, into.has(n) ? `${into.get(n)}, ${part}` : part);
  }
}

/** Every series name the parts export, with the parts that export it. */
export async function exportedMetrics(): Promise<Map<string, string>> {
  const out = new Map<string, string>();
  const gateway = new GatewayMetrics();
  gateway.exportEstimates(() => null, false);
  // gateway-server.ts registers the endpoint gauges (airm_endpoint_healthy, _circuit_state) over its pools.
  gateway.exportEndpoints(() => []);
  registerVllmGauges(
    gateway.registry,
    () => ({ waiting: 0, running: 0, kvUsage: 0 }),
    () => null,
  );
  await seriesNames(gateway.registry, "gateway", out);
  const worker = new WorkerMetrics(
    {
      waiting: () => 0,
      running: () => 0,
      kvUsage: () => 0,
      geometry: () => ({ blockSize: 16, numBlocks: 64 }),
      preemptions: () => 0,
      draining: () => false,
      lora: () => undefined,
      leases: () => ({ outstanding: 0, expired: 0 }) as any,
      prefixCache: () => ({
        queriedTokens: 0,
        hitTokens: 0,
        blocks: 0,
        evictions: 0,
        heldPositions: 0,
        kvSkippedBytes: 0,
        kvPulledBytes: 0,
        kvPulls: 0,
        eventBatches: 0,
        events: 0,
      }),
      grammar: () => null,
      estimates: () => ({ prefill: null, kvBandwidth: null, kvBytes: null, localPrefill: false }) as any,
      prefixInfo: () => ({ modelFingerprint: "m", numericsFingerprint: "n", blockSize: 16, instance: "i" }),
    },
    { role: "decode", backend: "atom" },
  );
  await seriesNames(worker.registry, "worker", out);
  const relayStats = { bytesHeld: 0, blobs: 0, poolHeldBytes: 0, poolIdleBytes: 0, maxBytes: 0, connections: 0, crcFailures: 0 };
  const relay = new RelayMetrics({ stats: () => relayStats as any, bytesIn: 0, bytesOut: 0, latePushes: 0, address: "127.0.0.1:0" });
  await seriesNames(relay.registry, "kv-relay", out);
  await seriesNames(new EppMetrics(() => [], 1000).registry, "epp", out);
  return out;
}

/** The dashboard's PromQL: every panel target and the query variables (label_values' selector). */
export function dashboardQueries(dashboard: any = JSON.parse(readFileSync(dashboardFile, "utf8"))): Query[] {
  const out: Query[] = [];
  for (const v of dashboard.templating.list) {
    if (v.type !== "query") continue;
    const q = typeof v.query === "string" ? v.query : v.query.query;
    const inner = /^label_values\((.*),\s*[a-zA-Z_]\w*\)$/.exec(q.trim());
    out.push({ where: `variable ${v.name}`, expr: inner ? inner[1] : q, needs: null });
  }
  for (const p of dashboard.panels) {
    if (p.type === "row") continue;
    const needs = Object.values(EXTERNAL_METRICS).find((x) => p.title.includes(`needs ${x}`)) ?? null;
    for (const t of p.targets ?? []) out.push({ where: `panel ${p.title}`, expr: t.expr, needs });
  }
  return out;
}

/** The rules file's groups (what the PrometheusRule's spec holds). */
export function ruleGroups(text: string = readFileSync(rulesFile, "utf8")): { name: string; rules: { record?: string; alert?: string; expr: string }[] }[] {
  return parse(text).groups;
}

export function ruleQueries(text?: string): Query[] {
  return ruleGroups(text).flatMap((g) => g.rules.map((r) => ({ where: r.record ? `record ${r.record}` : `alert ${r.alert}`, expr: r.expr, needs: null })));
}

const KEYWORDS = new Set(["by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and", "or", "unless", "offset", "inf", "nan"]);

/**
 * The metric names a PromQL expression selects: string literals, label matchers `{...}`, ranges
 * `[...]`, grouping lists (by, on, ...) and Grafana variables are removed, then every identifier
 * that is not a function call, a keyword or a number is a metric name. Names a `__name__` regex
 * matcher selects come back as `~<regex>`.
 */
export function metricNames(expr: string): string[] {
  const regexes = [...expr.matchAll(/__name__\s*=~\s*"((?:[^"\\]|\\.)*)"/g)].map((m) => `~${m[1]}`);
  const bare = expr
    .replace(/"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'|`[^`]*`/g, '""')
    .replace(/\{[^}]*\}/g, " ")
    .replace(/\[[^\]]*\]/g, " ")
    .replace(/\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)/g, " ")
    .replace(/\$\{?\w+\}?/g, " ");
  const names = [...bare.matchAll(/(?<![\w:.])([a-zA-Z_:][\w:]*)(?![\w:])(?!\s*\()/g)].map((m) => m[1]).filter((n) => !KEYWORDS.has(n.toLowerCase()));
  return [...new Set([...names, ...regexes])];
}

/**
 * Names a query selects that no part exports (nor a rule records, nor its panel's external
 * exporter provides), plus names that start like ours (airm_, vllm:, process_) anywhere in the text
 * and are not exported: a second net under the parser.
 */
export function unknownMetrics(q: Query, exported: Map<string, string>, recorded: Set<string>): string[] {
  const known = (n: string) => exported.has(n) || recorded.has(n) || (q.needs !== null && EXTERNAL_METRICS[n] === q.needs);
  const bad = metricNames(q.expr).filter((n) => {
    if (!n.startsWith("~")) return !known(n);
    const re = new RegExp(`^(?:${n.slice(1)})$`);
    return ![...exported.keys()].some((e) => re.test(e));
  });
  const textual = [...q.expr.replace(/"(?:[^"\\]|\\.)*"/g, '""').matchAll(/(?<![\w:])(?:airm_|vllm:|process_)[\w:]*/g)].map((m) => m[0]).filter((n) => !known(n));
  return [...new Set([...bad, ...textual])];
}
