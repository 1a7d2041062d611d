// Command lines of every rngd-pd bin and bench: flags declared once with the value types of the
// config layer (node:util parseArgs underneath, strict: an unknown flag is an error), help text
// printed from the same declaration plus the environment table of the configs the command reads.

import { parseArgs } from "node:util";
import { UsageError } from "../errors.ts";
import { type ConfigSpec, configText, type OptionMap } from "./config-spec.ts";
import type { ValueType } from "./value-types.ts";

export interface Flag<T, HasDefault extends boolean = boolean> {
  /** Undefined for a switch (no value). */
  readonly type?: ValueType<T>;
  readonly default?: T;
  readonly defaultText?: string;
  readonly doc: string;
  readonly short?: string;
  /** The flag as typed, when it is not the kebab-case of its key (e.g. "B" for --B). */
  readonly name?: string;
  /** Shown after the flag in help, e.g. "URL[,URL...]". */
  readonly metavar?: string;
  readonly __hasDefault?: HasDefault;
}

/** A flag that takes a value and has a default. */
export function flagOf<T>(type: ValueType<T>, spec: { default: NoInfer<T>; doc: string; short?: string; name?: string; metavar?: string }): Flag<T, true>;
/** A flag that takes a value and may be left out. */
export function flagOf<T>(type: ValueType<T>, spec: { default?: undefined; defaultText?: string; doc: string; short?: string; name?: string; metavar?: string }): Flag<T, false>;
export function flagOf<T>(type: ValueType<T>, spec: { default?: T; defaultText?: string; doc: string; short?: string; name?: string; metavar?: string }): Flag<T, boolean> {
  return { type, ...spec };
}

/** A switch (`--quiet`); false unless given. */
export function switchOf(spec: { doc: string; short?: string; name?: string }): Flag<boolean, true> {
  return { ...spec, default: false };
}

// biome-ignore lint/suspicious/noExplicitAny: flags of any value type
export type FlagMap = Record<string, Flag<any, boolean>>;

export type FlagValues<F extends FlagMap> = {
  -readonly [K in keyof F]: F[K] extends Flag<infer T, true> ? T : F[K] extends Flag<infer T, boolean> ? T | undefined : never;
};

export interface CommandSpec<F extends FlagMap> {
  /** The command as typed, e.g. "airm-worker" or "airm up". */
  name: string;
  /** One line: what it does. */
  summary: string;
  /** Usage lines without the "usage: " prefix. */
  usage: string[];
  flags: F;
  /** Positional arguments allowed (default none). */
  positionals?: { min: number; max: number };
  /** The configurations this command's process reads (their env tables close the help). */
  env?: ConfigSpec<OptionMap>[];
  /** Text after the flags (details, examples). */
  notes?: string;
}

export interface ParsedCommand<F extends FlagMap> {
  values: FlagValues<F>;
  positionals: string[];
  /** True when --help was asked for (values are then defaults). */
  help: boolean;
}

function flagName<F extends FlagMap>(key: string, f: F[string]): string {
  return f.name ?? key.replace(/[A-Z]/g, (c) => `-${c.toLowerCase()}`);
}

export class Command<F extends FlagMap> {
  constructor(readonly spec: CommandSpec<F>) {}

  /**
   * Parses argv. Throws UsageError (exit 2) naming the flag for an unknown flag, a missing value,
   * a value its type refuses, or the wrong number of positionals.
   */
  parse(argv: string[]): ParsedCommand<F> {
    const options: Record<string, { type: "string" | "boolean"; short?: string }> = { help: { type: "boolean", short: "h" } };
    const valued = new Set<string>();
    for (const [key, f] of Object.entries(this.spec.flags)) {
      const name = flagName(key, f);
      options[name] = { type: f.type ? "string" : "boolean", ...(f.short ? { short: f.short } : {}) };
      if (f.type) valued.add(`--${name}`);
    }
    // "--chip -1": parseArgs would take "-1" for an option; join a negative number to its flag.
    const args = argv.flatMap((a, i) => (valued.has(argv[i - 1] ?? "") && /^-\d/.test(a) ? [] : valued.has(a) && /^-\d/.test(argv[i + 1] ?? "") ? [`${a}=${argv[i + 1]}`] : [a]));
    let parsed: ReturnType<typeof parseArgs>;
    try {
      parsed = parseArgs({ args, options, strict: true, allowPositionals: (this.spec.positionals?.max ?? 0) > 0 });
    } catch (e) {
      throw new UsageError(`${this.spec.name}: ${(e as Error).message.split("\n")[0]}`);
    }
    const help = parsed.values.help === true;
    const values: Record<string, unknown> = {};
    for (const [key, f] of Object.entries(this.spec.flags)) {
      const name = flagName(key, f);
      const raw = parsed.values[name];
      if (raw === undefined || help) {
        values[key] = f.default;
        continue;
      }
      if (!f.type) {
        values[key] = raw === true;
        continue;
      }
      try {
        values[key] = f.type.parse(raw);
      } catch (e) {
        throw new UsageError(`${this.spec.name}: --${name}: ${(e as Error).message}`);
      }
    }
    const pos = parsed.positionals;
    const { min = 0, max = 0 } = this.spec.positionals ?? {};
    if (!help && (pos.length < min || pos.length > max)) {
      throw new UsageError(`${this.spec.name}: expected ${min === max ? min : `${min} to ${max}`} argument(s), got ${pos.length}${pos.length ? ` (${pos.join(" ")})` : ""}`);
    }
    return { values: values as FlagValues<F>, positionals: pos, help };
  }

  /** The --help text: summary, usage, every flag with its type and default, then the environment. */
  help(): string {
    const s = this.spec;
    const lines = [`${s.name}: ${s.summary}`, "", ...s.usage.map((u, i) => `${i === 0 ? "usage: " : "       "}${u}`), ""];
    const entries = Object.entries(s.flags).map(([key, f]) => {
      const name = flagName(key, f);
      const lead = `${f.short ? `-${f.short}, ` : ""}--${name}${f.type ? ` ${f.metavar ?? f.type.label.toUpperCase().replace(/\s+/g, "_")}` : ""}`;
      const dflt = f.type ? (f.default !== undefined ? `default ${f.type.show(f.default)}` : (f.defaultText ?? "")) : "";
      return [lead, dflt ? `${f.doc} (${dflt})` : f.doc] as const;
    });
    entries.push(["-h, --help", "this text"]);
    const w = Math.min(34, Math.max(...entries.map(([l]) => l.length)) + 2);
    for (const [lead, doc] of entries) {
      const pad = lead.length + 2 > w ? `  ${lead}\n  ${" ".repeat(w)}` : `  ${lead.padEnd(w)}`;
      lines.push(`${pad}${wrap(doc, 100 - w - 2).join(`\n  ${" ".repeat(w)}`)}`);
    }
    if (s.notes) lines.push("", s.notes.trimEnd());
    const envRows = (s.env ?? []).flatMap((c) => c.rows());
    const envText = configText(envRows);
    if (envText) lines.push("", "environment:", envText);
    return `${lines.join("\n")}\n`;
  }
}

function wrap(text: string, width: number): string[] {
  const out: string[] = [];
  let line = "";
  for (const w of text.split(/\s+/)) {
    if (line && line.length + w.length + 1 > width) {
      out.push(line);
      line = w;
    } else line = line ? `${line} ${w}` : w;
  }
  if (line) out.push(line);
  return out;
}

/** Declares a command line. */
export function defineCommand<F extends FlagMap>(spec: CommandSpec<F>): Command<F> {
  return new Command(spec);
}
