// What `airm up` leaves for `airm top` while it runs: a small state file (its gateway's URL, each
// part's URL, its log file and how many times it started, the internal token, the TLS folder),
// readable by this user only, and each part's log lines in a file of its own (one older file kept
// per part, so a log stays small however long the cluster runs). Both live in one folder per user:
// $XDG_RUNTIME_DIR/airm, else <tmp>/airm-<uid>; airm up removes its own when it stops, and a
// launcher that was killed is swept by the next one.

import { closeSync, existsSync, fstatSync, lstatSync, mkdirSync, openSync, readdirSync, readFileSync, readSync, renameSync, rmSync, writeFileSync, writeSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";

export const UP_STATE_VERSION = 1;

/** The roles a part of a local cluster plays. */
export type PartRole = "gateway" | "prefill" | "decode" | "solo" | "sidecar";

export interface UpStatePart {
  /** As airm up names it: prefill, decode-2, gateway, kv-relay... */
  name: string;
  role: PartRole;
  /** http(s)://host:port of a worker or the gateway; host:port of a sidecar. */
  url: string;
  /** Where a sidecar serves /metrics and /health, when it does (the KV relay). */
  metrics: string | null;
  /** The file its output lines go to (the previous one is this plus ".1"). */
  log: string;
  /** Times its process was started (1 + restarts). */
  starts: number;
}

export interface UpState {
  version: number;
  /** airm up's process. */
  pid: number;
  startedAt: string;
  gateway: string;
  /** The gateway's --metrics-port page, when it has one. */
  gatewayMetrics: string | null;
  /** The parts' AIRM_INTERNAL_TOKEN: what a drain call sends. */
  internalToken: string;
  /** AIRM_TLS_DIR of the parts (workers serve mutual TLS), else null. */
  tlsDir: string | null;
  parts: UpStatePart[];
}

/** A state file found, with where it is. */
export interface FoundState {
  file: string;
  state: UpState;
}

/** Bytes a part's log file reaches before it is moved to <file>.1 and started again. */
export const LOG_LIMIT = 1 << 20;

/** The folder of the state files of this user. */
export function upStateDir(env: Record<string, string | undefined>): string {
  const run = env.XDG_RUNTIME_DIR;
  return run ? join(run, "airm") : join(tmpdir(), `airm-${process.getuid?.() ?? "user"}`);
}

/**
 * Makes (or checks) the folder: a real folder of this user that no one else may read, since the
 * state holds the internal token. Throws naming what is wrong.
 */
export function ensurePrivateDir(dir: string): void {
  mkdirSync(dir, { recursive: true, mode: 0o700 });
  const st = lstatSync(dir);
  if (!st.isDirectory()) throw new Error(`${dir} is not a folder`);
  if (process.getuid && st.uid !== process.getuid()) throw new Error(`${dir} belongs to another user`);
  if ((st.mode & 0o077) !== 0) throw new Error(`${dir} may be read by other users (mode ${(st.mode & 0o777).toString(8)}); make it 0700`);
}

const alive = (pid: number) => {
  try {
    process.kill(pid, 0);
    return true;
  } catch (e) {
    return (e as NodeJS.ErrnoException).code === "EPERM";
  }
};

const STATE_NAME = /^up-(\d+)\.(json|logs)$/;

/** Removes the state files and log folders of launchers that are gone; returns what it removed. */
export function sweepStaleStates(dir: string): string[] {
  if (!existsSync(dir)) return [];
  const removed: string[] = [];
  for (const name of readdirSync(dir)) {
    const m = STATE_NAME.exec(name);
    if (!m || alive(Number(m[1]))) continue;
    rmSync(join(dir, name), { recursive: true, force: true });
    removed.push(join(dir, name));
  }
  return removed;
}

/** The role of a part from its launcher name. */
export function roleOfPartName(name: string): PartRole {
  if (name === "gateway") return "gateway";
  const m = /^(prefill|decode|solo)(-\d+)?$/.exec(name);
  return m ? (m[1] as PartRole) : "sidecar";
}

/** A part's name made safe as a file name. */
const fileSafe = (name: string) => name.replace(/[^a-zA-Z0-9._-]/g, "_");

/** One part's log file: appended line by line, moved to .1 past LOG_LIMIT. */
class PartLog {
  private fd: number;
  private bytes: number;

  constructor(readonly file: string) {
    this.fd = openSync(file, "a", 0o600);
    this.bytes = fstatSync(this.fd).size;
  }

  write(line: string): void {
    const data = `${line}\n`;
    if (this.bytes + data.length > LOG_LIMIT && this.bytes > 0) this.rotate();
    this.bytes += writeSync(this.fd, data);
  }

  close(): void {
    closeSync(this.fd);
  }

  private rotate(): void {
    closeSync(this.fd);
    renameSync(this.file, `${this.file}.1`);
    this.fd = openSync(this.file, "a", 0o600);
    this.bytes = 0;
  }
}

/** What airm up tells the writer once its cluster is up. */
export interface PublishedCluster {
  gateway: string;
  gatewayMetrics: string | null;
  internalToken: string;
  tlsDir: string | null;
  parts: { name: string; url: string }[];
  /** The sidecar's metrics page, when it was given a metrics port. */
  sidecarMetrics: string | null;
}

/**
 * airm up's side: keeps each part's log file from the first line on, writes the state file once
 * the cluster is up (and again when a part restarts), removes both when the cluster stops.
 */
export class UpStateWriter {
  private readonly logs = new Map<string, PartLog>();
  private readonly starts = new Map<string, number>();
  private published: PublishedCluster | null = null;
  private readonly startedAt = new Date().toISOString();
  readonly file: string;
  readonly logDir: string;

  private constructor(
    readonly dir: string,
    readonly pid: number,
  ) {
    this.file = join(dir, `up-${pid}.json`);
    this.logDir = join(dir, `up-${pid}.logs`);
    mkdirSync(this.logDir, { recursive: true, mode: 0o700 });
  }

  /** Opens the folder (swept of dead launchers' files); throws when it cannot be used safely. */
  static open(env: Record<string, string | undefined>, pid = process.pid): UpStateWriter {
    const dir = upStateDir(env);
    ensurePrivateDir(dir);
    sweepStaleStates(dir);
    return new UpStateWriter(dir, pid);
  }

  /** A part's output line, into its log file. */
  logLine(part: string, line: string): void {
    let log = this.logs.get(part);
    if (!log) {
      log = new PartLog(this.logPath(part));
      this.logs.set(part, log);
    }
    log.write(line);
  }

  /** A part's process was started (again); the state file says so once it is written. */
  partStarted(part: string): void {
    this.starts.set(part, (this.starts.get(part) ?? 0) + 1);
    if (this.published) this.write();
  }

  /** Writes the state file for the cluster now up. */
  publish(c: PublishedCluster): void {
    this.published = c;
    this.write();
  }

  /** Closes the logs and removes the state file and the log folder. */
  remove(): void {
    for (const l of this.logs.values()) l.close();
    this.logs.clear();
    rmSync(this.file, { force: true });
    rmSync(this.logDir, { recursive: true, force: true });
  }

  private logPath(part: string): string {
    return join(this.logDir, `${fileSafe(part)}.log`);
  }

  private state(c: PublishedCluster): UpState {
    const parts = c.parts.map((p) => {
      const role = roleOfPartName(p.name);
      return { name: p.name, role, url: p.url, metrics: role === "sidecar" ? c.sidecarMetrics : null, log: this.logPath(p.name), starts: this.starts.get(p.name) ?? 1 };
    });
    const { gateway, gatewayMetrics, internalToken, tlsDir } = c;
    return { version: UP_STATE_VERSION, pid: this.pid, startedAt: this.startedAt, gateway, gatewayMetrics, internalToken, tlsDir, parts };
  }

  /** Written whole to a temporary file first, then renamed: a reader never sees half of it. */
  private write(): void {
    if (!this.published) return;
    const tmp = `${this.file}.tmp`;
    writeFileSync(tmp, `${JSON.stringify(this.state(this.published), null, 2)}\n`, { mode: 0o600 });
    renameSync(tmp, this.file);
  }
}

/** The state files of live launchers in `dir`, newest first (unreadable ones skipped). */
export function readUpStates(dir: string): FoundState[] {
  if (!existsSync(dir)) return [];
  const found: FoundState[] = [];
  for (const name of readdirSync(dir)) {
    const m = STATE_NAME.exec(name);
    if (m?.[2] !== "json" || !alive(Number(m[1]))) continue;
    try {
      const state = JSON.parse(readFileSync(join(dir, name), "utf8")) as UpState;
      if (state.version === UP_STATE_VERSION) found.push({ file: join(dir, name), state });
    } catch {
      // being replaced, or not ours
    }
  }
  return found.sort((a, b) => b.state.startedAt.localeCompare(a.state.startedAt));
}

/** The last `bytes` of a file as text, and whether that is the whole file (empty and whole when it does not exist). */
function tailBytes(file: string, bytes: number): { text: string; whole: boolean } {
  let fd: number;
  try {
    fd = openSync(file, "r");
  } catch {
    return { text: "", whole: true };
  }
  try {
    const size = fstatSync(fd).size;
    const n = Math.min(size, bytes);
    const buf = Buffer.alloc(n);
    readSync(fd, buf, 0, n, size - n);
    return { text: buf.toString("utf8"), whole: n === size };
  } finally {
    closeSync(fd);
  }
}

/** The last `n` lines of a part's log (from its older file too when the current one is short). */
export function tailLog(file: string, n: number): string[] {
  const lines = (t: { text: string; whole: boolean }) => {
    const xs = t.text.split("\n");
    if (xs.at(-1) === "") xs.pop();
    return t.whole ? xs : xs.slice(1); // the first line of a cut read is partial
  };
  /** The last `n` lines of one file, reading more of it until they are there (or it is read whole). */
  const lastOf = (f: string, want: number) => {
    for (let budget = Math.max(4096, want * 256); ; budget *= 4) {
      const t = tailBytes(f, budget);
      const got = lines(t);
      if (got.length >= want || t.whole) return got.slice(-want);
    }
  };
  const out = lastOf(file, n);
  return out.length < n ? [...lastOf(`${file}.1`, n - out.length), ...out] : out;
}
