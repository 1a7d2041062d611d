// The TLS of the OTLP export: what verifies the collector and what certificate is presented to it,
// from the specification's OTEL_EXPORTER_OTLP_[TRACES_]{CERTIFICATE,CLIENT_CERTIFICATE,CLIENT_KEY}
// and, for what they leave unset, the deployment's AIRM_TLS_DIR (its ca.crt, tls.crt and tls.key,
// loaded and checked by rm-core's loadTlsDir). Only an https:// endpoint uses TLS: with http://
// nothing is read. Every file is read once, at start; one that is missing, not PEM, or (a client
// certificate) expired or not matching its key is a ConfigError naming the variable and the file.
// Unlike the links between parts, the collector's host name is checked too: it is reached by a
// stable name its certificate can list, as every OpenTelemetry SDK expects.

import { createPrivateKey, X509Certificate } from "node:crypto";
import { readFileSync } from "node:fs";
import { resolve } from "node:path";
import { ConfigError, defineConfig, loadTlsDir, RM_CORE_CONFIG, TLS_FILES, type TlsMaterial } from "@airm/rm-core";
import type { TELEMETRY_CONFIG } from "./telemetry-config.ts";

type Values = ReturnType<typeof TELEMETRY_CONFIG.resolve>;

/** What an https:// export is made with; a field left undefined takes the TLS library's default. */
export interface ExportTls {
  /** CA certificate(s) that verify the collector (undefined: the system's CAs). */
  ca?: Buffer;
  /** The client certificate presented when the collector asks for one (undefined: none). */
  cert?: Buffer;
  /** Its private key. */
  key?: Buffer;
  /** Where the CA came from, for the start-up log: "<file> (<variable>)" or "the system's CAs". */
  caFrom: string;
  /** Where the client certificate came from, or "none". */
  certFrom: string;
}

/** AIRM_TLS_DIR as rm-core declares it (its row stays rm-core's: not repeated in this package's table). */
const TLS_DIR = defineConfig("@airm/rm-core", { tlsDir: RM_CORE_CONFIG.options.tlsDir });

const TLS_DIR_VAR = "AIRM_TLS_DIR";
const PEM_CERT = /-----BEGIN CERTIFICATE-----[\s\S]+?-----END CERTIFICATE-----/g;

/** One setting: the traces variable wins over the general one. */
interface Pick {
  path: string;
  variable: string;
}

function pick(traces: string | undefined, tracesVar: string, general: string | undefined, generalVar: string): Pick | undefined {
  if (traces !== undefined) return { path: traces, variable: tracesVar };
  if (general !== undefined) return { path: general, variable: generalVar };
  return undefined;
}

/** The bytes of a PEM file named by `variable`; a ConfigError naming both when it is missing, unreadable or not PEM. */
function readPem(p: Pick): Buffer {
  const file = resolve(p.path);
  let bytes: Buffer;
  try {
    bytes = readFileSync(file);
  } catch (e) {
    const code = (e as NodeJS.ErrnoException).code;
    throw new ConfigError(p.variable, `${file} ${code === "ENOENT" ? "is missing" : `cannot be read (${(e as Error).message})`}`);
  }
  if (!bytes.includes("-----BEGIN ")) throw new ConfigError(p.variable, `${file} is not PEM (no -----BEGIN line)`);
  return bytes;
}

/** The certificates of a PEM file; a ConfigError when it holds none or one does not parse. */
function certificates(pem: Buffer, p: Pick): X509Certificate[] {
  const blocks = pem.toString("latin1").match(PEM_CERT) ?? [];
  if (!blocks.length) throw new ConfigError(p.variable, `${resolve(p.path)} holds no certificate (-----BEGIN CERTIFICATE-----)`);
  try {
    return blocks.map((b) => new X509Certificate(b));
  } catch (e) {
    throw new ConfigError(p.variable, `${resolve(p.path)} holds a certificate that does not parse: ${(e as Error).message}`);
  }
}

/** Reads and checks an explicit client certificate and key: both PEM, the certificate in force, the key its key. */
function clientPair(certPick: Pick, keyPick: Pick, now: Date): { cert: Buffer; key: Buffer } {
  const cert = readPem(certPick);
  const key = readPem(keyPick);
  const [leaf] = certificates(cert, certPick);
  const certFile = resolve(certPick.path);
  if (now < new Date(leaf.validFrom)) throw new ConfigError(certPick.variable, `${certFile} is not valid before ${leaf.validFrom}`);
  if (now > new Date(leaf.validTo)) throw new ConfigError(certPick.variable, `${certFile} expired on ${leaf.validTo}; the collector would refuse it`);
  let privateKey: ReturnType<typeof createPrivateKey>;
  try {
    privateKey = createPrivateKey(key);
  } catch (e) {
    throw new ConfigError(keyPick.variable, `${resolve(keyPick.path)} is not a private key: ${(e as Error).message}`);
  }
  if (!leaf.checkPrivateKey(privateKey)) throw new ConfigError(keyPick.variable, `${resolve(keyPick.path)} is not the key of ${certFile} (${certPick.variable})`);
  return { cert, key };
}

/**
 * The TLS of an export to `url`: undefined for an http:// endpoint (nothing is read), else the CA
 * and client certificate, each from its OTEL_EXPORTER_OTLP_* variable (the TRACES_ one first) or
 * else from AIRM_TLS_DIR in `env`, or else the defaults (the system's CAs, no client
 * certificate). Throws ConfigError naming the variable and the file at fault.
 */
export function exportTls(url: string, c: Values, env: Record<string, string | undefined>, now = new Date()): ExportTls | undefined {
  if (!url.startsWith("https://")) return undefined;
  const caPick = pick(c.tracesCertificate, "OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE", c.certificate, "OTEL_EXPORTER_OTLP_CERTIFICATE");
  const certPick = pick(c.tracesClientCertificate, "OTEL_EXPORTER_OTLP_TRACES_CLIENT_CERTIFICATE", c.clientCertificate, "OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE");
  const keyPick = pick(c.tracesClientKey, "OTEL_EXPORTER_OTLP_TRACES_CLIENT_KEY", c.clientKey, "OTEL_EXPORTER_OTLP_CLIENT_KEY");
  if (certPick && !keyPick)
    throw new ConfigError(certPick.variable.replace("CERTIFICATE", "KEY"), `is needed with ${certPick.variable}: the private key of ${resolve(certPick.path)}`);
  if (keyPick && !certPick)
    throw new ConfigError(keyPick.variable.replace("KEY", "CERTIFICATE"), `is needed with ${keyPick.variable}: the certificate of ${resolve(keyPick.path)}`);

  // The deployment's folder, loaded (and checked whole) only when it supplies something.
  const { tlsDir } = TLS_DIR.resolve({ env });
  const dir: TlsMaterial | undefined = tlsDir && (!caPick || !certPick) ? loadTlsDir(tlsDir) : undefined;
  const fromDir = (file: string) => `${resolve(dir!.dir, file)} (${TLS_DIR_VAR})`;

  const out: ExportTls = { caFrom: "the system's CAs", certFrom: "none" };
  if (caPick) {
    out.ca = readPem(caPick);
    certificates(out.ca, caPick);
    out.caFrom = `${resolve(caPick.path)} (${caPick.variable})`;
  } else if (dir) {
    out.ca = dir.ca;
    out.caFrom = fromDir(TLS_FILES.ca);
  }
  if (certPick && keyPick) {
    Object.assign(out, clientPair(certPick, keyPick, now));
    out.certFrom = `${resolve(certPick.path)} (${certPick.variable})`;
  } else if (dir) {
    out.cert = dir.cert;
    out.key = dir.key;
    out.certFrom = fromDir(TLS_FILES.cert);
  }
  return out;
}

/**
 * What start-up should say about TLS settings that change nothing: certificate variables with an
 * http:// endpoint (spans go in plaintext), OTEL_EXPORTER_OTLP_INSECURE with an https:// grpc
 * endpoint (the scheme wins, as the specification says).
 */
export function tlsNotes(url: string, grpc: boolean, c: Values): string[] {
  const notes: string[] = [];
  if (url.startsWith("http://")) {
    const set = (
      [
        ["OTEL_EXPORTER_OTLP_CERTIFICATE", c.certificate],
        ["OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE", c.tracesCertificate],
        ["OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE", c.clientCertificate],
        ["OTEL_EXPORTER_OTLP_TRACES_CLIENT_CERTIFICATE", c.tracesClientCertificate],
        ["OTEL_EXPORTER_OTLP_CLIENT_KEY", c.clientKey],
        ["OTEL_EXPORTER_OTLP_TRACES_CLIENT_KEY", c.tracesClientKey],
      ] as const
    ).flatMap(([name, v]) => (v !== undefined ? [name] : []));
    if (set.length) notes.push(`${set.join(", ")} ignored: the endpoint ${url} is http://, spans go without TLS (use https:// for TLS)`);
  }
  const insecure = c.tracesInsecure ?? c.insecure;
  if (grpc && insecure && url.startsWith("https://")) {
    notes.push(
      `${c.tracesInsecure !== undefined ? "OTEL_EXPORTER_OTLP_TRACES_INSECURE" : "OTEL_EXPORTER_OTLP_INSECURE"}=true ignored: the endpoint ${url} is https://, which takes precedence (use http:// for plaintext)`,
    );
  }
  return notes;
}
