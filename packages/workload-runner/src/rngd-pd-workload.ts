// The `rngd-pd` workload runner (airm.workloads): turns an ai-rm Workload plus config into the
// command line and environment of one process (prefill worker, decode worker or gateway) and
// starts it. Backends are checked against what the installed engines declare; which engine or
// transport the process then loads is its own business.

import { spawn, type ChildProcess } from "node:child_process";
import { ConfigError, engineForBackend, type Workload, type WorkloadPlugin } from "@airm/rm-core";
import { z } from "zod";
import { DEFAULT_BACKENDS, DEFAULT_KV_TRANSPORT } from "./defaults.ts";
import { binPath, pluginRegistry } from "./package-bins.ts";

const port = z.number().int().min(0).max(65535);
const url = z.string().regex(/^https?:\/\/[^\s/]+(\/[^\s]*)?$/, "must be an http(s) URL like http://127.0.0.1:8101");

/** The config keys of run(); anything else is an error naming the key. */
export const RunConfigSchema = z
  .object({
    kv_transport: z
      .string()
      .regex(/^[a-z0-9][a-z0-9-]*$/, "must be a transport name (an installed airm.kv_transports plugin)")
      .default(DEFAULT_KV_TRANSPORT),
    port: port.default(8000),
    host: z.string().min(1).default("0.0.0.0"),
    /** The longest request served (--max-model-len); default the model's context. */
    max_model_len: z
      .number()
      .int()
      .min(8)
      .max(1 << 20)
      .optional(),
    backend: z.string().min(1).optional(),
    /** One URL, or a list: the gateway balances over the replicas by load. */
    prefill_url: z.union([url, z.array(url).min(1)]).default("http://127.0.0.1:8101"),
    decode_url: z.union([url, z.array(url).min(1)]).default("http://127.0.0.1:8102"),
    /** CPU threads of the reference backend (prefill and decode workloads). */
    threads: z.number().int().min(1).max(2).optional(),
    metrics_port: port.optional(),
    args: z.array(z.string()).default([]),
    env: z.record(z.string(), z.string()).default({}),
    dry_run: z.boolean().default(false),
  })
  .strict();
export type RunConfig = z.input<typeof RunConfigSchema>;

const WorkloadSchema = z
  .object({
    kind: z.enum(["prefill", "decode", "serve"]),
    model: z.string().min(1).optional(),
    batch_hint: z.number().int().min(1).max(1024).optional(),
    name: z.string().optional(),
  })
  .passthrough();

export interface ProcessCommand {
  argv: string[];
  env: Record<string, string>;
}

function parse<T>(schema: z.ZodType<T>, value: unknown, what: string): T {
  const r = schema.safeParse(value);
  if (r.success) return r.data;
  const issue = r.error.issues[0];
  const key = issue.code === "unrecognized_keys" ? issue.keys.join(", ") : issue.path.join(".") || what;
  const msg = issue.code === "unrecognized_keys" ? `unknown ${what} key (known: ${Object.keys((schema as z.ZodObject).shape ?? {}).join(", ")})` : issue.message;
  throw new ConfigError(key, msg);
}

/** argv of an airm-worker process. Throws ConfigError (key `backend`) for a backend no installed engine runs in `role`. */
export function workerArgv(o: {
  role: "prefill" | "decode" | "solo";
  backend: string;
  host: string;
  port: number;
  /** --max-model-len (default: the worker's own, the model's context). */
  maxModelLen?: number;
  batch?: number;
  threads?: number;
  /** Decode role: also prefill requests the gateway runs whole here (--local-prefill). */
  localPrefill?: boolean;
}): string[] {
  engineForBackend(o.backend, o.role, pluginRegistry(), "backend");
  const argv = [process.execPath, binPath("@airm/worker", "airm-worker"), "--role", o.role, "--backend", o.backend, "--host", o.host, "--port", String(o.port)];
  if (o.maxModelLen !== undefined) argv.push("--max-model-len", String(o.maxModelLen));
  if (o.batch !== undefined) argv.push("--B", String(o.batch));
  if (o.threads !== undefined) argv.push("--threads", String(o.threads));
  // the worker serves /generate too; which requests run there is the gateway's --disaggregation
  if (o.localPrefill) argv.push("--local-prefill");
  return argv;
}

/** argv of an airm-gateway process in front of the given workers. */
export function gatewayArgv(o: {
  host: string;
  port: number;
  prefill?: string[];
  decode?: string[];
  solo?: string[];
  localPrefill?: boolean;
  /** With localPrefill (default never: the baseline of a comparison, every request prefilled on the decode worker). */
  disaggregation?: "auto" | "always" | "never" | "header";
}): string[] {
  const argv = [process.execPath, binPath("@airm/gateway", "airm-gateway"), "--host", o.host, "--port", String(o.port)];
  for (const role of ["prefill", "decode", "solo"] as const) if (o[role]?.length) argv.push(`--${role}`, o[role]!.join(","));
  if (o.localPrefill) argv.push("--local-prefill", "--disaggregation", o.disaggregation ?? "never");
  return argv;
}

/**
 * The argv and environment additions for one workload, as the seed's table describes:
 * prefill -> RNGD prefill worker (backend rngd-full), decode -> decode worker (backend atom,
 * batch_hint as --B), serve -> the gateway in front of prefill_url and decode_url.
 * Throws ConfigError naming the key for unknown keys and bad values.
 */
export function buildCommand(workload: Workload, config: RunConfig = {}): ProcessCommand {
  const w = parse(WorkloadSchema, workload, "workload");
  const c = parse(RunConfigSchema, config, "config");
  const env: Record<string, string> = { AIRM_KV_TRANSPORT: c.kv_transport };
  if (w.model) env.MODEL = w.model;
  let argv: string[];
  if (w.kind === "serve") {
    if (c.backend) throw new ConfigError("backend", "applies to prefill and decode workloads, not serve");
    if (c.threads !== undefined) throw new ConfigError("threads", "applies to prefill and decode workloads, not serve");
    const list = (u: string | string[]) => (Array.isArray(u) ? u : [u]);
    argv = gatewayArgv({ host: c.host, port: c.port, prefill: list(c.prefill_url), decode: list(c.decode_url) });
    if (c.metrics_port !== undefined) env.AIRM_METRICS_PORT = String(c.metrics_port);
  } else {
    if (c.metrics_port !== undefined) throw new ConfigError("metrics_port", "is the gateway's airm_* port; workers serve /metrics on their own port");
    argv = workerArgv({
      role: w.kind,
      backend: c.backend ?? DEFAULT_BACKENDS[w.kind],
      host: c.host,
      port: c.port,
      maxModelLen: c.max_model_len,
      batch: w.kind === "decode" ? w.batch_hint : undefined,
      threads: c.threads,
    });
  }
  argv.push(...c.args);
  Object.assign(env, c.env);
  return { argv, env };
}

/**
 * Starts the workload's process (stdio inherited) and returns its ChildProcess, or with
 * `dry_run: true` returns `{argv, env}` without starting anything.
 */
export async function run(workload: Workload, config: RunConfig = {}): Promise<ChildProcess | ProcessCommand> {
  const cmd = buildCommand(workload, config);
  if (config.dry_run) return cmd;
  return spawn(cmd.argv[0], cmd.argv.slice(1), { env: { ...process.env, ...cmd.env }, stdio: "inherit" });
}

export const rngdPdWorkload: WorkloadPlugin = { kind: "workload", name: "rngd-pd", run };
