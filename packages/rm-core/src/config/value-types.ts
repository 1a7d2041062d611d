// The value types a configuration entry or a command-line flag can have. Each takes either the
// text of an environment variable or a flag (trimmed; "" means unset) or a value given in code,
// and yields the typed value or throws an Error whose message says what is allowed. The same
// parsers serve env variables, CLI flags and plugin options, so "8000", " 8000 " and 8000 mean
// one thing everywhere.

import { z } from "zod";

export interface ValueType<T> {
  /** How tables and help show the type: "integer 1..8", "0|1", "host:port", "a|b". */
  readonly label: string;
  /** Parses text (env, CLI) or a value given in code. Throws Error(message) when not allowed. */
  parse(raw: unknown): T;
  /** How a default shows in tables. */
  show(value: T): string;
}

/** The zod schema of a value type (accepts text or a native value, outputs T). */
export function schemaOf<T>(type: ValueType<T>): z.ZodType<T> {
  return z.unknown().transform((v, ctx) => {
    try {
      return type.parse(v);
    } catch (e) {
      ctx.addIssue({ code: "custom", message: (e as Error).message });
      return z.NEVER;
    }
  }) as unknown as z.ZodType<T>;
}

const INT_TEXT = /^[+-]?\d+$/;

function rangeText(min: number | undefined, max: number | undefined): string {
  if (min !== undefined && max !== undefined) return `${min}..${max}`;
  if (min !== undefined) return `>= ${min}`;
  if (max !== undefined) return `<= ${max}`;
  return "";
}

/**
 * Parses a whole number from text ("42", "+42", "-1") or a number, within [min, max].
 * Throws Error naming what is allowed. This is the one integer parser of every bin and config.
 */
export function parseInteger(raw: unknown, range: { min?: number; max?: number } = {}): number {
  let n: number;
  if (typeof raw === "number") n = raw;
  else if (typeof raw === "string" && INT_TEXT.test(raw.trim())) n = Number(raw.trim());
  else throw new Error(`expected a whole number${range.min !== undefined || range.max !== undefined ? ` ${rangeText(range.min, range.max)}` : ""}, got ${JSON.stringify(raw)}`);
  if (!Number.isSafeInteger(n)) throw new Error(`expected a whole number, got ${JSON.stringify(raw)}`);
  if ((range.min !== undefined && n < range.min) || (range.max !== undefined && n > range.max)) {
    throw new Error(`expected a whole number ${rangeText(range.min, range.max)}, got ${n}`);
  }
  return n;
}

/** A whole number within [min, max]. */
export function int(range: { min?: number; max?: number } = {}): ValueType<number> {
  const r = rangeText(range.min, range.max);
  return { label: r ? `integer ${r}` : "integer", parse: (raw) => parseInteger(raw, range), show: String };
}

/** A finite number within [min, max]; `positive` excludes 0. */
export function num(range: { min?: number; max?: number; positive?: boolean } = {}): ValueType<number> {
  const bounds = range.positive ? "> 0" : rangeText(range.min, range.max);
  return {
    label: bounds ? `number ${bounds}` : "number",
    parse(raw) {
      const n = typeof raw === "number" ? raw : typeof raw === "string" && raw.trim() !== "" ? Number(raw.trim()) : Number.NaN;
      if (!Number.isFinite(n)) throw new Error(`expected a number${bounds ? ` ${bounds}` : ""}, got ${JSON.stringify(raw)}`);
      if ((range.positive && n <= 0) || (range.min !== undefined && n < range.min) || (range.max !== undefined && n > range.max)) {
        throw new Error(`expected a number ${bounds}, got ${n}`);
      }
      return n;
    },
    show: String,
  };
}

const TRUE = ["1", "true", "yes", "on"];
const FALSE = ["0", "false", "no", "off"];

/** A switch: 1/0, true/false, yes/no, on/off, or a boolean. */
export function flag(): ValueType<boolean> {
  return {
    label: "0|1",
    parse(raw) {
      if (typeof raw === "boolean") return raw;
      const t = typeof raw === "string" ? raw.trim().toLowerCase() : "";
      if (TRUE.includes(t)) return true;
      if (FALSE.includes(t)) return false;
      throw new Error(`expected 0 or 1, got ${JSON.stringify(raw)}`);
    },
    show: (v) => (v ? "1" : "0"),
  };
}

/** Any non-empty text (a path, a URL, a name), optionally matching `pattern`. */
export function text(options: { label?: string; pattern?: RegExp; hint?: string } = {}): ValueType<string> {
  return {
    label: options.label ?? "text",
    parse(raw) {
      if (typeof raw !== "string" || raw.trim() === "") throw new Error(`expected ${options.label ?? "text"}, got ${JSON.stringify(raw)}`);
      const v = raw.trim();
      if (options.pattern && !options.pattern.test(v)) throw new Error(`${JSON.stringify(v)} is not ${options.hint ?? options.label ?? `like ${options.pattern}`}`);
      return v;
    },
    show: (v) => v,
  };
}

/** One of a fixed set of words. */
export function oneOf<const W extends readonly string[]>(words: W): ValueType<W[number]> {
  return {
    label: words.join("|"),
    parse(raw) {
      const v = typeof raw === "string" ? raw.trim() : raw;
      if (typeof v !== "string" || !words.includes(v)) throw new Error(`expected one of ${words.join(", ")}, got ${JSON.stringify(raw)}`);
      return v as W[number];
    },
    show: (v) => v,
  };
}

/** "host:port" or "[v6]:port" (port 0..65535), kept as text. */
export function hostPort(): ValueType<string> {
  return {
    label: "host:port",
    parse(raw) {
      const v = typeof raw === "string" ? raw.trim() : "";
      const m = /^(?:\[([^\]]+)\]|([^:\s]+)):(\d{1,5})$/.exec(v);
      if (!m || Number(m[3]) > 65535) throw new Error(`${JSON.stringify(raw)} is not host:port (e.g. 127.0.0.1:7400, or [::1]:7400)`);
      return v;
    },
    show: (v) => v,
  };
}

/** A list of `item`s separated by commas (or `separator`; an array in code). Empty text is an empty list. */
export function list<T>(item: ValueType<T>, separator: RegExp = /,/): ValueType<T[]> {
  return {
    label: `${item.label},...`,
    parse(raw) {
      const parts = Array.isArray(raw)
        ? raw
        : typeof raw === "string"
          ? raw
              .split(separator)
              .map((s) => s.trim())
              .filter(Boolean)
          : null;
      if (parts === null) throw new Error(`expected a comma-separated list of ${item.label}, got ${JSON.stringify(raw)}`);
      return parts.map((p, i) => {
        try {
          return item.parse(p);
        } catch (e) {
          throw new Error(`item ${i + 1}: ${(e as Error).message}`);
        }
      });
    },
    show: (v) => v.map((x) => item.show(x)).join(","),
  };
}
