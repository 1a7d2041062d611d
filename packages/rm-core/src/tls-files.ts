// The deployment's TLS material (AIRM_TLS_DIR): a folder holding tls.crt, tls.key and ca.crt, the
// keys cert-manager writes into a Secret mounted as a volume. A part loads and checks it at start
// (a missing, unreadable, expired or mismatched file is a ConfigError naming it), then reads the
// folder again every AIRM_TLS_RELOAD_S (cert-manager renews before expiry and the kubelet swaps
// the Secret's files in place): new files that pass the same checks replace the old for every
// handshake after, and a part's servers and clients are told; new files that fail them are
// reported and the old stay in force. It takes from here the options of every link between
// parts: a server asks for the caller's certificate
// and verifies it against ca.crt (refused at the handshake otherwise); a client presents its own
// and verifies the server's against ca.crt. Only the chain is checked, never a host name: any
// certificate the CA issued is a part of the deployment (docs/tls.md says why).

import { X509Certificate, createPrivateKey } from "node:crypto";
import { readFileSync, statSync } from "node:fs";
import { join } from "node:path";
import type { ConnectionOptions, SecureContextOptions, TlsOptions } from "node:tls";
import { ConfigError } from "./errors.ts";

/** The files of a TLS folder, as cert-manager names a Secret's keys. */
export const TLS_FILES = { cert: "tls.crt", key: "tls.key", ca: "ca.crt" } as const;

/** What every TLS link of a part is made with (loadTlsDir): the files in force now. */
export interface TlsMaterial {
  /** The folder it was read from (AIRM_TLS_DIR). */
  readonly dir: string;
  /** tls.crt: this part's certificate (and any intermediates), PEM. */
  readonly cert: Buffer;
  /** tls.key: its private key, PEM. */
  readonly key: Buffer;
  /** ca.crt: the certificates a peer's chain must end in, PEM. */
  readonly ca: Buffer;
  /** 0 as loaded; one more for each reload that took new files. */
  readonly generation: number;
  /** Calls `fn` after each reload that took new files (a server sets its context, a client pool starts anew); returns what stops the calls. */
  onReload(fn: () => void): () => void;
}

type Files = Pick<TlsMaterial, "cert" | "key" | "ca">;

const SETTING = "AIRM_TLS_DIR";
const PEM_BLOCK = /-----BEGIN CERTIFICATE-----[\s\S]+?-----END CERTIFICATE-----/g;

/** The bytes of `dir/name`; a ConfigError naming the file when it is missing, unreadable or not PEM. */
function readPem(dir: string, name: string): Buffer {
  const path = join(dir, name);
  let bytes: Buffer;
  try {
    bytes = readFileSync(path);
  } catch (e) {
    const code = (e as NodeJS.ErrnoException).code;
    const why = code === "ENOENT" ? "is missing" : `cannot be read (${(e as Error).message})`;
    throw new ConfigError(SETTING, `${path} ${why}; the folder must hold ${Object.values(TLS_FILES).join(", ")} (a cert-manager Secret mounted as a volume)`);
  }
  if (!bytes.includes("-----BEGIN ")) throw new ConfigError(SETTING, `${path} is not PEM (no -----BEGIN line)`);
  return bytes;
}

/** The certificates of a PEM file; a ConfigError naming the file when one does not parse. */
function certificatesOf(pem: Buffer, path: string): X509Certificate[] {
  const blocks = pem.toString("latin1").match(PEM_BLOCK) ?? [];
  if (!blocks.length) throw new ConfigError(SETTING, `${path} holds no certificate`);
  try {
    return blocks.map((b) => new X509Certificate(b));
  } catch (e) {
    throw new ConfigError(SETTING, `${path} holds a certificate that does not parse: ${(e as Error).message}`);
  }
}

/** Checks that tls.crt is in force now, matches tls.key, and was issued by a certificate of ca.crt. */
function checkChain(m: Files & { dir: string }, now: Date): void {
  const certPath = join(m.dir, TLS_FILES.cert);
  const [leaf, ...chain] = certificatesOf(m.cert, certPath);
  const cas = certificatesOf(m.ca, join(m.dir, TLS_FILES.ca));
  if (now < new Date(leaf.validFrom)) throw new ConfigError(SETTING, `${certPath} is not valid before ${leaf.validFrom}`);
  if (now > new Date(leaf.validTo)) throw new ConfigError(SETTING, `${certPath} expired on ${leaf.validTo}; renew it (peers refuse an expired certificate)`);
  let key: ReturnType<typeof createPrivateKey>;
  try {
    key = createPrivateKey(m.key);
  } catch (e) {
    throw new ConfigError(SETTING, `${join(m.dir, TLS_FILES.key)} is not a private key: ${(e as Error).message}`);
  }
  if (!leaf.checkPrivateKey(key)) throw new ConfigError(SETTING, `${join(m.dir, TLS_FILES.key)} is not the key of ${certPath}`);
  const issued = [leaf, ...chain].some((c) => cas.some((ca) => c.checkIssued(ca) && c.verify(ca.publicKey)));
  if (!issued)
    throw new ConfigError(
      SETTING,
      `${certPath} (issuer ${leaf.issuer.replace(/\n/g, ", ")}) was not issued by a certificate of ${join(m.dir, TLS_FILES.ca)}: peers would refuse it`,
    );
}

/**
 * Reads and checks the TLS folder `dir` (AIRM_TLS_DIR). Throws ConfigError naming the file at
 * fault: a missing folder or file, one that is not PEM, an expired or not-yet-valid tls.crt, a
 * tls.key that is not its key, a tls.crt that ca.crt did not issue.
 */
export function loadTlsDir(dir: string, now = new Date()): LiveTlsMaterial {
  let isDir = false;
  try {
    isDir = statSync(dir).isDirectory();
  } catch {
    // reported below
  }
  if (!isDir) throw new ConfigError(SETTING, `${dir} is not a folder; it must hold ${Object.values(TLS_FILES).join(", ")}`);
  return new LiveTlsMaterial(dir, readChecked(dir, now));
}

/** The folder's three files, checked (ConfigError naming the file at fault). */
function readChecked(dir: string, now: Date): Files {
  const files = { cert: readPem(dir, TLS_FILES.cert), key: readPem(dir, TLS_FILES.key), ca: readPem(dir, TLS_FILES.ca) };
  checkChain({ dir, ...files }, now);
  return files;
}

/** A TLS folder's files in force, replaced by reload() when the folder's files changed and pass the checks. */
export class LiveTlsMaterial implements TlsMaterial {
  private files: Files;
  private gen = 0;
  private readonly listeners = new Set<() => void>();

  constructor(
    readonly dir: string,
    files: Files,
  ) {
    this.files = files;
  }

  get cert(): Buffer {
    return this.files.cert;
  }
  get key(): Buffer {
    return this.files.key;
  }
  get ca(): Buffer {
    return this.files.ca;
  }
  get generation(): number {
    return this.gen;
  }

  onReload(fn: () => void): () => void {
    this.listeners.add(fn);
    return () => this.listeners.delete(fn);
  }

  /**
   * Reads the folder again: "same" when its files are the ones in force, "reloaded" when new files
   * passed the checks and replaced them (the listeners were told). Throws ConfigError, keeping the
   * files in force, when the new ones fail a check.
   */
  reload(now = new Date()): "same" | "reloaded" {
    const cur = this.files;
    const next = { cert: readPem(this.dir, TLS_FILES.cert), key: readPem(this.dir, TLS_FILES.key), ca: readPem(this.dir, TLS_FILES.ca) };
    if (next.cert.equals(cur.cert) && next.key.equals(cur.key) && next.ca.equals(cur.ca)) return "same";
    checkChain({ dir: this.dir, ...next }, now);
    this.files = next;
    this.gen++;
    for (const fn of this.listeners) fn();
    return "reloaded";
  }

  /**
   * Calls reload() every `intervalMs` (an unref'd timer). New files that fail their checks on two
   * reads in a row (one read can catch a Secret's files mid-swap) go to `onError`, once per
   * content. Returns what stops it.
   */
  watch(intervalMs: number, onError: (e: Error) => void): () => void {
    let failing = "";
    let reported = "";
    const timer = setInterval(() => {
      try {
        this.reload();
        failing = reported = "";
      } catch (e) {
        const why = (e as Error).message;
        if (why === failing && why !== reported) {
          reported = why;
          onError(e as Error);
        }
        failing = why;
      }
    }, intervalMs);
    timer.unref();
    return () => clearInterval(timer);
  }
}

/** How a part keeps its TLS folder current (AIRM_TLS_RELOAD_S). */
export interface TlsReload {
  /** Seconds between reads of the folder; 0 reads it at start only. */
  reloadS?: number;
  /** Told when new files fail their checks (the old stay in force); a process warning when not given. */
  onError?: (e: Error) => void;
}

/** Seconds between reads of AIRM_TLS_DIR when AIRM_TLS_RELOAD_S is not set. */
export const DEFAULT_TLS_RELOAD_S = 60;

/**
 * The material of AIRM_TLS_DIR when it is set (`tlsDir` as resolved by RM_CORE_CONFIG), else
 * undefined; read again every `reloadS` seconds for the life of the process.
 */
export function tlsMaterialOf(tlsDir: string | undefined, o: TlsReload = {}): TlsMaterial | undefined {
  if (!tlsDir) return undefined;
  const m = loadTlsDir(tlsDir);
  const reloadS = o.reloadS ?? DEFAULT_TLS_RELOAD_S;
  const warn = (e: Error) => process.emitWarning(`${e.message}; the certificates loaded before stay in force`, { code: "TLS_RELOAD_REFUSED" });
  if (reloadS > 0) m.watch(reloadS * 1000, o.onError ?? warn);
  return m;
}

/** A server's side of mutual TLS: present tls.crt, ask every caller for a certificate and refuse one ca.crt did not issue. */
export function serverTlsOptions(m: TlsMaterial): TlsOptions {
  return { cert: m.cert, key: m.key, ca: m.ca, requestCert: true, rejectUnauthorized: true, minVersion: "TLSv1.2" };
}

/**
 * Keeps a TLS server current: each reload of `m` gives it a new secure context (the new tls.crt,
 * tls.key and ca.crt) for the handshakes after; `told` hears of it. Returns what stops it.
 */
export function serveReloads(server: { setSecureContext(o: SecureContextOptions): void }, m: TlsMaterial, told?: () => void): () => void {
  return m.onReload(() => {
    server.setSecureContext(serverTlsOptions(m));
    told?.();
  });
}

/**
 * A client's side: present tls.crt, refuse a server whose chain does not end in ca.crt. The host
 * name is not checked (checkServerIdentity accepts any): parts are reached by pod IPs and Service
 * names no one certificate can list, and the CA is the deployment's own (docs/tls.md).
 */
export function clientTlsOptions(m: TlsMaterial): ConnectionOptions {
  return { cert: m.cert, key: m.key, ca: m.ca, rejectUnauthorized: true, minVersion: "TLSv1.2", checkServerIdentity: () => undefined };
}

/**
 * Why a server's TLS handshake with a caller failed, when it refused the caller (a certificate
 * missing, of another CA, expired: Node closes those after verifying, and the error it reports is
 * then a bare reset, so the verification's code is read from the socket), else null (the caller
 * went away, e.g. a port probe).
 */
export function refusalReason(err: Error, socket: { authorizationError?: unknown }): string | null {
  if (socket.authorizationError) return String(socket.authorizationError);
  return isTlsError(err) ? `${(err as NodeJS.ErrnoException).code ?? "TLS"}: ${err.message.split("\n")[0]}` : null;
}

/** Whether `e` is a TLS failure (a refused or unverifiable certificate, an alert) rather than a plain network error. */
export function isTlsError(e: unknown): boolean {
  const err = e as { code?: unknown; library?: unknown; message?: unknown } | null;
  if (!err) return false;
  const code = typeof err.code === "string" ? err.code : "";
  return code.startsWith("ERR_SSL_") || code.startsWith("ERR_TLS_") || /CERT|UNABLE_TO|SELF_SIGNED/.test(code) || err.library === "SSL routines";
}
