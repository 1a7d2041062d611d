// Makes X.509 material with the openssl command (OpenSSL 3.0 or later; EC P-256 keys): a throwaway
// CA, and leaf certificates it signs for both ends of every link (server and client auth, SANs for
// the hosts given) into a TLS folder of the AIRM_TLS_DIR layout. `airm up --tls` makes one CA and
// one leaf for all its parts and forgets the CA's key; the TLS tests also make expired leaves and
// leaves of another CA. Every openssl run gets a minimal config of its own, never the system's.

import { execFileSync } from "node:child_process";
import { chmodSync, copyFileSync, existsSync, mkdirSync, mkdtempSync, readdirSync, renameSync, rmSync, symlinkSync, writeFileSync } from "node:fs";
import { isIP } from "node:net";
import { join } from "node:path";
import { TLS_FILES } from "./tls-files.ts";

/** A CA on disk: its certificate and key (PEM files in `dir`). */
export interface CaFiles {
  dir: string;
  cert: string;
  key: string;
}

export interface LeafOptions {
  /** The subject's common name (default "airm"). */
  cn?: string;
  /** Host names and addresses for the subjectAltName (default 127.0.0.1, ::1, localhost). */
  hosts?: string[];
  /** When it starts being valid (default an hour ago: clocks differ a little). */
  notBefore?: Date;
  /** When it stops (default in 30 days). */
  notAfter?: Date;
}

const DAY_MS = 86_400_000;
export const DEFAULT_TLS_HOSTS = ["127.0.0.1", "::1", "localhost"];

/** Runs openssl; a failure says which command and what openssl printed. */
function openssl(args: string[], cwd: string): void {
  try {
    execFileSync("openssl", args, { cwd, stdio: ["ignore", "pipe", "pipe"] });
  } catch (e) {
    const err = e as NodeJS.ErrnoException & { stderr?: Buffer };
    if (err.code === "ENOENT") throw new Error("making TLS certificates needs the openssl command (OpenSSL 3.0 or later) on the PATH");
    throw new Error(`openssl ${args[0]} failed: ${err.stderr?.toString().trim() || err.message}`);
  }
}

/** A new EC P-256 private key at `path` (mode 0600). */
function newKey(path: string, cwd: string): void {
  openssl(["genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256", "-out", path], cwd);
  chmodSync(path, 0o600);
}

/** openssl's time format for -startdate / -enddate: YYYYMMDDHHMMSSZ. */
function asnTime(d: Date): string {
  return `${d.toISOString().replace(/[-:T]/g, "").slice(0, 14)}Z`;
}

/** A self-signed CA named `cn` in `dir` (created), valid for `days`. */
export function createCa(dir: string, cn = "airm throwaway CA", days = 30): CaFiles {
  mkdirSync(dir, { recursive: true, mode: 0o700 });
  const ca: CaFiles = { dir, cert: join(dir, "ca.crt"), key: join(dir, "ca.key") };
  writeFileSync(
    join(dir, "req.cnf"),
    `[req]\ndistinguished_name = dn\nprompt = no\n[dn]\nCN = ${cn}\n` +
      "[ca_ext]\nbasicConstraints = critical, CA:TRUE\nkeyUsage = critical, keyCertSign, cRLSign\nsubjectKeyIdentifier = hash\n",
  );
  newKey(ca.key, dir);
  openssl(["req", "-x509", "-new", "-config", "req.cnf", "-extensions", "ca_ext", "-key", ca.key, "-days", String(days), "-sha256", "-out", ca.cert], dir);
  return ca;
}

/** The subjectAltName entries for `hosts`: IP: for addresses, DNS: for names. */
function altNames(hosts: string[]): string {
  const lines = [...new Set(hosts)].map((h, i) => (isIP(h) ? `IP.${i + 1} = ${h}` : `DNS.${i + 1} = ${h}`));
  return `[alt]\n${lines.join("\n")}\n`;
}

/** The minimal `openssl ca` configuration: a database of its own, any subject, the leaf's extensions. */
function caConfig(hosts: string[]): string {
  return (
    "[ca]\ndefault_ca = airm\n[airm]\ndatabase = index.txt\nnew_certs_dir = .\nserial = serial\ndefault_md = sha256\n" +
    "policy = any\ncopy_extensions = none\nunique_subject = no\n[any]\ncommonName = supplied\n" +
    "[leaf_ext]\nbasicConstraints = critical, CA:FALSE\nkeyUsage = critical, digitalSignature, keyEncipherment\n" +
    "extendedKeyUsage = serverAuth, clientAuth\nsubjectAltName = @alt\n" +
    altNames(hosts)
  );
}

/**
 * Issues a leaf certificate of `ca` into the TLS folder `outDir` (created): tls.key (0600),
 * tls.crt and a copy of the CA's certificate as ca.crt. Serves both ends of a link (serverAuth
 * and clientAuth). Its validity is `notBefore`..`notAfter`, in the past for an expired one.
 */
export function issueLeaf(ca: CaFiles, outDir: string, o: LeafOptions = {}): string {
  mkdirSync(outDir, { recursive: true, mode: 0o700 });
  const work = mkdtempSync(join(ca.dir, "issue-"));
  try {
    const now = Date.now();
    writeFileSync(join(work, "req.cnf"), `[req]\ndistinguished_name = dn\nprompt = no\n[dn]\nCN = ${o.cn ?? "airm"}\n`);
    writeFileSync(join(work, "ca.cnf"), caConfig(o.hosts ?? DEFAULT_TLS_HOSTS));
    writeFileSync(join(work, "index.txt"), "");
    writeFileSync(join(work, "serial"), `${BigInt(now).toString(16).padStart(16, "0")}\n`);
    const key = join(outDir, TLS_FILES.key);
    newKey(key, work);
    openssl(["req", "-new", "-config", "req.cnf", "-key", key, "-out", "leaf.csr"], work);
    const start = o.notBefore ?? new Date(now - 3_600_000);
    const end = o.notAfter ?? new Date(now + 30 * DAY_MS);
    const dates = ["-startdate", asnTime(start), "-enddate", asnTime(end)];
    openssl(
      [
        "ca",
        "-batch",
        "-config",
        "ca.cnf",
        "-cert",
        ca.cert,
        "-keyfile",
        ca.key,
        "-in",
        "leaf.csr",
        "-out",
        join(outDir, TLS_FILES.cert),
        ...dates,
        "-extensions",
        "leaf_ext",
        "-notext",
      ],
      work,
    );
    copyFileSync(ca.cert, join(outDir, TLS_FILES.ca));
  } finally {
    rmSync(work, { recursive: true, force: true });
  }
  return outDir;
}

/**
 * A TLS folder for one deployment in `outDir` (created): a fresh throwaway CA issues one leaf for
 * every part (SANs: `hosts` plus 127.0.0.1, ::1, localhost), then the CA's key is deleted, so
 * nothing can issue another certificate of it. What `airm up --tls` gives its parts.
 */
export function makeTlsDir(outDir: string, o: { hosts?: string[]; days?: number } = {}): string {
  mkdirSync(outDir, { recursive: true, mode: 0o700 });
  const caDir = mkdtempSync(join(outDir, ".ca-"));
  try {
    const ca = createCa(caDir, "airm throwaway CA", o.days ?? 30);
    issueLeaf(ca, outDir, { hosts: [...DEFAULT_TLS_HOSTS, ...(o.hosts ?? [])], notAfter: new Date(Date.now() + (o.days ?? 30) * DAY_MS) });
  } finally {
    rmSync(caDir, { recursive: true, force: true });
  }
  return outDir;
}

/** The TLS folders of the refusal tests: `good` (what the server is given), and clients' `expired` (same CA) and `foreign` (another CA). */
export interface TlsTestDirs {
  good: string;
  expired: string;
  foreign: string;
}

/**
 * Under `root`: a CA issuing `good` and an `expired` leaf (valid for a day in 2020), and another CA
 * issuing `foreign`. Each folder holds the AIRM_TLS_DIR layout; `foreign`'s ca.crt is the
 * deployment's own, so a client with it still trusts the server: only the server can refuse it.
 */
export function makeTlsTestDirs(root: string): TlsTestDirs {
  const ca = createCa(join(root, "ca"), "airm test CA");
  const other = createCa(join(root, "other-ca"), "another CA");
  const dirs: TlsTestDirs = { good: join(root, "good"), expired: join(root, "expired"), foreign: join(root, "foreign") };
  issueLeaf(ca, dirs.good);
  issueLeaf(ca, dirs.expired, { notBefore: new Date(Date.UTC(2020, 0, 1)), notAfter: new Date(Date.UTC(2020, 0, 2)) });
  issueLeaf(other, dirs.foreign);
  copyFileSync(ca.cert, join(dirs.foreign, TLS_FILES.ca));
  return dirs;
}

/**
 * Copies the TLS folder `from`'s files into `volume` the way the kubelet updates a mounted Secret:
 * into a new timestamped folder, then `..data` is switched to it by one rename and each file is a
 * link through `..data` (made the first time), so a reader sees the old set or the new one; the
 * folder before is removed. What a cert-manager renewal looks like to a part.
 */
export function writeSecretVolume(volume: string, from: string): void {
  mkdirSync(volume, { recursive: true, mode: 0o700 });
  const previous = readdirSync(volume).filter((n) => n.startsWith("..20"));
  const next = mkdtempSync(join(volume, `..${new Date().toISOString().replace(/[-:.]/g, "_")}.`));
  for (const f of Object.values(TLS_FILES)) copyFileSync(join(from, f), join(next, f));
  symlinkSync(next.slice(volume.length + 1), join(volume, "..data_tmp"));
  renameSync(join(volume, "..data_tmp"), join(volume, "..data"));
  for (const f of Object.values(TLS_FILES)) if (!existsSync(join(volume, f))) symlinkSync(join("..data", f), join(volume, f));
  for (const p of previous) rmSync(join(volume, p), { recursive: true, force: true });
}
