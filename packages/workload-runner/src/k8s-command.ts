// `airm k8s gen-sweep` and `airm k8s render`: the experiment sweep of deploy/k8s. gen-sweep writes
// one Deployment per configuration (KV transport x decode backend x decode batch), each a whole PD
// unit in one pod pinned to ${RNGD_PD_NODE} that runs the repository mounted from
// ${RNGD_PD_HOME}; render fills those two in from the shell, else from cluster.local.env, and
// refuses to print anything while one is missing. Site values never enter the repository.

import { readFileSync } from "node:fs";
import { relative } from "node:path";
import { defineCommand, defineConfig, engineForBackend, flagOf, int, list, opt, text, transportNeeds, UsageError } from "@airm/rm-core";
import { DEFAULT_BACKENDS, ENGINE_DEVICE_RESOURCES, SWEEP_DEFAULTS } from "./defaults.ts";
import { binFrom, pluginRegistry } from "./package-bins.ts";

/** The site's variables render fills in (cluster.local.env, never committed; the shell wins). */
export const SWEEP_SITE_CONFIG = defineConfig("@airm/workload-runner", {
  node: opt(text({ label: "node" }), {
    env: "RNGD_PD_NODE",
    defaultText: "none (required by airm k8s render)",
    doc: "Node the sweep's pods are pinned to (deploy/k8s, cluster.local.env).",
  }),
  home: opt(text({ label: "path" }), {
    env: "RNGD_PD_HOME",
    defaultText: "none (required by airm k8s render)",
    doc: "Home directory on that node holding the installed repository (rngd-pd/) the sweep's pods mount at /app.",
  }),
});

export const K8S_COMMAND = defineCommand({
  name: "airm k8s",
  summary: "the experiment sweep: gen-sweep writes its Deployments, render fills in the site's node and home",
  usage: [
    "airm k8s gen-sweep [--transports shm,tcp] [--decode atom,rngd] [--batch 4,8] [--max-model-len 512] [--model PATH] > deploy/k8s/sweep-matrix.yaml",
    "airm k8s render FILE [--site-env deploy/k8s/cluster.local.env] | kubectl apply -f -",
  ],
  positionals: { min: 1, max: 2 },
  flags: {
    transports: flagOf(list(text({ label: "name" }), /,/), { default: SWEEP_DEFAULTS.transports, doc: "gen-sweep: KV transports (installed ones)" }),
    decode: flagOf(list(text({ label: "backend" }), /,/), { default: SWEEP_DEFAULTS.decode, doc: "gen-sweep: decode backends" }),
    batch: flagOf(list(int({ min: 1, max: 1024 }), /,/), { default: SWEEP_DEFAULTS.batch, doc: "gen-sweep: decode batch widths (--B)" }),
    maxModelLen: flagOf(int({ min: 8 }), { default: 512, doc: "gen-sweep: the longest request served (the ai-rm deployment's context)" }),
    model: flagOf(text({ label: "path" }), { default: "/models/model", doc: "gen-sweep: model path inside the pods" }),
    siteEnv: flagOf(text({ label: "path" }), { default: "deploy/k8s/cluster.local.env", doc: "render: the site's variables (those exported in the shell win)" }),
  },
  env: [SWEEP_SITE_CONFIG],
  notes: "Only the RNGD_PD_NODE and RNGD_PD_HOME placeholders are filled in. Deployments start with replicas 0: scale one up at a time (one card per pod).",
});

/** The placeholder render fills in: ${NAME}. */
const site = (name: "RNGD_PD_NODE" | "RNGD_PD_HOME") => `\${${name}}`;

/** The repository root the pods mount at /app (this package lives in packages/workload-runner). */
const REPO = new URL("../../../", import.meta.url).pathname;

/** The device resource a backend's engine uses in `role`. Throws ConfigError for a backend no engine runs there. */
function deviceOf(backend: string, role: "prefill" | "decode"): string {
  const engine = engineForBackend(backend, role, pluginRegistry(), "backend");
  const device = ENGINE_DEVICE_RESOURCES[engine];
  if (!device) throw new UsageError(`engine ${engine} (backend ${backend}) has no device resource in ENGINE_DEVICE_RESOURCES`);
  return device;
}

function container(name: string, bin: string, args: string[], env: Record<string, string>, device: string | null, memoryDir: string | null): string[] {
  const lines = [
    `        - name: ${name}`,
    "          image: node:20-bookworm-slim",
    `          command: ["node", "/app/${bin}"]`,
    `          args: ${JSON.stringify(args)}`,
    "          env:",
  ];
  for (const [k, v] of Object.entries(env)) lines.push(`            - { name: ${k}, value: ${JSON.stringify(v)} }`);
  if (device) lines.push("          resources:", "            limits:", `              ${device}: 1`);
  lines.push("          volumeMounts:", "            - { name: repo, mountPath: /app, readOnly: true }");
  if (memoryDir) lines.push(`            - { name: kv-memory, mountPath: ${memoryDir} }`);
  return lines;
}

/**
 * One Deployment per (transport, decode backend, batch): prefill, decode and gateway in one pod,
 * plus the sidecar the transport declares (the relay for tcp / nixl-ucx), and a memory-backed
 * folder where it declares a cluster folder (shm). What each transport needs comes from its
 * package's declaration, as for `airm up`.
 */
export function genSweep(o: { transports: string[]; decode: string[]; batch: number[]; maxModelLen: number; model: string }): string {
  const docs: string[] = [];
  const registry = pluginRegistry();
  for (const kv of o.transports) {
    const needs = transportNeeds(kv, registry);
    const env: Record<string, string> = { MODEL: o.model, AIRM_KV_TRANSPORT: kv };
    const memoryDir = needs.clusterDir ? `${needs.clusterDir.under}/${needs.clusterDir.prefix}sweep` : null;
    if (needs.clusterDir && memoryDir) env[needs.clusterDir.env] = memoryDir;
    const s = needs.sidecar;
    const vars = s ? { host: "127.0.0.1", port: String(s.port), addr: `127.0.0.1:${s.port}` } : null;
    const fill = (t: string) => (vars ? t.replace(/\{(host|port|addr)\}/g, (_, k: "host" | "port" | "addr") => vars[k]) : t);
    if (s) for (const [k, v] of Object.entries(s.env)) env[k] = fill(v);
    for (const dec of o.decode) {
      for (const B of o.batch) {
        const name = `rngd-pd-sweep-${kv}-${dec}-b${B}`;
        const worker = (role: "prefill" | "decode", backend: string, port: number, extra: string[] = []) =>
          container(
            role,
            "packages/worker/bin/airm-worker.mjs",
            ["--role", role, "--backend", backend, "--chip", "-1", "--host", "127.0.0.1", "--port", String(port), "--max-model-len", String(o.maxModelLen), ...extra],
            env,
            deviceOf(backend, role),
            memoryDir,
          );
        const lines = [
          "apiVersion: apps/v1",
          "kind: Deployment",
          "metadata:",
          `  name: ${name}`,
          `  labels: { app.kubernetes.io/name: rngd-pd-sweep, airm.ai-computing.io/kv-transport: ${kv}, airm.ai-computing.io/decode: ${dec}, airm.ai-computing.io/batch: "${B}" }`,
          "spec:",
          "  replicas: 0",
          "  strategy: { type: Recreate }",
          `  selector: { matchLabels: { app: ${name} } }`,
          "  template:",
          `    metadata: { labels: { app: ${name} } }`,
          "    spec:",
          `      nodeName: ${site("RNGD_PD_NODE")}`,
          "      containers:",
          ...worker("prefill", DEFAULT_BACKENDS.prefill, 8101),
          ...worker("decode", dec, 8102, ["--B", String(B)]),
          ...container(
            "gateway",
            "packages/gateway/bin/airm-gateway.mjs",
            ["--host", "0.0.0.0", "--port", "8000", "--prefill", "http://127.0.0.1:8101", "--decode", "http://127.0.0.1:8102"],
            { AIRM_METRICS_PORT: "9400" },
            null,
            null,
          ),
        ];
        if (s && needs.dir) {
          const bin = relative(REPO, binFrom(needs.dir, s.package ?? ".", s.bin));
          lines.push(...container(s.name, bin, s.args.map(fill), {}, null, null));
        }
        lines.push("      volumes:", `        - { name: repo, hostPath: { path: ${site("RNGD_PD_HOME")}/rngd-pd, type: Directory } }`);
        if (memoryDir) lines.push("        - { name: kv-memory, emptyDir: { medium: Memory } }");
        docs.push(lines.join("\n"));
      }
    }
  }
  return `# Generated by \`airm k8s gen-sweep\`; fill in the site with \`airm k8s render\`.\n${docs.map((d) => `---\n${d}\n`).join("")}`;
}

/** KEY=VALUE lines (comments and blanks skipped, optional quotes removed). */
export function parseEnvFile(text: string): Record<string, string> {
  const out: Record<string, string> = {};
  for (const raw of text.split("\n")) {
    const line = raw.trim();
    if (!line || line.startsWith("#")) continue;
    const m = /^(?:export\s+)?([A-Za-z_][A-Za-z0-9_]*)=(.*)$/.exec(line);
    if (!m) throw new UsageError(`not a KEY=VALUE line: ${JSON.stringify(line)}`);
    out[m[1]!] = m[2]!.replace(/^(['"])(.*)\1$/, "$2");
  }
  return out;
}

/** Fills in ${RNGD_PD_NODE} and ${RNGD_PD_HOME}; throws naming every one that is unset. */
export function renderSweep(manifest: string, site: Record<string, string | undefined>): string {
  const missing = new Set<string>();
  const out = manifest.replace(/\$\{(RNGD_PD_NODE|RNGD_PD_HOME)\}/g, (_, name: string) => {
    const v = site[name];
    if (!v) missing.add(name);
    return v ?? "";
  });
  if (missing.size) throw new UsageError(`${[...missing].join(" and ")} not set: put them in cluster.local.env (copy deploy/k8s/cluster.example.env) or export them`);
  return out;
}

/** Runs `airm k8s`; resolves with the exit code. */
export async function k8sCommand(argv: string[], env: Record<string, string | undefined> = process.env): Promise<number> {
  const { values: f, positionals, help } = K8S_COMMAND.parse(argv);
  if (help) {
    process.stdout.write(K8S_COMMAND.help());
    return 0;
  }
  const [sub, file] = positionals;
  if (sub === "gen-sweep") {
    process.stdout.write(genSweep({ transports: f.transports, decode: f.decode, batch: f.batch, maxModelLen: f.maxModelLen, model: f.model }));
    return 0;
  }
  if (sub === "render") {
    if (!file) throw new UsageError("render needs the manifest file: airm k8s render deploy/k8s/sweep-matrix.yaml");
    let fromFile: Record<string, string> = {};
    try {
      fromFile = parseEnvFile(readFileSync(f.siteEnv, "utf8"));
    } catch (e) {
      if ((e as NodeJS.ErrnoException).code !== "ENOENT") throw e;
    }
    const site = SWEEP_SITE_CONFIG.resolve({ env: { ...fromFile, ...env } });
    process.stdout.write(renderSweep(readFileSync(file, "utf8"), { RNGD_PD_NODE: site.node, RNGD_PD_HOME: site.home }));
    return 0;
  }
  throw new UsageError(`unknown subcommand ${JSON.stringify(sub)}: gen-sweep or render`);
}
