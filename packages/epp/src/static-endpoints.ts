// The endpoint source for a laptop: a JSON or YAML file listing the endpoints, re-read when its
// modification time, size or inode change (checked by stat every pollMs: editors that replace the
// file instead of writing it in place are seen too, which fs.watch misses). A file that turns bad
// keeps the last good list and logs why.

import { stat, readFile } from "node:fs/promises";
import { AirmError } from "@airm/rm-core";
import { parse as parseYaml } from "yaml";
import { z } from "zod";
import { ChangeListeners, sameEndpoints, type EndpointSource } from "@airm/routing";
import { ROLES, hostPortOf, type Endpoint } from "@airm/routing";
import { silentLog, type Log } from "./log.ts";

const EndpointEntrySchema = z
  .object({
    address: z.string().trim().min(1),
    port: z.number().int().min(1).max(65535),
    role: z.enum(ROLES as [string, ...string[]]).default("both"),
    name: z.string().trim().min(1).optional(),
    kvEvents: z
      .string()
      .regex(/^(tcp|ipc):\/\//, "must be a tcp:// or ipc:// address")
      .optional(),
    kvReplay: z
      .string()
      .regex(/^(tcp|ipc):\/\//, "must be a tcp:// or ipc:// address")
      .nullable()
      .optional(),
  })
  .strict();

/** The file: a list of `{ address, port, role?, name? }` (role defaults to "both", name to address:port). */
export const EndpointsFileSchema = z.array(EndpointEntrySchema);

/** The endpoints file is missing, unreadable or not a valid list. */
export class EndpointsFileError extends AirmError {
  constructor(
    readonly path: string,
    detail: string,
  ) {
    super("CONFIG", `endpoints file ${path}: ${detail}. Expected a JSON or YAML list like [{"address": "127.0.0.1", "port": 8000, "role": "decode", "name": "pod-a"}]`);
  }
}

/** Parses the text of an endpoints file (YAML unless the path ends in .json). Throws EndpointsFileError. */
export function parseEndpointsFile(path: string, text: string): Endpoint[] {
  let raw: unknown;
  try {
    raw = path.endsWith(".json") ? JSON.parse(text) : parseYaml(text);
  } catch (e) {
    throw new EndpointsFileError(path, `cannot parse: ${(e as Error).message.split("\n")[0]}`);
  }
  const r = EndpointsFileSchema.safeParse(raw);
  if (!r.success) {
    const issue = r.error.issues[0];
    const where = issue.path.length ? `entry ${issue.path.map(String).join(".")}: ` : "";
    throw new EndpointsFileError(path, `${where}${issue.message}`);
  }
  const out = r.data.map((e) => ({
    address: e.address,
    port: e.port,
    role: e.role as Endpoint["role"],
    name: e.name ?? hostPortOf(e),
    ...(e.kvEvents ? { kvEvents: e.kvEvents } : {}),
    ...(e.kvReplay !== undefined ? { kvReplay: e.kvReplay } : {}),
  }));
  const seen = new Set<string>();
  for (const e of out) {
    if (seen.has(hostPortOf(e))) throw new EndpointsFileError(path, `${hostPortOf(e)} is listed twice`);
    seen.add(hostPortOf(e));
  }
  return out;
}

export interface StaticEndpointsOptions {
  /** How often the file is checked for a change, in ms (default 1000). */
  pollMs?: number;
  log?: Log;
}

export class StaticEndpoints implements EndpointSource {
  private current: Endpoint[] = [];
  private version = "";
  private lastError = "";
  private timer: NodeJS.Timeout | undefined;
  private readonly listeners = new ChangeListeners();
  private readonly pollMs: number;
  private readonly log: Log;

  constructor(
    readonly path: string,
    options: StaticEndpointsOptions = {},
  ) {
    this.pollMs = options.pollMs ?? 1000;
    this.log = options.log ?? silentLog;
  }

  async start(): Promise<void> {
    await this.reload(true);
    this.timer = setInterval(() => void this.reload(false), this.pollMs);
    this.timer.unref();
  }

  stop(): void {
    clearInterval(this.timer);
    this.timer = undefined;
  }

  endpoints(): Endpoint[] {
    return [...this.current];
  }

  onChange(listener: (endpoints: Endpoint[]) => void): () => void {
    return this.listeners.add(listener);
  }

  /** Re-reads the file when it changed; at start a bad file throws, later it is logged and skipped. */
  private async reload(first: boolean): Promise<void> {
    let next: Endpoint[];
    try {
      const s = await stat(this.path);
      const version = `${s.ino}:${s.size}:${s.mtimeMs}`;
      if (version === this.version) return;
      this.version = version;
      next = parseEndpointsFile(this.path, await readFile(this.path, "utf8"));
    } catch (e) {
      const err = e instanceof EndpointsFileError ? e : new EndpointsFileError(this.path, (e as Error).message);
      if (first) throw err;
      if (err.message !== this.lastError) this.log.error({ err: err.message }, "endpoints file not reloaded; keeping the last good list");
      this.lastError = err.message;
      return;
    }
    this.lastError = "";
    if (sameEndpoints(next, this.current)) return;
    this.current = next;
    this.log.info({ endpoints: next.map(hostPortOf) }, "endpoints file loaded");
    if (!first) this.listeners.emit(next);
  }
}
