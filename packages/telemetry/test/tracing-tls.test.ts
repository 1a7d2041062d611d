// OTLP trace export over TLS to a real OpenTelemetry Collector (scripts/otel/build-collector.sh,
// built once per version like the e2e collector test's) whose grpc and http receivers serve TLS and
// require a client certificate issued by the test CA (client_ca_file), with real certificates made
// by openssl (rm-core's createCa / issueLeaf). Spans are read back from the collector's file
// output. With AIRM_TLS_DIR alone a part's spans get in over grpc, http/protobuf and http/json;
// a client without a certificate, or with one of another CA, is refused at the handshake: no span
// gets in, the failure is logged and the process carries on; the OTEL_EXPORTER_OTLP_* variables
// work without AIRM_TLS_DIR and win over it; a plain http:// endpoint is unchanged; a bad file
// stops start-up naming the variable and the file.
import { spawn } from "node:child_process";
import { copyFileSync, mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { ConfigError, createCa, issueLeaf, TLS_FILES } from "@airm/rm-core";
import { context, propagation, trace } from "@opentelemetry/api";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { type Collector, startCollector } from "../../../scripts/otel/collector.ts";
import { exportPlan, startTracing, type TracingLog } from "../src/index.ts";

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
const repo = join(import.meta.dirname, "..", "..", "..");

/** A logger that keeps what tracing logs. */
function captureLog() {
  const lines: { level: "info" | "warn"; fields: Record<string, unknown>; msg: string }[] = [];
  const log: TracingLog = {
    info: (fields, msg) => lines.push({ level: "info", fields, msg }),
    warn: (fields, msg) => lines.push({ level: "warn", fields, msg }),
  };
  return { lines, log };
}

/**
 * Starts tracing with `env`, ends one span named `name`, flushes and stops. Resolves with the
 * span's trace id, the start-up description, the flush's error (undefined when it got through)
 * and what was logged. The global API is reset after, so the next call registers anew.
 */
async function exportOne(env: Record<string, string>, name: string) {
  const { lines, log } = captureLog();
  const t = await startTracing({ service: "airm-tls-test", env: { OTEL_EXPORTER_OTLP_TIMEOUT: "3000", ...env }, log });
  try {
    const span = trace.getTracer("tls-test").startSpan(name, { attributes: { "airm.case": name } });
    span.end();
    const flushError = await t.forceFlush().then(
      () => undefined,
      (e: unknown) => e ?? new Error("flush failed"),
    );
    return { traceId: span.spanContext().traceId, description: t.description, flushError, lines };
  } finally {
    await t.shutdown().catch(() => {});
    trace.disable();
    context.disable();
    propagation.disable();
  }
}

let root: string;
/** The folder the collector serves with (a certificate of the deployment's CA for 127.0.0.1 only: not localhost). */
let server: string;
/** A part's AIRM_TLS_DIR: a certificate of the same CA. */
let part: string;
/** Another certificate of the same CA, given by the OTEL_EXPORTER_OTLP_* variables. */
let client: string;
/** A folder of another CA (its own ca.crt): a part of another deployment. */
let foreign: string;
/** The settings of a client that trusts the collector but presents the certificate of another CA: only the collector can refuse it. */
let foreignClient: Record<string, string>;
let col: Collector;

beforeAll(async () => {
  root = mkdtempSync(join(tmpdir(), "airm-otlp-tls-"));
  const ca = createCa(join(root, "ca"), "airm test CA");
  server = issueLeaf(ca, join(root, "server"), { cn: "otel-collector", hosts: ["127.0.0.1"] });
  part = issueLeaf(ca, join(root, "part"), { cn: "airm-part" });
  client = issueLeaf(ca, join(root, "client"), { cn: "airm-explicit-client" });
  foreign = issueLeaf(createCa(join(root, "other-ca"), "another CA"), join(root, "foreign"), { cn: "intruder" });
  foreignClient = {
    OTEL_EXPORTER_OTLP_CERTIFICATE: join(part, TLS_FILES.ca),
    OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE: join(foreign, TLS_FILES.cert),
    OTEL_EXPORTER_OTLP_CLIENT_KEY: join(foreign, TLS_FILES.key),
  };
  // The collector is built once per version (CI builds it before the tests; cold ~6 min on 2 cores).
  col = await startCollector({ tls: server });
}, 600_000);

afterAll(async () => {
  await col?.stop();
  if (root) rmSync(root, { recursive: true, force: true });
});

/** The spans of `traceId` the collector has written, waiting up to `ms` for the first. */
async function arrived(traceId: string, ms = 10_000) {
  for (let waited = 0; ; waited += 100) {
    const got = col.spans().filter((s) => s.traceId === traceId);
    if (got.length || waited >= ms) return got;
    await sleep(100);
  }
}

const file = (dir: string, name: string) => join(dir, name);

describe("OTLP export to a collector that requires client certificates", () => {
  it.each([
    ["grpc", () => col.grpc],
    ["http/protobuf", () => col.http],
    ["http/json", () => col.http],
  ] as const)("AIRM_TLS_DIR alone: spans get in over %s (ca.crt verifies the collector, tls.crt is presented)", async (protocol, endpoint) => {
    const r = await exportOne({ AIRM_TLS_DIR: part, OTEL_EXPORTER_OTLP_ENDPOINT: endpoint(), OTEL_EXPORTER_OTLP_PROTOCOL: protocol }, `tls.dir.${protocol}`);
    expect(r.flushError).toBeUndefined();
    expect(r.description).toContain(`TLS: CA ${file(part, "ca.crt")} (AIRM_TLS_DIR), client certificate ${file(part, "tls.crt")} (AIRM_TLS_DIR)`);
    const spans = await arrived(r.traceId);
    expect(spans.map((s) => [s.name, s.service, s.attrs["airm.case"]])).toEqual([[`tls.dir.${protocol}`, "airm-tls-test", `tls.dir.${protocol}`]]);
    expect(r.lines.filter((l) => l.level === "warn")).toEqual([]);
  });

  it.each([
    ["grpc", () => col.grpc],
    ["http/protobuf", () => col.http],
  ] as const)("a client without a certificate gets nothing in over %s: the failure is logged, the process goes on", async (protocol, endpoint) => {
    // It trusts the collector (the CA file), but presents no certificate.
    const r = await exportOne(
      { OTEL_EXPORTER_OTLP_CERTIFICATE: file(part, "ca.crt"), OTEL_EXPORTER_OTLP_ENDPOINT: endpoint(), OTEL_EXPORTER_OTLP_PROTOCOL: protocol },
      `tls.nocert.${protocol}`,
    );
    expect(r.description).toContain("client certificate none");
    expect(r.flushError).toBeDefined();
    const warned = r.lines.filter((l) => l.level === "warn");
    expect(warned.length, JSON.stringify(r.lines)).toBe(1);
    expect(warned[0].msg).toMatch(/^trace export failed, spans dropped: /);
    expect(warned[0].fields).toMatchObject({ url: protocol === "grpc" ? endpoint() : `${endpoint()}/v1/traces`, protocol, dropped_spans: 1, failed_exports: 1 });
    // The collector asked for a certificate and got none (TLS 1.3: its alert after the client's side of the handshake).
    expect(warned[0].msg).toMatch(/certificate required/);
    expect(warned[0].msg).toContain("(a TLS failure: the collector refused this client's certificate, or this client the collector's; see docs/tls.md)");
    await sleep(500);
    expect(await arrived(r.traceId, 0)).toEqual([]);
  });

  it.each([
    ["grpc", () => col.grpc],
    ["http/protobuf", () => col.http],
  ] as const)("a client whose certificate another CA issued gets nothing in over %s", async (protocol, endpoint) => {
    const r = await exportOne({ ...foreignClient, OTEL_EXPORTER_OTLP_ENDPOINT: endpoint(), OTEL_EXPORTER_OTLP_PROTOCOL: protocol }, `tls.foreign.${protocol}`);
    expect(r.flushError).toBeDefined();
    expect(r.lines.filter((l) => l.level === "warn").map((l) => l.msg)).toEqual([expect.stringMatching(/^trace export failed, spans dropped: /)]);
    expect(r.lines.find((l) => l.level === "warn")!.msg).toMatch(/alert unknown ca.*a TLS failure/);
    await sleep(500);
    expect(await arrived(r.traceId, 0)).toEqual([]);
    // The collector refused it at the handshake, for want of a certificate it can verify.
    expect(col.log()).toMatch(/certificate|tls:/i);
  });

  it("a refused export in a real process: logged on stderr as a JSON line, exit code 0", async () => {
    const child = spawn(process.execPath, ["--import", "tsx", join(import.meta.dirname, "fixtures", "export-once.ts")], {
      cwd: repo,
      env: {
        PATH: process.env.PATH,
        ...foreignClient,
        OTEL_EXPORTER_OTLP_ENDPOINT: col.grpc,
        OTEL_EXPORTER_OTLP_PROTOCOL: "grpc",
        OTEL_EXPORTER_OTLP_TIMEOUT: "3000",
      },
      stdio: ["ignore", "pipe", "pipe"],
    });
    let out = "";
    let err = "";
    child.stdout!.on("data", (d) => (out += d));
    child.stderr!.on("data", (d) => (err += d));
    const code = await new Promise<number | null>((r) => child.once("exit", r));
    expect(code, err).toBe(0);
    const result = JSON.parse(out.trim().split("\n").pop()!);
    expect(result.flushed).toBe(false);
    const lines = err
      .split("\n")
      .filter((l) => l.startsWith("{"))
      .map((l) => JSON.parse(l));
    const warn = lines.find((l) => l.level === 40);
    expect(warn, err).toMatchObject({ name: "airm-telemetry", url: col.grpc, protocol: "grpc", dropped_spans: 1 });
    expect(warn.msg).toMatch(/^trace export failed, spans dropped: 14 UNAVAILABLE: .*Last error: tlsv1 alert unknown ca \(a TLS failure/);
    await sleep(500);
    expect(await arrived(result.traceId, 0)).toEqual([]);
  });

  it.each([
    ["grpc", () => col.grpc],
    ["http/protobuf", () => col.http],
  ] as const)("the OTEL_EXPORTER_OTLP_* variables without AIRM_TLS_DIR: spans get in over %s", async (protocol, endpoint) => {
    const r = await exportOne(
      {
        OTEL_EXPORTER_OTLP_CERTIFICATE: file(client, "ca.crt"),
        OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE: file(client, "tls.crt"),
        OTEL_EXPORTER_OTLP_CLIENT_KEY: file(client, "tls.key"),
        OTEL_EXPORTER_OTLP_TRACES_ENDPOINT: protocol === "grpc" ? endpoint() : `${endpoint()}/v1/traces`,
        OTEL_EXPORTER_OTLP_TRACES_PROTOCOL: protocol,
      },
      `tls.otel.${protocol}`,
    );
    expect(r.flushError).toBeUndefined();
    expect(r.description).toContain(
      `TLS: CA ${file(client, "ca.crt")} (OTEL_EXPORTER_OTLP_CERTIFICATE), client certificate ${file(client, "tls.crt")} (OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE)`,
    );
    expect((await arrived(r.traceId)).map((s) => s.name)).toEqual([`tls.otel.${protocol}`]);
  });

  it("the TRACES_ variables win over the general ones, and the OTEL_* variables over AIRM_TLS_DIR", async () => {
    // AIRM_TLS_DIR (another deployment's: its CA does not verify the collector, which refuses its
    // certificate) and the general variables would fail: the spans only get in because the more
    // specific settings win.
    const r = await exportOne(
      {
        AIRM_TLS_DIR: foreign,
        OTEL_EXPORTER_OTLP_CERTIFICATE: file(foreign, "ca.crt"),
        OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE: file(foreign, "tls.crt"),
        OTEL_EXPORTER_OTLP_CLIENT_KEY: file(foreign, "tls.key"),
        OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE: file(part, "ca.crt"),
        OTEL_EXPORTER_OTLP_TRACES_CLIENT_CERTIFICATE: file(client, "tls.crt"),
        OTEL_EXPORTER_OTLP_TRACES_CLIENT_KEY: file(client, "tls.key"),
        OTEL_EXPORTER_OTLP_ENDPOINT: col.grpc,
        OTEL_EXPORTER_OTLP_PROTOCOL: "grpc",
      },
      "tls.precedence",
    );
    expect(r.flushError).toBeUndefined();
    expect(r.description).toContain(
      `TLS: CA ${file(part, "ca.crt")} (OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE), client certificate ${file(client, "tls.crt")} (OTEL_EXPORTER_OTLP_TRACES_CLIENT_CERTIFICATE)`,
    );
    expect((await arrived(r.traceId)).map((s) => s.name)).toEqual(["tls.precedence"]);
  });

  it("a client refuses a collector that its CA file did not issue", async () => {
    const r = await exportOne(
      {
        OTEL_EXPORTER_OTLP_CERTIFICATE: file(root, "other-ca/ca.crt"),
        OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE: file(part, "tls.crt"),
        OTEL_EXPORTER_OTLP_CLIENT_KEY: file(part, "tls.key"),
        OTEL_EXPORTER_OTLP_ENDPOINT: col.http,
      },
      "tls.untrusted-collector",
    );
    expect(r.flushError).toBeDefined();
    const warn = r.lines.find((l) => l.level === "warn")!;
    expect(warn.msg).toMatch(/trace export failed, spans dropped: .*(certificate|UNABLE_TO_VERIFY)/i);
    expect(warn.msg).toContain("a TLS failure");
    await sleep(500);
    expect(await arrived(r.traceId, 0)).toEqual([]);
  });

  it.each(["grpc", "http/protobuf"] as const)("over %s, a client refuses a collector whose certificate does not name the endpoint's host", async (protocol) => {
    // Same collector, same CA, reached as localhost: its certificate names only 127.0.0.1.
    const endpoint = (protocol === "grpc" ? col.grpc : col.http).replace("127.0.0.1", "localhost");
    const r = await exportOne({ AIRM_TLS_DIR: part, OTEL_EXPORTER_OTLP_ENDPOINT: endpoint, OTEL_EXPORTER_OTLP_PROTOCOL: protocol }, `tls.hostname.${protocol}`);
    expect(r.flushError).toBeDefined();
    const warn = r.lines.find((l) => l.level === "warn")!;
    expect(warn.msg).toMatch(/trace export failed, spans dropped: .*(ERR_TLS_CERT_ALTNAME_INVALID|does not match certificate's altnames)/);
    await sleep(500);
    expect(await arrived(r.traceId, 0)).toEqual([]);
  });
});

describe("a plain http:// endpoint", () => {
  let plain: Collector;
  beforeAll(async () => {
    plain = await startCollector();
  }, 600_000);
  afterAll(() => plain?.stop());

  it("is unchanged by AIRM_TLS_DIR: nothing read, spans go in plaintext over grpc and http/protobuf", async () => {
    // A folder that does not exist: it is not even looked at.
    const env = { AIRM_TLS_DIR: join(root, "nowhere") };
    for (const [protocol, endpoint] of [
      ["grpc", plain.grpc],
      ["http/protobuf", plain.http],
    ] as const) {
      const plan = exportPlan({ service: "s", env: { ...env, OTEL_EXPORTER_OTLP_ENDPOINT: endpoint, OTEL_EXPORTER_OTLP_PROTOCOL: protocol } })!;
      expect(plan.tls).toBeUndefined();
      expect(plan.notes).toEqual([]);
      const r = await exportOne({ ...env, OTEL_EXPORTER_OTLP_ENDPOINT: endpoint, OTEL_EXPORTER_OTLP_PROTOCOL: protocol }, `plain.${protocol}`);
      expect(r.flushError).toBeUndefined();
      expect(r.description).not.toContain("TLS");
      let names: string[] = [];
      for (let i = 0; i < 100 && !names.length; i++, await sleep(100))
        names = plain
          .spans()
          .filter((s) => s.traceId === r.traceId)
          .map((s) => s.name);
      expect(names).toEqual([`plain.${protocol}`]);
    }
  });

  it("says at start that certificate variables are ignored with http://", async () => {
    const plan = exportPlan({ service: "s", env: { OTEL_EXPORTER_OTLP_ENDPOINT: "http://c:4318", OTEL_EXPORTER_OTLP_CERTIFICATE: "/nowhere/ca.crt" } })!;
    expect(plan.tls).toBeUndefined();
    expect(plan.notes).toEqual(["OTEL_EXPORTER_OTLP_CERTIFICATE ignored: the endpoint http://c:4318/v1/traces is http://, spans go without TLS (use https:// for TLS)"]);
    const { lines, log } = captureLog();
    const t = await startTracing({ service: "s", env: { OTEL_EXPORTER_OTLP_ENDPOINT: "http://127.0.0.1:9", OTEL_EXPORTER_OTLP_CERTIFICATE: "x.pem" }, log });
    await t.shutdown();
    trace.disable();
    context.disable();
    propagation.disable();
    expect(lines).toEqual([{ level: "warn", fields: { url: "http://127.0.0.1:9/v1/traces" }, msg: expect.stringMatching(/^OTEL_EXPORTER_OTLP_CERTIFICATE ignored/) }]);
  });
});

describe("TLS settings at start", () => {
  const errorOf = (env: Record<string, string>) => {
    try {
      exportPlan({ service: "s", env: { OTEL_EXPORTER_OTLP_ENDPOINT: "https://collector:4318", ...env } });
    } catch (e) {
      return e as ConfigError;
    }
    throw new Error(`no error for ${JSON.stringify(env)}`);
  };

  it("stops on a missing, non-PEM or mismatched file, naming the variable and the file", () => {
    const bad = join(root, "bad");
    mkdirSync(bad, { recursive: true });
    writeFileSync(join(bad, "not-pem.crt"), "hello\n");
    const expired = issueLeaf(createCa(join(root, "ca-expired"), "old CA"), join(root, "expired"), {
      notBefore: new Date(Date.UTC(2020, 0, 1)),
      notAfter: new Date(Date.UTC(2020, 0, 2)),
    });
    const noKey = join(root, "no-key");
    mkdirSync(noKey, { recursive: true });
    copyFileSync(join(part, "tls.crt"), join(noKey, "tls.crt"));
    copyFileSync(join(part, "ca.crt"), join(noKey, "ca.crt"));
    // Another CA's certificate with the deployment's ca.crt: refused at start by loadTlsDir.
    const mixed = join(root, "mixed");
    mkdirSync(mixed, { recursive: true });
    for (const f of ["tls.crt", "tls.key"]) copyFileSync(join(foreign, f), join(mixed, f));
    copyFileSync(join(part, "ca.crt"), join(mixed, "ca.crt"));
    const cases: [Record<string, string>, string, string][] = [
      [{ OTEL_EXPORTER_OTLP_CERTIFICATE: join(bad, "missing.crt") }, "OTEL_EXPORTER_OTLP_CERTIFICATE", `${join(bad, "missing.crt")} is missing`],
      [{ OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE: join(bad, "not-pem.crt") }, "OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE", `${join(bad, "not-pem.crt")} is not PEM`],
      [{ OTEL_EXPORTER_OTLP_CERTIFICATE: file(part, "tls.key") }, "OTEL_EXPORTER_OTLP_CERTIFICATE", `${file(part, "tls.key")} holds no certificate`],
      [
        { OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE: file(part, "tls.crt"), OTEL_EXPORTER_OTLP_CLIENT_KEY: join(bad, "not-pem.crt") },
        "OTEL_EXPORTER_OTLP_CLIENT_KEY",
        `${join(bad, "not-pem.crt")} is not PEM`,
      ],
      [
        { OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE: file(part, "tls.crt"), OTEL_EXPORTER_OTLP_CLIENT_KEY: file(client, "tls.key") },
        "OTEL_EXPORTER_OTLP_CLIENT_KEY",
        `${file(client, "tls.key")} is not the key of ${file(part, "tls.crt")}`,
      ],
      [
        { OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE: file(expired, "tls.crt"), OTEL_EXPORTER_OTLP_CLIENT_KEY: file(expired, "tls.key") },
        "OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE",
        `${file(expired, "tls.crt")} expired on`,
      ],
      [
        { OTEL_EXPORTER_OTLP_TRACES_CLIENT_CERTIFICATE: file(part, "tls.crt") },
        "OTEL_EXPORTER_OTLP_TRACES_CLIENT_KEY",
        "is needed with OTEL_EXPORTER_OTLP_TRACES_CLIENT_CERTIFICATE",
      ],
      [{ OTEL_EXPORTER_OTLP_CLIENT_KEY: file(part, "tls.key") }, "OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE", "is needed with OTEL_EXPORTER_OTLP_CLIENT_KEY"],
      [{ AIRM_TLS_DIR: noKey }, "AIRM_TLS_DIR", `${join(noKey, "tls.key")} is missing`],
      [{ AIRM_TLS_DIR: bad }, "AIRM_TLS_DIR", `${join(bad, "tls.crt")} is missing`],
      [{ AIRM_TLS_DIR: mixed }, "AIRM_TLS_DIR", `${join(mixed, "tls.crt")} (issuer CN=another CA) was not issued by a certificate of ${join(mixed, "ca.crt")}`],
    ];
    for (const [env, variable, text] of cases) {
      const e = errorOf(env);
      expect(e, JSON.stringify(env)).toBeInstanceOf(ConfigError);
      expect(e.message, JSON.stringify(env)).toMatch(new RegExp(`^${variable}: `));
      expect(e.message, JSON.stringify(env)).toContain(text);
    }
  });

  it("reads AIRM_TLS_DIR only for what the OTEL_* variables leave unset", () => {
    // Both the CA and the client pair given: the folder (here a broken one) is not read.
    const plan = exportPlan({
      service: "s",
      env: {
        OTEL_EXPORTER_OTLP_ENDPOINT: "https://collector:4318",
        AIRM_TLS_DIR: join(root, "nowhere"),
        OTEL_EXPORTER_OTLP_CERTIFICATE: file(client, "ca.crt"),
        OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE: file(client, "tls.crt"),
        OTEL_EXPORTER_OTLP_CLIENT_KEY: file(client, "tls.key"),
      },
    })!;
    expect(plan.tls?.certFrom).toBe(`${file(client, "tls.crt")} (OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE)`);
    expect(plan.tls?.cert?.equals(readFileSync(file(client, "tls.crt")))).toBe(true);
    // https:// with nothing set: the system's CAs, no client certificate.
    const bare = exportPlan({ service: "s", env: { OTEL_EXPORTER_OTLP_ENDPOINT: "https://collector:4318" } })!;
    expect(bare.tls).toEqual({ caFrom: "the system's CAs", certFrom: "none" });
  });

  it("says OTEL_EXPORTER_OTLP_INSECURE=true is ignored with an https:// grpc endpoint (the scheme wins)", () => {
    const plan = exportPlan({
      service: "s",
      env: { OTEL_EXPORTER_OTLP_ENDPOINT: "https://collector:4317", OTEL_EXPORTER_OTLP_PROTOCOL: "grpc", OTEL_EXPORTER_OTLP_INSECURE: "true" },
    })!;
    expect(plan.notes).toEqual(["OTEL_EXPORTER_OTLP_INSECURE=true ignored: the endpoint https://collector:4317 is https://, which takes precedence (use http:// for plaintext)"]);
    expect(plan.tls).toBeDefined();
    expect(
      exportPlan({ service: "s", env: { OTEL_EXPORTER_OTLP_ENDPOINT: "http://c:4317", OTEL_EXPORTER_OTLP_PROTOCOL: "grpc", OTEL_EXPORTER_OTLP_INSECURE: "true" } })!.notes,
    ).toEqual([]);
    expect(errorOf({ OTEL_EXPORTER_OTLP_TRACES_INSECURE: "maybe" }).message).toMatch(/^OTEL_EXPORTER_OTLP_TRACES_INSECURE: expected 0 or 1/);
  });
});
