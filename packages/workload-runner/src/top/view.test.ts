import { describe, expect, test } from "vitest";
import { FOOTER_PLACEHOLDER, rowsOf, snapshotOf } from "../../test/helpers/top-rows.ts";
import { Watch } from "./snapshot.ts";
import { filterRows, fmtRate, fmtSeconds, layoutColumns, lineLength, logScreen, plainText, type Screen, sortRows, sparkline, tableScreen } from "./view.ts";

const screen = (over: Partial<Screen> = {}): Screen => ({
  snapshot: snapshotOf(rowsOf()),
  trend: new Watch("t").trend,
  sort: "name",
  reverse: false,
  filter: "",
  selected: null,
  footer: FOOTER_PLACEHOLDER,
  log: null,
  ...over,
});

describe("the screen", () => {
  test.each([
    [80, 24],
    [120, 40],
    [200, 50],
  ])("fills %i x %i exactly: every line that wide, that many lines", (w, h) => {
    const lines = tableScreen(screen(), w, h);
    expect(lines).toHaveLength(h);
    for (const l of lines) expect(lineLength(l)).toBe(w);
  });

  test("80 columns show the load of every part; a wider window adds engine, transport, breaker and device", () => {
    const titles = (w: number) => layoutColumns(w).map((c) => c.title);
    expect(titles(80)).toEqual(["PART", "ROLE", "STATE", "RUN", "WAIT", "BATCH", "KV BLOCKS", "HIT", "KV IN", "KV OUT", "RST"]);
    expect(titles(200)).toEqual(expect.arrayContaining(["ENGINE/BACKEND", "KV VIA", "BREAKER", "DEVICE"]));
    const at80 = plainText(tableScreen(screen({ selected: "decode-2" }), 80, 24));
    for (const name of ["gateway", "prefill", "decode", "decode-2", "kv-relay"]) expect(at80).toContain(name);
    // what the row has no room for is in the selected part's detail line
    expect(at80).toContain("decode-2: engine atom/atom  device cpu:cpu-reference  KV via tcp");
  });

  test("a table taller than the screen scrolls to keep the selected row in view", () => {
    const many = rowsOf(30);
    const text = plainText(tableScreen(screen({ snapshot: snapshotOf(many), selected: "decode-29" }), 80, 24));
    expect(text).toContain(">decode-29");
    expect(text).not.toContain(" gateway ");
  });

  test("the log view wraps long lines and keeps the newest at the bottom", () => {
    const lines = ["first", "x".repeat(100), "last"];
    const text = plainText(logScreen(screen({ log: { part: "decode", where: "/tmp/decode.log", lines } }), 80, 24)).split("\n");
    expect(text).toHaveLength(24);
    const body = text.slice(2, -1).filter(Boolean);
    expect(body).toEqual(["first", "x".repeat(80), "x".repeat(20), "last"]);
  });
});

describe("sorting and filtering", () => {
  const rows = rowsOf();

  test("by name: the gateway, then prefill, then decode workers in number order, then the relay", () => {
    expect(sortRows(rows, "name").map((r) => r.name)).toEqual(["gateway", "prefill", "decode", "decode-2", "kv-relay"]);
  });

  test("by a figure: largest first, ties in name order; reversed: the other way", () => {
    const byRun = sortRows(rows, "running").map((r) => [r.name, r.running]);
    const values = byRun.map(([, v]) => (v as number | null) ?? -1);
    expect(values).toEqual([...values].sort((a, b) => b - a));
    expect(sortRows(rows, "running", true).map((r) => r.name)).toEqual(byRun.map(([n]) => n).reverse());
  });

  test("a filter keeps the rows whose name, role or state holds it", () => {
    expect(filterRows(rows, "DECODE").map((r) => r.name)).toEqual(["decode", "decode-2"]);
    expect(filterRows(rows, "drain").map((r) => r.name)).toEqual(["decode-2"]);
    expect(filterRows(rows, "")).toHaveLength(rows.length);
  });
});

describe("figures in a few columns", () => {
  test("rates, durations and sparklines", () => {
    expect([fmtRate(null), fmtRate(0.2), fmtRate(812), fmtRate(12_345), fmtRate(3_400_000), fmtRate(250_000_000)]).toEqual(["-", "0", "812", "12.3k", "3.4M", "250M"]);
    expect([fmtSeconds(0.0004), fmtSeconds(0.042), fmtSeconds(1.26), fmtSeconds(42)]).toEqual(["400us", "42ms", "1.3s", "42s"]);
    // bars 0..7 of the largest value: 1/4 -> 1.75 -> 2, 2/4 -> 3.5 -> 4
    expect(sparkline([0, 1, 2, 4], 4)).toBe("▁▃▅█");
    expect(sparkline([0, 0], 4)).toBe("  ▁▁");
    expect(sparkline([5, 1, 2, 3, 4, 8], 3)).toBe("▄▅█");
  });
});
