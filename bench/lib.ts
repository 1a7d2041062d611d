// Shared bench plumbing: strict command lines, repeat-and-summarise, the final JSON line,
// TTY-only progress.

import { spawn, type ChildProcess } from "node:child_process";
import { once } from "node:events";
import { createInterface } from "node:readline";
import { defineCommand, type FlagMap, type FlagValues } from "@airm/rm-core";
import { sseEvents as events } from "../packages/workload-runner/src/bench/sse.ts";

export interface Summary {
  median: number;
  min: number;
  max: number;
  n: number;
}

export function summarize(xs: number[]): Summary {
  const s = [...xs].sort((a, b) => a - b);
  const mid = s.length >> 1;
  const median = s.length % 2 ? s[mid] : (s[mid - 1] + s[mid]) / 2;
  return { median, min: s[0], max: s[s.length - 1], n: s.length };
}

export function fmt(s: Summary, unit = "ms", digits = 2): string {
  return `${s.median.toFixed(digits)} ${unit} (min ${s.min.toFixed(digits)}, max ${s.max.toFixed(digits)}, n=${s.n})`;
}

/** Prints the bench's one final JSON line (always last on stdout). */
export function finalLine(obj: Record<string, unknown>): void {
  // numbers to 4 decimals, in nested objects too
  console.log(JSON.stringify(obj, (_k, v: unknown) => (typeof v === "number" && !Number.isInteger(v) ? Number(v.toFixed(4)) : v)));
}

/** Progress on a TTY only (stderr), quiet in CI and pipes. */
export function progress(msg: string): void {
  if (process.stderr.isTTY) process.stderr.write(`\r\x1b[K${msg}`);
}
export function progressDone(): void {
  if (process.stderr.isTTY) process.stderr.write("\r\x1b[K");
}

/**
 * Parses a bench's command line with rm-core's command parser (strict: an unknown flag or a bad
 * value is an error, not ignored). Prints the help and exits 0 for --help, 2 on a usage error.
 */
export function benchArgs<F extends FlagMap>(name: string, summary: string, flags: F, argv = process.argv.slice(2)): FlagValues<F> {
  const cmd = defineCommand({ name: `pnpm bench ${name}`, summary, usage: [`pnpm bench ${name} [options]`], flags });
  try {
    const { values, help } = cmd.parse(argv);
    if (help) {
      process.stdout.write(cmd.help());
      process.exit(0);
    }
    return values;
  } catch (e) {
    process.stderr.write(`${(e as Error).message}\n\n${cmd.help()}`);
    process.exit(2);
  }
}

/** The parsed JSON of each `data:` event of an OpenAI server-sent-event stream (the load generator's parser). */
export function sseEvents(body: ReadableStream<Uint8Array>): AsyncGenerator<any> {
  return events<any>(body);
}

/**
 * A child process spoken to in lines (a bench's producer, a sidecar): `start` waits for the line
 * matching `ready`; `ask` sends a command and returns the answer after its expected prefix.
 */
export class LineChild {
  private constructor(
    readonly proc: ChildProcess,
    private readonly lines: AsyncIterator<string>,
  ) {}

  static async start(args: string[], ready: RegExp, cwd?: string): Promise<{ child: LineChild; match: RegExpExecArray }> {
    const proc = spawn(process.execPath, args, { cwd, stdio: ["pipe", "pipe", "inherit"] });
    const child = new LineChild(proc, createInterface({ input: proc.stdout! })[Symbol.asyncIterator]());
    for (;;) {
      const r = await child.lines.next();
      if (r.done) throw new Error(`${args.join(" ")} ended before it was ready`);
      const match = ready.exec(r.value);
      if (match) return { child, match };
    }
  }

  async ask(cmd: string, prefix: string): Promise<string> {
    this.proc.stdin!.write(`${cmd}\n`);
    const r = await this.lines.next();
    if (r.done || !r.value.startsWith(prefix)) throw new Error(`the child said ${JSON.stringify(r.done ? "(it ended)" : r.value)} to ${cmd}, expected "${prefix}"`);
    return r.value.slice(prefix.length).trim();
  }

  /** Asks it to exit (the "exit" command, or SIGTERM for a server), SIGKILL after 5 s. */
  async stop(how: "exit" | "SIGTERM" = "exit"): Promise<void> {
    if (this.proc.exitCode !== null || this.proc.signalCode !== null) return;
    const exited = once(this.proc, "exit");
    if (how === "exit") this.proc.stdin!.write("exit\n");
    else this.proc.kill("SIGTERM");
    const timer = setTimeout(() => this.proc.kill("SIGKILL"), 5000);
    await exited;
    clearTimeout(timer);
  }
}
