// What a key does in `airm top`: the console's modes (the table, typing a filter, confirming a
// drain, a part's log lines) and their keys, as a pure step from one state to the next plus the
// effect to run (quit, drain or resume a worker). The ink layer (tui.ts) feeds it key presses.

import type { PartRow } from "./snapshot.ts";
import { type Line, KEYS_LINE, SORT_KEYS, type SortKey } from "./view.ts";

export type Mode = "table" | "filter" | "confirm" | "log";

export interface Ui {
  mode: Mode;
  sort: SortKey;
  reverse: boolean;
  filter: string;
  /** The selected part's name (null: the first row). */
  selected: string | null;
  /** The part a drain waits for a "y" for, and what draining it would do to the cluster if it is the last of its role. */
  confirm: string | null;
  confirmWarning: string | null;
  /** The part whose log lines are shown. */
  logPart: string | null;
  /** A line for the key bar until the next key. */
  message: { text: string; error: boolean } | null;
}

export const INITIAL_UI: Ui = { mode: "table", sort: "name", reverse: false, filter: "", selected: null, confirm: null, confirmWarning: null, logPart: null, message: null };

/** A key press as ink reports it (the fields used here). */
export interface KeyPress {
  input: string;
  upArrow?: boolean;
  downArrow?: boolean;
  return?: boolean;
  escape?: boolean;
  backspace?: boolean;
  delete?: boolean;
  ctrl?: boolean;
}

export type Effect = { kind: "quit" } | { kind: "drain"; part: string; on: boolean } | null;

export interface Step {
  ui: Ui;
  effect: Effect;
}

const stay = (ui: Ui): Step => ({ ui, effect: null });

/** The selected row among `rows` (the first when none is, or it is filtered out). */
export function selectedRow(ui: Ui, rows: PartRow[]): PartRow | undefined {
  return rows.find((r) => r.name === ui.selected) ?? rows[0];
}

/** The selection moved by `by` rows (clamped). */
function move(ui: Ui, rows: PartRow[], by: number): Ui {
  if (!rows.length) return ui;
  const at = Math.max(
    0,
    rows.findIndex((r) => r.name === selectedRow(ui, rows)?.name),
  );
  return { ...ui, selected: rows[Math.max(0, Math.min(rows.length - 1, at + by))].name };
}

/** `d` or `u` on the selected row: a drain asks for a confirmation; a resume runs at once. */
function drainKey(ui: Ui, rows: PartRow[], all: PartRow[], on: boolean): Step {
  const r = selectedRow(ui, rows);
  if (!r) return stay(ui);
  if (r.kind !== "worker") return stay({ ...ui, message: { text: `${r.name} is not a worker: only workers drain`, error: true } });
  if (!on) return { ui: { ...ui, message: { text: `resuming ${r.name}...`, error: false } }, effect: { kind: "drain", part: r.name, on: false } };
  return stay({ ...ui, mode: "confirm", confirm: r.name, confirmWarning: lastOfRole(r, all) });
}

/** A warning when `r` is the last worker of its role that takes requests (among all the parts). */
function lastOfRole(r: PartRow, all: PartRow[]): string | null {
  const others = all.filter((x) => x.kind === "worker" && x.role === r.role && x.name !== r.name && x.state === "ok");
  return others.length ? null : `no other ${r.role} worker takes requests: the cluster will refuse them`;
}

/** A key in the table. */
function tableKey(ui: Ui, k: KeyPress, rows: PartRow[], all: PartRow[]): Step {
  const cleared = { ...ui, message: null };
  if (k.input === "q" || (k.ctrl && k.input === "c")) return { ui: cleared, effect: { kind: "quit" } };
  if (k.upArrow || k.input === "k") return stay(move(cleared, rows, -1));
  if (k.downArrow || k.input === "j") return stay(move(cleared, rows, 1));
  if (k.input === "s") return stay({ ...cleared, sort: SORT_KEYS[(SORT_KEYS.indexOf(ui.sort) + 1) % SORT_KEYS.length] });
  if (k.input === "S") return stay({ ...cleared, reverse: !ui.reverse });
  if (k.input === "/") return stay({ ...cleared, mode: "filter" });
  if (k.input === "l" || k.return) {
    const r = selectedRow(ui, rows);
    return stay(r ? { ...cleared, mode: "log", logPart: r.name, selected: r.name } : cleared);
  }
  if (k.input === "d" || k.input === "u") return drainKey(cleared, rows, all, k.input === "d");
  if (k.escape) return stay({ ...cleared, filter: "" });
  return stay(cleared);
}

/** A key while typing the filter: Enter keeps it, Esc clears it. */
function filterKey(ui: Ui, k: KeyPress): Step {
  if (k.return) return stay({ ...ui, mode: "table" });
  if (k.escape) return stay({ ...ui, mode: "table", filter: "" });
  if (k.backspace || k.delete) return stay({ ...ui, filter: ui.filter.slice(0, -1) });
  if (k.ctrl && k.input === "c") return { ui, effect: { kind: "quit" } };
  if (k.input && !k.ctrl && /^[\x20-\x7e]+$/.test(k.input)) return stay({ ...ui, filter: ui.filter + k.input });
  return stay(ui);
}

/** A key while a drain waits for its confirmation: y drains, anything else cancels. */
function confirmKey(ui: Ui, k: KeyPress): Step {
  const part = ui.confirm!;
  const back = { ...ui, mode: "table" as const, confirm: null, confirmWarning: null };
  if (k.input === "y" || k.input === "Y") return { ui: { ...back, message: { text: `draining ${part}...`, error: false } }, effect: { kind: "drain", part, on: true } };
  return stay({ ...back, message: { text: `${part}: not drained`, error: false } });
}

/** A key in the log view: Esc, q, l or Enter go back to the table. */
function logKey(ui: Ui, k: KeyPress): Step {
  if (k.ctrl && k.input === "c") return { ui, effect: { kind: "quit" } };
  if (k.escape || k.return || k.input === "q" || k.input === "l") return stay({ ...ui, mode: "table", logPart: null });
  return stay(ui);
}

/**
 * The key presses in one read of the terminal: a terminal (or tmux send-keys) may deliver several
 * typed characters at once ("ss", "decode-2\r"), which are as many presses (a carriage return is
 * Enter); an escape sequence (an arrow) or a key ink named is one.
 */
export function splitPresses(k: KeyPress): KeyPress[] {
  const special = k.upArrow || k.downArrow || k.return || k.escape || k.backspace || k.delete || k.ctrl;
  if (special || k.input.length <= 1 || k.input.includes("\x1b")) return [k];
  return [...k.input].flatMap((c): KeyPress[] => (c === "\r" || c === "\n" ? [{ input: "", return: true }] : /^[\x20-\x7e]$/.test(c) ? [{ input: c }] : []));
}

/** One key press: the next state and what to do. `rows` are the rows shown, in order; `all` every part. */
export function onKey(ui: Ui, k: KeyPress, rows: PartRow[], all: PartRow[] = rows): Step {
  switch (ui.mode) {
    case "table":
      return tableKey(ui, k, rows, all);
    case "filter":
      return filterKey(ui, k);
    case "confirm":
      return confirmKey(ui, k);
    case "log":
      return logKey(ui, k);
  }
}

/** The key bar for a state: the prompt of a mode, a message, or the keys. */
export function footerLine(ui: Ui): Line {
  if (ui.mode === "filter") return [{ text: " filter: ", bold: true }, { text: ui.filter }, { text: "_", color: "cyan" }, { text: "   Enter keep  Esc clear", dim: true }];
  if (ui.mode === "confirm")
    return [
      { text: ` drain ${ui.confirm}? `, bold: true, color: "yellow" },
      ui.confirmWarning ? { text: `${ui.confirmWarning} `, color: "red", bold: true } : { text: "it takes no new request; what runs there finishes " },
      { text: "[y/N]", bold: true },
    ];
  if (ui.mode === "log") return [{ text: " Esc", bold: true, color: "cyan" }, { text: " back to the table" }];
  if (ui.message) return [{ text: ` ${ui.message.text}`, color: ui.message.error ? "red" : "green", bold: true }];
  return KEYS_LINE;
}
