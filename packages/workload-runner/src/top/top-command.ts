// `airm top`: a live console of a running cluster (tui.ts), or with --once one reading printed
// for scripts (--json: the snapshot as JSON). It attaches to the newest `airm up` of this user
// (its state file: up-state.ts), to a gateway's URL, or to the chart's pods in a Kubernetes
// namespace (k8s-source.ts), and reads only what the parts export: /health and /metrics.

import { defineCommand, flagOf, int, loadTlsDir, RM_CORE_CONFIG, switchOf, text, type TlsMaterial, tlsMaterialOf, UsageError } from "@airm/rm-core";
import { firstApiKey } from "../local-cluster.ts";
import { type Http, nodeHttp, takeSample } from "./collect.ts";
import { CHART_SELECTOR, k8sSource, kubeClient } from "./k8s-source.ts";
import { buildSnapshot, type Snapshot, Watch } from "./snapshot.ts";
import { gatewaySource, type Source, upSource } from "./targets.ts";
import { type FoundState, readUpStates, upStateDir } from "./up-state.ts";
import { footerLine, INITIAL_UI } from "./keys.ts";
import { noticeLine, plainText, tableScreen } from "./view.ts";

export const TOP_COMMAND = defineCommand({
  name: "airm top",
  summary: "a live console of a running cluster: its parts, their load and KV, latencies and throughput; drain a worker from it",
  usage: [
    "airm top                      (the newest airm up of this user)",
    "airm top --gateway URL",
    "airm top --k8s NAMESPACE [--selector LABELS]",
    "airm top --once [--json] [...]",
  ],
  flags: {
    gateway: flagOf(text({ label: "url", pattern: /^https?:\/\/[^/\s]+\/?$/, hint: "http://127.0.0.1:8000" }), {
      defaultText: "the gateway of the newest airm up of this user (its state file)",
      doc: "watch the cluster behind this gateway: the workers its /health lists (no logs, no relay unless it is airm up's)",
    }),
    k8s: flagOf(text({ label: "namespace", pattern: /^[a-z0-9]([-a-z0-9]*[a-z0-9])?$/, hint: "a namespace name" }), {
      defaultText: "none",
      doc: "watch the chart's pods in this namespace, found through the API server (KUBECONFIG); their pod IPs must be reachable from here",
    }),
    selector: flagOf(text({ label: "labels" }), {
      default: CHART_SELECTOR,
      doc: "with --k8s: the label selector of the pods (add app.kubernetes.io/instance=RELEASE for one release)",
    }),
    interval: flagOf(int({ min: 200, max: 60_000 }), { default: 1000, doc: "milliseconds between readings (with --once: between the two readings the rates come from)" }),
    once: switchOf({ doc: "take two readings, print one screen (or --json the snapshot) and exit: for scripts, and where stdout is not a terminal" }),
    json: switchOf({ doc: "with --once: print the snapshot as JSON (docs/top.md describes its fields)" }),
  },
  env: [RM_CORE_CONFIG],
  notes:
    "Keys: s sort by the next column (S reverses), / filter by name, role or state, up/down select, l or Enter the part's log lines, d drain the selected worker (y confirms), u resume it, q quit.\nDraining sends POST /internal/drain with the internal token: airm up's (its state file, readable by you only), AIRM_INTERNAL_TOKEN, or with --k8s the Secret the pods read it from; and AIRM_API_KEY's first key when set.\nWithout a terminal on stdout airm top prints nothing but with --once.",
});

export type TopFlags = ReturnType<typeof TOP_COMMAND.parse>["values"];

/** The TLS material for workers that serve mutual TLS: airm up's folder, else AIRM_TLS_DIR. */
function tlsFor(state: FoundState | undefined, env: Record<string, string | undefined>): TlsMaterial | undefined {
  if (state?.state.tlsDir) return loadTlsDir(state.state.tlsDir);
  return tlsMaterialOf(RM_CORE_CONFIG.resolve({ env }).tlsDir);
}

/** An airm up's source, re-reading its state file at every reading. */
function fromState(found: FoundState, dir: string, apiKey: string | undefined, env: Record<string, string | undefined>): Source {
  const read = () => readUpStates(dir).find((s) => s.file === found.file)?.state ?? null;
  return upSource(found, read, { apiKey, tls: tlsFor(found, env) });
}

/** What to watch, from the flags: --k8s, --gateway (airm up's own when it is one), else the newest airm up. */
export function chooseSource(f: TopFlags, env: Record<string, string | undefined>, http: (tls?: TlsMaterial) => Http): Source {
  const apiKey = firstApiKey(env.AIRM_API_KEY);
  const { internalToken } = RM_CORE_CONFIG.resolve({ env });
  if (f.k8s) return k8sSource(f.k8s, kubeClient(), { selector: f.selector, internalToken, apiKey, tls: tlsFor(undefined, env) });
  const dir = upStateDir(env);
  const states = readUpStates(dir);
  if (f.gateway) {
    const url = f.gateway.replace(/\/+$/, "");
    const own = states.find((s) => s.state.gateway === url);
    if (own) return fromState(own, dir, apiKey, env);
    const tls = tlsFor(undefined, env);
    return gatewaySource(url, http(tls).getJson, { apiKey, internalToken, tls });
  }
  if (!states.length) throw new Error(`no airm up of yours is running (no state file in ${dir}); start one, or give --gateway URL or --k8s NAMESPACE`);
  return fromState(states[0], dir, apiKey, env);
}

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

/**
 * Two readings `intervalMs` apart: the snapshot of the second, its rates over the interval, its
 * quantiles and hit shares since the parts started; restarts as the launcher or Kubernetes counts them.
 */
export async function onceSnapshot(source: Source, http: Http, intervalMs: number): Promise<Snapshot> {
  const first = await takeSample(source, http);
  await sleep(intervalMs);
  const second = await takeSample(source, http);
  return buildSnapshot(source.label, second, first, null, (name) => second.parts.find((p) => p.target.name === name)?.target.restarts ?? null);
}

/** The screen --once prints: every part, at `width` columns (no trend yet: the sparklines are blank). */
function onceText(s: Snapshot, width: number): string {
  const trend = new Watch(s.source).trend;
  const footer = footerLine({ ...INITIAL_UI, message: { text: `airm top --once: rates over ${s.intervalS?.toFixed(1) ?? "-"} s`, error: false } });
  const screen = { snapshot: s, trend, sort: INITIAL_UI.sort, reverse: false, filter: "", selected: null, footer, log: null };
  // the title, the cluster's three lines, a notice if any, the header, the rows, the detail and the key bar
  return plainText(tableScreen(screen, width, 1 + 3 + (noticeLine(s) ? 1 : 0) + 1 + s.parts.length + 2));
}

/** Runs `airm top`; resolves with the exit code. */
export async function top(argv: string[], env: Record<string, string | undefined> = process.env): Promise<number> {
  const { values: f, help } = TOP_COMMAND.parse(argv);
  if (help) {
    process.stdout.write(TOP_COMMAND.help());
    return 0;
  }
  if (f.json && !f.once) throw new UsageError("--json goes with --once (the console is for a terminal)");
  if (f.gateway && f.k8s) throw new UsageError("--gateway and --k8s name two clusters: give one");
  if (!f.once && !process.stdout.isTTY) {
    process.stderr.write("airm top: stdout is not a terminal; use --once (or --once --json) for one reading\n");
    return 2;
  }
  const source = chooseSource(f, env, nodeHttp);
  const http = nodeHttp(source.tls);
  if (f.once) {
    const snap = await onceSnapshot(source, http, f.interval);
    process.stdout.write(f.json ? `${JSON.stringify(snap, null, 2)}\n` : `${onceText(snap, process.stdout.columns || 100)}\n`);
    return 0;
  }
  const { runTui } = await import("./tui.ts");
  await runTui(source, http, f.interval);
  return 0;
}
