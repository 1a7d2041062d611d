// Numeric ranges checked value by value against xgrammar itself: every candidate string is run
// through the rule our code builds, and must be accepted exactly when it is a JSON number of the
// right kind that lies in the range (compared as exact decimals).
import { beforeAll, describe, expect, test } from "vitest";
import { numberRangeRules, type NumericBounds } from "../src/number-range.ts";
import { loadXgrammar } from "./xgrammar-in-process.ts";

let xg: any;
beforeAll(() => {
  xg = loadXgrammar();
});

/** Exact value of a decimal string as a fraction over 10^6 (the candidates have <= 4 fraction digits). */
function micros(s: string): bigint {
  const neg = s.startsWith("-");
  const [i, f = ""] = (neg ? s.slice(1) : s).split(".");
  const v = BigInt(i) * 1_000_000n + BigInt(`${f}000000`.slice(0, 6));
  return neg ? -v : v;
}
const toMicros = (x: number) => micros(x.toFixed(6));

function inRange(s: string, b: NumericBounds): boolean {
  const v = micros(s);
  if (b.minimum !== undefined && (b.exclusiveMinimum ? v <= toMicros(b.minimum) : v < toMicros(b.minimum))) return false;
  if (b.maximum !== undefined && (b.exclusiveMaximum ? v >= toMicros(b.maximum) : v > toMicros(b.maximum))) return false;
  return true;
}

const JSON_INT = /^-?(0|[1-9][0-9]*)$/;
const JSON_DEC = /^-?(0|[1-9][0-9]*)(\.[0-9]+)?$/;

/** Candidate strings: integers and decimals around the interesting points, and some malformed ones. */
function candidates(): string[] {
  const out = new Set<string>(["-0", "00", "01", "1.", ".5", "1x5", "1,5", "--1", "+1", "1e2", "-", ""]);
  for (let i = -130; i <= 130; i++) {
    out.add(String(i));
    for (const f of ["0", "00", "05", "1", "25", "4999", "5", "50", "5001", "75", "9", "99"]) out.add(`${i < 0 ? "-" : ""}${Math.abs(i)}.${f}`);
  }
  for (const f of ["0", "05", "1", "25", "5", "75", "9"]) out.add(`-0.${f}`);
  return [...out];
}

const CASES: NumericBounds[] = [
  { integer: true, minimum: 1, maximum: 100 },
  { integer: true, minimum: -5 },
  { integer: true, minimum: 2 },
  { integer: true, maximum: -3 },
  { integer: true, minimum: -123, maximum: 42 },
  { integer: true, minimum: 0, exclusiveMinimum: true, maximum: 10, exclusiveMaximum: true },
  { integer: true, minimum: 0.5, maximum: 7.5 },
  { integer: true, minimum: -0.5, maximum: 0.5 },
  { integer: false, minimum: 0, maximum: 1.5 },
  { integer: false, minimum: -10, maximum: 10 },
  { integer: false, minimum: -4, maximum: 4 },
  { integer: false, minimum: 0.5 },
  { integer: false, minimum: 0, exclusiveMinimum: true },
  { integer: false, maximum: 0, exclusiveMaximum: true },
  { integer: false, minimum: 1, maximum: 5 },
  { integer: false, minimum: 2.25, maximum: 2.75 },
  { integer: false, minimum: 2.25, maximum: 2.75, exclusiveMinimum: true, exclusiveMaximum: true },
  { integer: false, minimum: -2.5, maximum: -0.05 },
  { integer: false, minimum: 99.5, maximum: 120 },
  { integer: false, minimum: -0.25, maximum: 0.25 },
  { integer: false, maximum: 3.5 },
];

describe("numeric range rules", () => {
  test.each(CASES.map((c) => [JSON.stringify(c), c] as const))("%s", async (_, b) => {
    const rules = numberRangeRules("airm_r0", b, "test");
    const grammar = await xg.Grammar.fromEBNF(`root ::= airm_r0\n${rules.join("\n")}\n`);
    const wrong: string[] = [];
    for (const s of candidates()) {
      const form = b.integer ? JSON_INT : JSON_DEC;
      const want = form.test(s) && s !== "-0" && !/^-0(\.0*)?$/.test(s) && inRange(s, b);
      const got = await xg.Testings.isGrammarAcceptString(grammar, s);
      if (got !== want) wrong.push(`${s}: ${got ? "accepted" : "refused"}`);
    }
    grammar.dispose();
    expect(wrong).toEqual([]);
  });

  test("an empty range is refused with the place named", () => {
    expect(() => numberRangeRules("r", { integer: true, minimum: 3, maximum: 2 }, "response_format at /properties/n")).toThrow(
      /response_format at \/properties\/n: no integer lies between the minimum and the maximum/,
    );
    expect(() => numberRangeRules("r", { integer: true, minimum: 0.2, maximum: 0.8 }, "x")).toThrow(/no integer/);
    expect(() => numberRangeRules("r", { integer: false, minimum: 1, maximum: 1, exclusiveMaximum: true }, "x")).toThrow(/no number/);
  });
});
