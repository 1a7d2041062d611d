// One declaration per package of what configures it: each option's type, its environment
// variable (when it has one), its default and its meaning. Code reads configuration only by
// resolving a spec (explicit options > environment > default); `--help`, the package README,
// docs/configuration.md and the Helm chart's values are all printed from the same rows.

import { z } from "zod";
import { ConfigError } from "../errors.ts";
import { schemaOf, type ValueType } from "./value-types.ts";

/** One option. `HasDefault` records at type level whether resolving always yields a value. */
export interface Opt<T, HasDefault extends boolean = boolean> {
  readonly type: ValueType<T>;
  /** The environment variable that sets it, if any (an option without one is set in code only). */
  readonly env?: string;
  readonly default?: T;
  /** Shown instead of the default when the default is computed elsewhere (e.g. "the engine's"). */
  readonly defaultText?: string;
  /** What it means and what it changes (one or two sentences). */
  readonly doc: string;
  /** Only for measurements or tests; listed, but marked. */
  readonly internal?: boolean;
  readonly __hasDefault?: HasDefault;
}

/** An option that always has a value (its default). */
export function opt<T>(type: ValueType<T>, spec: { env?: string; default: NoInfer<T>; defaultText?: string; doc: string; internal?: boolean }): Opt<T, true>;
/** An option that may stay unset (undefined). */
export function opt<T>(type: ValueType<T>, spec: { env?: string; default?: undefined; defaultText?: string; doc: string; internal?: boolean }): Opt<T, false>;
export function opt<T>(type: ValueType<T>, spec: { env?: string; default?: T; defaultText?: string; doc: string; internal?: boolean }): Opt<T, boolean> {
  return { type, ...spec };
}

// biome-ignore lint/suspicious/noExplicitAny: the option map holds options of any value type
export type OptionMap = Record<string, Opt<any, boolean>>;

/** The resolved values of a spec: options with defaults are always set. */
export type ConfigValues<S extends OptionMap> = {
  -readonly [K in keyof S]: S[K] extends Opt<infer T, true> ? T : S[K] extends Opt<infer T, boolean> ? T | undefined : never;
};

/** One row of a configuration table. */
export interface ConfigRow {
  owner: string;
  option: string;
  env: string | null;
  type: string;
  default: string;
  doc: string;
  internal: boolean;
}

export interface ResolveInput {
  /** The environment to read (default: none: only options and defaults). */
  env?: NodeJS.ProcessEnv | Record<string, string | undefined>;
  /** Values given in code; they win over the environment. Unknown keys are an error. */
  options?: Record<string, unknown>;
}

/** A package's (or a plugin's) configuration declaration. */
export class ConfigSpec<S extends OptionMap> {
  /** The package that declared each option (options merged with `with` keep their own). */
  private readonly owners: Record<string, string>;

  /**
   * @param owner the package (or plugin) that reads these, e.g. "@airm/kv-tcp"
   * @param options the declarations, keyed by option name (camelCase)
   */
  constructor(
    readonly owner: string,
    readonly options: S,
    owners: Record<string, string> = {},
  ) {
    this.owners = Object.fromEntries(Object.keys(options).map((k) => [k, owners[k] ?? owner]));
    const seen = new Set<string>();
    for (const [k, o] of Object.entries(options)) {
      if (!o.env) continue;
      if (!/^[A-Z][A-Z0-9_]*$/.test(o.env)) throw new ConfigError(k, `environment variable name ${JSON.stringify(o.env)} is not UPPER_SNAKE_CASE`);
      if (seen.has(o.env)) throw new ConfigError(o.env, `declared twice in ${owner}`);
      seen.add(o.env);
    }
  }

  /** The zod schema of explicit options (each may be text or a native value). */
  get schema(): z.ZodObject {
    return z.object(Object.fromEntries(Object.entries(this.options).map(([k, o]) => [k, schemaOf(o.type).optional()]))).strict();
  }

  /**
   * Resolves every option: explicit option > environment variable (non-empty) > default.
   * Throws ConfigError naming the option or variable, what it got and what is allowed.
   */
  resolve(input: ResolveInput = {}): ConfigValues<S> {
    const given = input.options ?? {};
    const unknown = Object.keys(given).filter((k) => !(k in this.options) && given[k] !== undefined);
    if (unknown.length) {
      throw new ConfigError(unknown[0], `${this.owner} has no option ${JSON.stringify(unknown[0])}; its options are ${Object.keys(this.options).join(", ")}`);
    }
    const out: Record<string, unknown> = {};
    for (const [k, o] of Object.entries(this.options)) {
      const explicit = given[k];
      const fromEnv = o.env ? input.env?.[o.env] : undefined;
      let raw: unknown;
      let key = k;
      if (explicit !== undefined) raw = explicit;
      else if (typeof fromEnv === "string" && fromEnv.trim() !== "") {
        raw = fromEnv;
        key = o.env!;
      } else {
        out[k] = o.default;
        continue;
      }
      try {
        out[k] = o.type.parse(raw);
      } catch (e) {
        throw new ConfigError(key, `${(e as Error).message} (${firstSentence(o.doc)})`);
      }
    }
    return out as ConfigValues<S>;
  }

  /** The names of the environment variables this spec reads. */
  envNames(): string[] {
    return Object.values(this.options).flatMap((o) => (o.env ? [o.env] : []));
  }

  /** Table rows, in declaration order. */
  rows(): ConfigRow[] {
    return Object.entries(this.options).map(([k, o]) => ({
      owner: this.owners[k],
      option: k,
      env: o.env ?? null,
      type: o.type.label,
      default: o.defaultText ?? (o.default !== undefined ? o.type.show(o.default) : "unset"),
      doc: o.doc,
      internal: o.internal ?? false,
    }));
  }

  /** A spec with the options of both (this spec's owner; each row keeps its declaring package). */
  with<T extends OptionMap>(other: ConfigSpec<T>): ConfigSpec<S & T> {
    const clash = Object.keys(other.options).find((k) => k in this.options);
    if (clash) throw new ConfigError(clash, `declared by both ${this.owners[clash]} and ${other.owners[clash]}`);
    return new ConfigSpec(this.owner, { ...this.options, ...other.options } as S & T, { ...this.owners, ...other.owners });
  }
}

/** Declares a configuration. */
export function defineConfig<S extends OptionMap>(owner: string, options: S): ConfigSpec<S> {
  return new ConfigSpec(owner, options);
}

function firstSentence(doc: string): string {
  const i = doc.search(/[.;](\s|$)/);
  return i > 0 ? doc.slice(0, i) : doc;
}

/** Markdown table of rows (env variables first; options set only in code are listed as such). */
export function configMarkdown(rows: ConfigRow[], options: { withOwner?: boolean } = {}): string {
  const esc = (s: string) => s.replace(/\|/g, "\\|").replace(/\n/g, " ");
  const head = options.withOwner ? "| variable | type | default | read by | meaning |\n|---|---|---|---|---|" : "| variable | type | default | meaning |\n|---|---|---|---|";
  const lines = rows.map((r) => {
    const name = r.env ? `\`${r.env}\`` : `option \`${r.option}\``;
    const meaning = `${esc(r.doc)}${r.internal ? " (measurements and tests only)" : ""}`;
    const cells = options.withOwner ? [name, esc(r.type), `\`${esc(r.default)}\``, r.owner, meaning] : [name, esc(r.type), `\`${esc(r.default)}\``, meaning];
    return `| ${cells.join(" | ")} |`;
  });
  return [head, ...lines].join("\n");
}

/** Plain-text table of the rows that have an environment variable (for --help). */
export function configText(rows: ConfigRow[], width = 100): string {
  const envRows = rows.filter((r) => r.env);
  if (envRows.length === 0) return "";
  const nameW = Math.max(...envRows.map((r) => r.env!.length)) + 2;
  const out: string[] = [];
  for (const r of envRows) {
    const lead = `  ${r.env!.padEnd(nameW)}`;
    const words = `${r.doc} [${r.type}; default ${r.default}]`.split(/\s+/);
    let line = lead;
    for (const w of words) {
      if (line.length + w.length + 1 > width && line.trim().length > 0 && line.length > lead.length) {
        out.push(line.trimEnd());
        line = " ".repeat(lead.length);
      }
      line += `${w} `;
    }
    out.push(line.trimEnd());
  }
  return out.join("\n");
}
