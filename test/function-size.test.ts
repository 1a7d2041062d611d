// Functions stay short enough to read on a screen or two: none over 120 lines in any package
// (measured with the TypeScript parser, nested functions counted inside their parent too), but
// for a short allow list of known long ones, each held to its size today so it cannot grow; an
// entry that no longer needs its place must leave the list.
import { describe, expect, test } from "vitest";
import { functionLengths } from "../scripts/code-size.ts";
import { packageSources, packages } from "./source-files.ts";

const LIMIT = 120;

/** "file name" -> the most lines it may have until it is split (issue 47 splits them). */
const ALLOWED: Record<string, number> = {};

/** "file name" without the line number, the allow list's key. */
const keyOf = (where: string) => where.replace(/:\d+ /, " ");

describe("function size", () => {
  const long = new Map<string, number>();
  test.each(packages())(`no function in %s is over ${LIMIT} lines (but the allowed ones, no longer than they are)`, (pkg) => {
    const all = packageSources(pkg).flatMap(([file, text]) => (file.endsWith(".ts") ? functionLengths(file, text) : []));
    expect(all.length).toBeGreaterThan(0);
    const over = all.filter(([, n]) => n > LIMIT);
    for (const [where, n] of over) long.set(keyOf(where), n);
    expect(over.filter(([where, n]) => !(n <= (ALLOWED[keyOf(where)] ?? 0)))).toEqual([]);
  });

  test("every allowed long function still needs its place", () => {
    for (const pkg of packages())
      for (const [file, text] of packageSources(pkg)) if (file.endsWith(".ts")) for (const [where, n] of functionLengths(file, text)) if (n > LIMIT) long.set(keyOf(where), n);
    expect(Object.keys(ALLOWED).filter((k) => !long.has(k))).toEqual([]);
  });
});
