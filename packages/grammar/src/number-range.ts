// EBNF (xgrammar's dialect) for the JSON numbers a JSON-schema `integer` or `number` with bounds
// admits: minimum, maximum, exclusiveMinimum, exclusiveMaximum (numeric, or draft-4 booleans).
// xgrammar 0.1.27 builds these ranges wrongly (a maximum of 10 admits 10.5, a fractional bound's
// dot matches any character, exclusive bounds count as inclusive), so the schema preparation puts
// these rules in their place. Integers are written `-?(0|[1-9][0-9]*)`; ranged numbers the same
// with an optional fraction and no exponent (a subset of JSON's numbers, every value reachable).
// Knows decimal strings and digit automata; nothing of schemas or tokenizers.

import { GrammarError } from "@airm/rm-core";

/** An exact non-negative decimal: integer digits (no leading zeros, "0" for zero) and fraction digits (no trailing zeros). */
interface Decimal {
  int: string;
  frac: string;
}

/** One end of a range: an exact non-negative magnitude, inclusive or not; null is unbounded. */
interface Bound {
  at: Decimal;
  inclusive: boolean;
}

export interface NumericBounds {
  integer: boolean;
  minimum?: number;
  maximum?: number;
  exclusiveMinimum?: boolean;
  exclusiveMaximum?: boolean;
}

/** Most digits a bound may have: past this the grammar grows without serving any real schema. */
const MAX_DIGITS = 40;

const ZERO: Decimal = { int: "0", frac: "" };

/** The exact decimal digits of a finite double's magnitude (String(x) is exact for what it prints). */
function decimalOf(x: number, where: string): Decimal {
  if (!Number.isFinite(x)) throw new GrammarError(`${where}: a bound must be a finite number, got ${x}`, { invalid: true });
  const m = /^(\d+)(?:\.(\d+))?(?:e([+-]\d+))?$/.exec(String(Math.abs(x)));
  if (!m) throw new GrammarError(`${where}: cannot read the bound ${x}`, { invalid: true });
  let digits = m[1] + (m[2] ?? "");
  let point = m[1].length + Number(m[3] ?? 0);
  if (point <= 0) {
    digits = "0".repeat(1 - point) + digits;
    point = 1;
  }
  if (point > digits.length) digits += "0".repeat(point - digits.length);
  const int = digits.slice(0, point).replace(/^0+(?=\d)/, "");
  const frac = digits.slice(point).replace(/0+$/, "");
  if (int.length + frac.length > MAX_DIGITS)
    throw new GrammarError(`${where}: ${x} has more than ${MAX_DIGITS} digits; this server does not build ranges that wide`, { invalid: true });
  return { int, frac };
}

function cmpDecimal(a: Decimal, b: Decimal): number {
  if (a.int.length !== b.int.length) return a.int.length - b.int.length;
  if (a.int !== b.int) return a.int < b.int ? -1 : 1;
  const n = Math.max(a.frac.length, b.frac.length);
  const fa = a.frac.padEnd(n, "0");
  const fb = b.frac.padEnd(n, "0");
  return fa === fb ? 0 : fa < fb ? -1 : 1;
}

const isZero = (d: Decimal) => d.int === "0" && d.frac === "";

/** The natural number one more or one less than digit string `s` (s >= 1 for minus). */
function plusOne(s: string): string {
  return (BigInt(s) + 1n).toString();
}
function minusOne(s: string): string {
  return (BigInt(s) - 1n).toString();
}

function digitClass(lo: number, hi: number): string {
  return lo === hi ? `"${lo}"` : `[${lo}-${hi}]`;
}

function seq(parts: string[]): string {
  const p = parts.filter((x) => x !== "");
  return p.length === 0 ? '""' : p.join(" ");
}

function alt(parts: string[]): string {
  const p = [...new Set(parts)];
  if (p.length === 0) throw new Error("empty alternation");
  return p.length === 1 ? p[0] : `(${p.map((x) => `(${x})`).join(" | ")})`;
}

/** Digit strings of length n from lo to hi (both of length n, lo <= hi), leading zeros as given. */
function sameLength(lo: string, hi: string): string {
  const n = lo.length;
  if (/^0*$/.test(lo) && /^9*$/.test(hi)) return seq(Array(n).fill("[0-9]"));
  if (n === 1) return digitClass(Number(lo), Number(hi));
  if (lo[0] === hi[0]) return seq([`"${lo[0]}"`, sameLength(lo.slice(1), hi.slice(1))]);
  const a = Number(lo[0]);
  const b = Number(hi[0]);
  const parts = [seq([`"${a}"`, sameLength(lo.slice(1), "9".repeat(n - 1))])];
  if (a + 1 <= b - 1) parts.push(seq([digitClass(a + 1, b - 1), ...Array(n - 1).fill("[0-9]")]));
  parts.push(seq([`"${b}"`, sameLength("0".repeat(n - 1), hi.slice(1))]));
  return alt(parts);
}

/** Natural numbers (no leading zeros) from lo to hi, hi null for unbounded; null when lo > hi. */
function naturals(lo: string, hi: string | null): string | null {
  if (hi !== null && (hi.length < lo.length || (hi.length === lo.length && hi < lo))) return null;
  const parts: string[] = [];
  const top = hi === null ? lo.length : hi.length;
  for (let d = lo.length; d <= top; d++) {
    const from = d === lo.length ? lo : `1${"0".repeat(d - 1)}`;
    const to = hi !== null && d === hi.length ? hi : "9".repeat(d);
    parts.push(sameLength(from, to));
  }
  if (hi === null) parts.push(seq(["[1-9]", ...Array(lo.length).fill("[0-9]"), "[0-9]*"]));
  return alt(parts);
}

// --- fractions as digit automata ----------------------------------------------------------------
// A fraction is the digit string D after the point (empty: no fraction), worth 0.D. "0.D >= 0.A"
// and "0.D <= 0.B" are small automata over digits; their product, written as right-recursive
// rules, is the language of fractions between two bounds.

interface Dfa {
  start: number;
  accept: boolean[];
  /** next[state][digit]; -1 is dead. */
  next: number[][];
}

/** 0.D >= 0.A (> when exclusive); A has no trailing zeros. States: equal after i digits, greater. */
function atLeast(a: string, inclusive: boolean): Dfa {
  const n = a.length;
  const greater = n + 1;
  const next: number[][] = [];
  const accept: boolean[] = [];
  for (let i = 0; i <= n; i++) {
    next.push(Array.from({ length: 10 }, (_, d) => (i === n ? (d === 0 ? n : greater) : d > Number(a[i]) ? greater : d === Number(a[i]) ? i + 1 : -1)));
    accept.push(i === n && inclusive);
  }
  next.push(Array(10).fill(greater));
  accept.push(true);
  return { start: 0, accept, next };
}

/** 0.D <= 0.B (< when exclusive); B has no trailing zeros. States: equal after i digits, less. */
function atMost(b: string, inclusive: boolean): Dfa {
  const n = b.length;
  const less = n + 1;
  const next: number[][] = [];
  const accept: boolean[] = [];
  for (let i = 0; i <= n; i++) {
    next.push(Array.from({ length: 10 }, (_, d) => (i === n ? (d === 0 ? n : -1) : d < Number(b[i]) ? less : d === Number(b[i]) ? i + 1 : -1)));
    accept.push(i < n || inclusive);
  }
  next.push(Array(10).fill(less));
  accept.push(true);
  return { start: 0, accept, next };
}

const ANY_DIGITS: Dfa = { start: 0, accept: [true], next: [Array(10).fill(0)] };

/**
 * Rules for the optional fraction (`""` or `"." digits`) whose value both automata accept, named
 * `${name}_...`; null when no fraction (not even none) is accepted.
 */
function fractionRules(name: string, a: Dfa, b: Dfa, rules: string[]): string | null {
  const ids = new Map<string, number>();
  const states: Array<[number, number]> = [];
  const idOf = (x: number, y: number): number => {
    const key = `${x},${y}`;
    let id = ids.get(key);
    if (id === undefined) {
      id = states.length;
      ids.set(key, id);
      states.push([x, y]);
    }
    return id;
  };
  idOf(a.start, b.start);
  const edges: number[][] = [];
  for (let i = 0; i < states.length; i++) {
    const [x, y] = states[i];
    edges.push(Array.from({ length: 10 }, (_, d) => (a.next[x][d] < 0 || b.next[y][d] < 0 ? -1 : idOf(a.next[x][d], b.next[y][d]))));
  }
  const accepts = states.map(([x, y]) => a.accept[x] && b.accept[y]);
  // States from which an accepting state is reachable.
  const live = accepts.slice();
  for (let changed = true; changed; ) {
    changed = false;
    for (let i = 0; i < states.length; i++) if (!live[i] && edges[i].some((j) => j >= 0 && live[j])) changed = live[i] = true;
  }
  if (!live[0]) return null;
  const every = (i: number) => accepts[i] && edges[i].every((j) => j === i);
  const ref = (i: number) => (every(i) ? "[0-9]*" : `${name}_${i}`);
  /** One or more digits from state i onwards: the digits grouped by the state they lead to. */
  const steps = (i: number): string[] => {
    const out: string[] = [];
    for (let d = 0; d < 10; ) {
      const j = edges[i][d];
      let e = d;
      while (e + 1 < 10 && edges[i][e + 1] === j) e++;
      if (j >= 0 && live[j]) out.push(seq([digitClass(d, e), ref(j)]));
      d = e + 1;
    }
    return out;
  };
  const written = new Set<number>();
  const write = (i: number): void => {
    if (every(i) || written.has(i)) return;
    written.add(i);
    rules.push(`${name}_${i} ::= ${alt([...(accepts[i] ? ['""'] : []), ...steps(i)])}`);
    for (const j of edges[i]) if (j >= 0 && live[j]) write(j);
  };
  const first = steps(0);
  for (const j of edges[0]) if (j >= 0 && live[j]) write(j);
  const parts = [...(accepts[0] ? ['""'] : []), ...(first.length ? [seq(['"."', alt(first)])] : [])];
  return parts.length ? alt(parts) : null;
}

// --- ranges of magnitudes ------------------------------------------------------------------------

/**
 * Decimal strings (`int` or `int.frac`, no exponent) whose value lies between `lo` and `hi`
 * (hi null: unbounded), both non-negative; null when none does. `integer`: no fraction at all.
 */
function magnitudes(name: string, lo: Bound, hi: Bound | null, integer: boolean, rules: string[]): string | null {
  if (integer) {
    // Whole numbers only: round the bounds inwards.
    const from = lo.at.frac === "" && lo.inclusive ? lo.at.int : plusOne(lo.at.int);
    const to = hi === null ? null : hi.at.frac !== "" || hi.inclusive ? hi.at.int : hi.at.int === "0" ? null : minusOne(hi.at.int);
    if (hi !== null && to === null) return null;
    return naturals(from, to);
  }
  if (hi !== null) {
    const c = cmpDecimal(lo.at, hi.at);
    if (c > 0 || (c === 0 && !(lo.inclusive && hi.inclusive))) return null;
  }
  const parts: string[] = [];
  const lower = atLeast(lo.at.frac, lo.inclusive);
  if (hi !== null && hi.at.int === lo.at.int) {
    const f = fractionRules(`${name}_f0`, lower, atMost(hi.at.frac, hi.inclusive), rules);
    if (f !== null) parts.push(seq([`"${lo.at.int}"`, f]));
  } else {
    const f = fractionRules(`${name}_f1`, lower, ANY_DIGITS, rules);
    if (f !== null) parts.push(seq([`"${lo.at.int}"`, f]));
    const between = naturals(plusOne(lo.at.int), hi === null ? null : minusOne(hi.at.int));
    if (between !== null) parts.push(seq([between, '("" | "." [0-9]+)']));
    if (hi !== null) {
      const g = fractionRules(`${name}_f2`, ANY_DIGITS, atMost(hi.at.frac, hi.inclusive), rules);
      if (g !== null) parts.push(seq([`"${hi.at.int}"`, g]));
    }
  }
  return parts.length ? alt(parts) : null;
}

/**
 * The rules of a rule named `name` matching exactly the JSON numbers in `b` (see the module
 * comment for the form). Throws GrammarError (invalid, naming `where`) when no number is in the
 * range or a bound cannot be read.
 */
export function numberRangeRules(name: string, b: NumericBounds, where: string): string[] {
  const rules: string[] = [];
  const lo = b.minimum === undefined ? null : { value: b.minimum, at: decimalOf(b.minimum, where), inclusive: !b.exclusiveMinimum };
  const hi = b.maximum === undefined ? null : { value: b.maximum, at: decimalOf(b.maximum, where), inclusive: !b.exclusiveMaximum };
  const parts: string[] = [];
  // Non-negative values: [max(lo, 0), hi].
  if (hi === null || hi.value >= 0) {
    const from: Bound = lo === null || lo.value < 0 ? { at: ZERO, inclusive: true } : lo;
    const m = magnitudes(`${name}_p`, from, hi, b.integer, rules);
    if (m !== null) parts.push(m);
  }
  // Negative values: "-" and a magnitude in (max(0, -hi), -lo], never "-0".
  if (lo === null || lo.value < 0) {
    const from: Bound = hi === null || hi.value >= 0 ? { at: ZERO, inclusive: false } : hi;
    const m = magnitudes(`${name}_n`, isZero(from.at) ? { at: ZERO, inclusive: false } : from, lo, b.integer, rules);
    if (m !== null) parts.push(seq(['"-"', m]));
  }
  if (parts.length === 0) {
    throw new GrammarError(`${where}: no ${b.integer ? "integer" : "number"} lies between the minimum and the maximum`, { invalid: true });
  }
  rules.unshift(`${name} ::= ${alt(parts)}`);
  return rules;
}
