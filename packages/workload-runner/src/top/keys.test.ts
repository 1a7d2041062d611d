import { describe, expect, test } from "vitest";
import { rowsOf } from "../../test/helpers/top-rows.ts";
import { footerLine, INITIAL_UI, type KeyPress, onKey, splitPresses, type Ui } from "./keys.ts";
import { SORT_KEYS, sortRows } from "./view.ts";

const rows = sortRows(rowsOf(), "name");
const text = (ui: Ui) =>
  footerLine(ui)
    .map((s) => s.text)
    .join("");

/** Presses each key in turn from `ui`; returns the last state and every effect. */
function press(keys: (string | KeyPress)[], ui: Ui = INITIAL_UI, shown = rows) {
  const effects = [];
  for (const k of keys) {
    const step = onKey(ui, typeof k === "string" ? { input: k } : k, shown);
    ui = step.ui;
    if (step.effect) effects.push(step.effect);
  }
  return { ui, effects };
}

describe("keys of the console", () => {
  test("s cycles the sort through every column and back; S reverses", () => {
    const seen = [INITIAL_UI.sort];
    let ui = INITIAL_UI;
    for (let i = 0; i < SORT_KEYS.length; i++) {
      ui = press(["s"], ui).ui;
      seen.push(ui.sort);
    }
    expect(seen.slice(0, -1)).toEqual([...SORT_KEYS]);
    expect(ui.sort).toBe(INITIAL_UI.sort);
    expect(press(["S"]).ui.reverse).toBe(true);
  });

  test("/ types a filter, Enter keeps it, Esc clears it", () => {
    const typed = press(["/", "d", "e", "c", { input: "", backspace: true }, "c"]);
    expect(typed.ui).toMatchObject({ mode: "filter", filter: "dec" });
    expect(text(typed.ui)).toContain("filter: dec");
    expect(press([{ input: "", return: true }], typed.ui).ui).toMatchObject({ mode: "table", filter: "dec" });
    expect(press([{ input: "", escape: true }], typed.ui).ui).toMatchObject({ mode: "table", filter: "" });
  });

  test("arrows and j/k move the selection within the rows", () => {
    expect(press(["j", "j"]).ui.selected).toBe(rows[2].name);
    expect(press([{ input: "", downArrow: true }, { input: "", upArrow: true }, "k"]).ui.selected).toBe(rows[0].name);
    expect(press(Array(20).fill("j")).ui.selected).toBe(rows.at(-1)!.name);
  });

  test("d asks before draining; y drains the selected worker, anything else does not", () => {
    // three decode workers: decode-2 drains, decode-3 takes requests
    const asked = press(["j", "j", "d"], INITIAL_UI, sortRows(rowsOf(3), "name"));
    expect(asked.ui).toMatchObject({ mode: "confirm", confirm: "decode" });
    expect(text(asked.ui)).toContain("drain decode? it takes no new request");
    expect(asked.effects).toEqual([]);
    expect(press(["y"], asked.ui).effects).toEqual([{ kind: "drain", part: "decode", on: true }]);
    const no = press(["n"], asked.ui);
    expect(no.effects).toEqual([]);
    expect(no.ui.mode).toBe("table");
  });

  test("draining the last worker of a role that takes requests warns that the cluster will refuse them", () => {
    // decode-2 drains already: decode is the last decode worker that takes requests
    expect(text(press(["j", "j", "d"]).ui)).toContain("no other decode worker takes requests");
    expect(text(press(["j", "d"]).ui)).toContain("no other prefill worker takes requests");
  });

  test("u resumes at once; d on the gateway or the relay says only workers drain", () => {
    expect(press(["j", "u"]).effects).toEqual([{ kind: "drain", part: "prefill", on: false }]);
    const gw = press(["d"]);
    expect(gw.effects).toEqual([]);
    expect(text(gw.ui)).toContain("gateway is not a worker");
  });

  test("l or Enter opens the selected part's log view, Esc or q close it; q in the table quits", () => {
    expect(press(["j", "l"]).ui).toMatchObject({ mode: "log", logPart: "prefill" });
    expect(press(["j", { input: "", return: true }, "q"]).ui).toMatchObject({ mode: "table", logPart: null });
    expect(press(["q"]).effects).toEqual([{ kind: "quit" }]);
  });

  test("characters read together are as many key presses; escapes and arrows stay whole", () => {
    expect(splitPresses({ input: "ssj" }).map((k) => k.input)).toEqual(["s", "s", "j"]);
    expect(splitPresses({ input: "d-2\r" })).toEqual([{ input: "d" }, { input: "-" }, { input: "2" }, { input: "", return: true }]);
    expect(press(["/", ...splitPresses({ input: "decode-2\r" })]).ui).toMatchObject({ mode: "table", filter: "decode-2" });
    expect(splitPresses({ input: "", upArrow: true })).toHaveLength(1);
    expect(splitPresses({ input: "\u001b[A" })).toHaveLength(1);
  });
});
