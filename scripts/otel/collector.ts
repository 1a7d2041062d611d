// A real OpenTelemetry Collector on loopback for the tests and benches: the binary
// build-collector.sh makes (cached by version), started with an OTLP receiver on two free ports
// (gRPC and HTTP) and the file exporter writing each export as one OTLP/JSON line; `spans()`
// reads them back with their resource's service.name and airm.role.
import { type ChildProcess, execFileSync, spawn } from "node:child_process";
import { existsSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { freePort } from "../k8s-rig/rig.ts";

export interface OtlpAttr {
  key: string;
  value: Record<string, unknown>;
}

/** One exported span, its attributes as a record, with its process's service and role. */
export interface ExportedSpan {
  traceId: string;
  spanId: string;
  parentSpanId?: string;
  name: string;
  startTimeUnixNano: string;
  endTimeUnixNano: string;
  attributes?: OtlpAttr[];
  events?: { name: string; attributes?: OtlpAttr[] }[];
  service: string;
  role: string;
  attrs: Record<string, unknown>;
}

export interface Collector {
  /** OTLP/gRPC: http://127.0.0.1:PORT. */
  grpc: string;
  /** OTLP/HTTP base: http://127.0.0.1:PORT (spans go to /v1/traces). */
  http: string;
  spans(): ExportedSpan[];
  /** What the collector logged (its TLS handshake errors among it). */
  log(): string;
  stop(): Promise<void>;
}

/** The collector binary (built on first use: ~6 min cold on 2 cores, needs Go). */
export function collectorBinary(): string {
  const out = execFileSync("bash", [join(import.meta.dirname, "build-collector.sh")], { encoding: "utf8", stdio: ["ignore", "pipe", "inherit"] });
  return out.trim().split("\n").pop()!;
}

/** An OTLP attribute list as a record (OTLP/JSON carries ints as strings). */
export function attrsOf(list: OtlpAttr[] = []): Record<string, unknown> {
  const val = (v: Record<string, unknown>): unknown => {
    if ("intValue" in v) return Number(v.intValue);
    if ("arrayValue" in v) return ((v.arrayValue as { values?: Record<string, unknown>[] }).values ?? []).map(val);
    return Object.values(v)[0];
  };
  return Object.fromEntries(list.map((a) => [a.key, val(a.value)]));
}

/**
 * Starts a collector; resolves once it is ready. With `tls` (a TLS folder: tls.crt, tls.key,
 * ca.crt) both receivers serve TLS with that certificate and require a client certificate of its
 * ca.crt, and the URLs are https.
 */
export async function startCollector(o: { tls?: string } = {}): Promise<Collector> {
  const bin = collectorBinary();
  const dir = mkdtempSync(join(tmpdir(), "airm-otelcol-"));
  const file = join(dir, "spans.jsonl");
  const [grpc, http] = [await freePort(), await freePort()];
  const tls = o.tls ? `, tls: {cert_file: "${join(o.tls, "tls.crt")}", key_file: "${join(o.tls, "tls.key")}", client_ca_file: "${join(o.tls, "ca.crt")}", min_version: "1.2"}` : "";
  writeFileSync(
    join(dir, "config.yaml"),
    [
      "receivers:",
      "  otlp:",
      "    protocols:",
      `      grpc: {endpoint: "127.0.0.1:${grpc}"${tls}}`,
      `      http: {endpoint: "127.0.0.1:${http}"${tls}}`,
      "processors:",
      "  batch: {timeout: 100ms}",
      "exporters:",
      `  file: {path: "${file}", format: json, flush_interval: 100ms}`,
      "service:",
      "  telemetry: {metrics: {level: none}}",
      "  pipelines:",
      "    traces: {receivers: [otlp], processors: [batch], exporters: [file]}",
      "",
    ].join("\n"),
  );
  const child: ChildProcess = spawn(bin, ["--config", join(dir, "config.yaml")], { stdio: ["ignore", "ignore", "pipe"] });
  let log = "";
  child.stderr!.on("data", (d) => (log += d));
  for (let i = 0; !log.includes("Everything is ready"); i++) {
    if (i > 300 || child.exitCode !== null) {
      child.kill("SIGKILL");
      rmSync(dir, { recursive: true, force: true });
      throw new Error(`the collector did not start: ${log.slice(-2000)}`);
    }
    await new Promise((r) => setTimeout(r, 100));
  }
  const scheme = o.tls ? "https" : "http";
  return {
    grpc: `${scheme}://127.0.0.1:${grpc}`,
    http: `${scheme}://127.0.0.1:${http}`,
    log: () => log,
    spans() {
      if (!existsSync(file)) return [];
      const out: ExportedSpan[] = [];
      for (const line of readFileSync(file, "utf8").split("\n")) {
        if (!line.trim()) continue;
        for (const rs of JSON.parse(line).resourceSpans ?? []) {
          const res = attrsOf(rs.resource?.attributes);
          for (const ss of rs.scopeSpans ?? [])
            for (const s of ss.spans ?? []) out.push({ ...s, service: String(res["service.name"]), role: String(res["airm.role"]), attrs: attrsOf(s.attributes) });
        }
      }
      return out;
    },
    async stop() {
      if (child.exitCode === null) {
        child.kill("SIGTERM");
        await new Promise((r) => child.once("exit", r));
      }
      rmSync(dir, { recursive: true, force: true });
    },
  };
}

/** The span tree under `root`, one line per span: its name, process, start (ms after the root's) and length. */
export function spanTree(spans: ExportedSpan[], root: ExportedSpan): string {
  const t0 = BigInt(root.startTimeUnixNano);
  const ms = (ns: bigint) => (Number(ns) / 1e6).toFixed(1);
  const line = (s: ExportedSpan, depth: number): string[] => [
    `${"  ".repeat(depth)}${s.name} [${s.service}${s.role !== "undefined" ? `/${s.role}` : ""}] +${ms(BigInt(s.startTimeUnixNano) - t0)} ms, ${ms(BigInt(s.endTimeUnixNano) - BigInt(s.startTimeUnixNano))} ms`,
    ...spans
      .filter((x) => x.parentSpanId === s.spanId)
      .sort((a, b) => (BigInt(a.startTimeUnixNano) < BigInt(b.startTimeUnixNano) ? -1 : 1))
      .flatMap((x) => line(x, depth + 1)),
  ];
  return line(root, 0).join("\n");
}
