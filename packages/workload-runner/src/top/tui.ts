// The full-screen console of `airm top`, painted with ink (React for terminals): a poller reads
// the cluster every interval (collect.ts, snapshot.ts), the screen is the lines view.ts computes
// for the window's size, and keys go through keys.ts. top-command.ts imports this module only
// when the console runs, so no other command loads React.

import { Box, type Key, render, Text, useApp, useInput, useWindowSize } from "ink";
import { createElement as h, type ReactElement, useEffect, useRef, useState } from "react";
import { type Http, takeSample } from "./collect.ts";
import { setDrain } from "./drain.ts";
import { type Effect, footerLine, INITIAL_UI, onKey, splitPresses, type Ui } from "./keys.ts";
import { type Snapshot, Watch } from "./snapshot.ts";
import type { Source, Target } from "./targets.ts";
import { type Line, logScreen, type Screen, tableScreen, visibleRows } from "./view.ts";

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

/** Reads the cluster every `intervalMs` and tells its listeners each snapshot. */
export class Poller {
  readonly watch: Watch;
  latest: Snapshot | null = null;
  /** The parts of the last reading, by name (a drain's URL, a log's source). */
  targets = new Map<string, Target>();
  private stopped = false;
  private readonly listeners = new Set<(s: Snapshot) => void>();

  constructor(
    readonly source: Source,
    readonly http: Http,
    private readonly intervalMs: number,
  ) {
    this.watch = new Watch(source.label);
  }

  start(): void {
    void this.loop();
  }

  stop(): void {
    this.stopped = true;
  }

  subscribe(l: (s: Snapshot) => void): () => void {
    this.listeners.add(l);
    if (this.latest) l(this.latest);
    return () => this.listeners.delete(l);
  }

  private async loop(): Promise<void> {
    while (!this.stopped) {
      const t0 = Date.now();
      const r = await takeSample(this.source, this.http);
      this.targets = new Map(r.parts.map((p) => [p.target.name, p.target]));
      this.latest = this.watch.add(r);
      for (const l of this.listeners) l(this.latest);
      await sleep(Math.max(100, this.intervalMs - (Date.now() - t0)));
    }
  }
}

/** The log lines of a part (or why there are none). */
async function readLog(t: Target | undefined, lines: number): Promise<{ where: string; lines: string[] }> {
  if (!t?.logs) return { where: "", lines: ["no log lines known for this part: airm top reads them from airm up's state file or, with --k8s, from the API server"] };
  try {
    return { where: t.logs.where, lines: await t.logs.read(lines) };
  } catch (e) {
    return { where: t.logs.where, lines: [`cannot read its log: ${(e as Error).message}`] };
  }
}

/** ink's key to the fields keys.ts reads. */
const keyPress = (input: string, k: Key) => ({
  input,
  upArrow: k.upArrow,
  downArrow: k.downArrow,
  return: k.return,
  escape: k.escape,
  backspace: k.backspace,
  delete: k.delete,
  ctrl: k.ctrl,
});

/** Runs a key's effect: quit, or a drain whose outcome becomes the key bar's message. */
function runEffect(effect: Effect, poller: Poller, setUi: (f: (u: Ui) => Ui) => void, exit: () => void): void {
  if (!effect) return;
  if (effect.kind === "quit") {
    exit();
    return;
  }
  const t = poller.targets.get(effect.part) ?? { name: effect.part, drainUrl: null };
  void setDrain(t, effect.on, poller.source, poller.http).then((o) => setUi((u) => ({ ...u, message: { text: o.text, error: !o.ok } })));
}

/** One screen line as ink elements. */
const paint = (l: Line, i: number) =>
  h(Text, { key: i, wrap: "truncate" }, ...l.map((s, j) => h(Text, { key: j, color: s.color, bold: s.bold, inverse: s.inverse, dimColor: s.dim }, s.text)));

/** The log view's lines, re-read at every reading while it is open. */
function useLog(poller: Poller, ui: Ui, rows: number): { where: string; lines: string[] } | null {
  const [log, setLog] = useState<{ where: string; lines: string[] } | null>(null);
  useEffect(() => {
    const part = ui.mode === "log" ? ui.logPart : null;
    if (!part) {
      setLog(null);
      return;
    }
    let live = true;
    const unsubscribe = poller.subscribe(() => void readLog(poller.targets.get(part), Math.max(10, rows)).then((l) => live && setLog(l)));
    return () => {
      live = false;
      unsubscribe();
    };
  }, [poller, ui.mode, ui.logPart, rows]);
  return log;
}

/** The console: the table or the log view for the window's size, redrawn at every reading and key. */
function App({ poller }: { poller: Poller }): ReactElement {
  const { exit } = useApp();
  const { columns, rows } = useWindowSize();
  const [snapshot, setSnapshot] = useState<Snapshot | null>(poller.latest);
  const [ui, setUi] = useState<Ui>(INITIAL_UI);
  useEffect(() => poller.subscribe(setSnapshot), [poller]);
  const log = useLog(poller, ui, rows);
  // the state keys read: the latest, even when two reads of the terminal come before a render
  const current = useRef(ui);
  current.current = ui;
  const screenOf = (u: Ui): Screen => ({
    snapshot,
    trend: poller.watch.trend,
    sort: u.sort,
    reverse: u.reverse,
    filter: u.filter,
    selected: u.selected,
    footer: footerLine(u),
    log: null,
  });
  useInput((input, key) => {
    let next = current.current;
    for (const press of splitPresses(keyPress(input, key))) {
      const step = onKey(next, press, visibleRows(screenOf(next)), snapshot?.parts ?? []);
      next = step.ui;
      runEffect(step.effect, poller, setUi, exit);
    }
    current.current = next;
    setUi(next);
  });
  const screen = screenOf(ui);
  const lines =
    ui.mode === "log" && ui.logPart
      ? logScreen({ ...screen, log: { part: ui.logPart, where: log?.where ?? "", lines: log?.lines ?? [] } }, columns, rows)
      : tableScreen(screen, columns, rows);
  return h(Box, { flexDirection: "column" }, ...lines.map(paint));
}

/** Starts the console in the terminal's alternate screen; resolves when the user quits. */
export async function runTui(source: Source, http: Http, intervalMs: number): Promise<void> {
  const poller = new Poller(source, http, intervalMs);
  poller.start();
  const app = render(h(App, { poller }), { alternateScreen: true, interactive: true, exitOnCtrlC: true, patchConsole: true, incrementalRendering: true, maxFps: 10 });
  try {
    await app.waitUntilExit();
  } finally {
    poller.stop();
  }
}
