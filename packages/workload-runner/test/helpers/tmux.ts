// A terminal program under test in a real terminal: a tmux server of the test's own (its own
// socket, so no user session is touched) runs one command in a window of a given size; keys are
// typed with send-keys and the screen read with capture-pane.

import { execFileSync, spawnSync } from "node:child_process";

export class Tmux {
  private readonly socket = `airm-test-${process.pid}-${Math.random().toString(36).slice(2, 8)}`;
  private readonly session = "t";

  /** Starts `argv` (with `env` on top of this process's, less `unset`) in a `width` x `height` window. */
  start(argv: string[], o: { width: number; height: number; env?: Record<string, string>; unset?: string[] }): void {
    const env = { ...process.env, ...o.env };
    for (const k of o.unset ?? []) delete env[k];
    const sets = Object.entries(o.env ?? {}).flatMap(([k, v]) => ["-e", `${k}=${v}`]);
    this.tmux(["new-session", "-d", "-s", this.session, "-x", String(o.width), "-y", String(o.height), ...sets, ...argv], env);
  }

  /** Types keys (tmux names: "Enter", "Escape", "Down", or plain text). */
  keys(...keys: string[]): void {
    for (const k of keys) this.tmux(["send-keys", "-t", this.session, k]);
  }

  /** The screen as text, one line per row. */
  capture(): string {
    return this.tmux(["capture-pane", "-p", "-t", this.session]);
  }

  /** Whether the command still runs (the session ends with it). */
  running(): boolean {
    return spawnSync("tmux", ["-L", this.socket, "has-session", "-t", this.session]).status === 0;
  }

  /** Waits until the screen satisfies `ok`; returns it. Throws with the last screen after `ms`. */
  async waitFor(ok: (screen: string) => boolean, ms: number, what: string): Promise<string> {
    const end = Date.now() + ms;
    let screen = "";
    while (Date.now() < end) {
      screen = this.screenIfRunning();
      if (ok(screen)) return screen;
      await new Promise((r) => setTimeout(r, 250));
    }
    throw new Error(`timed out waiting for ${what}; the screen:\n${screen}`);
  }

  /** The screen, or "" once the session has ended (it may end between the check and the capture). */
  private screenIfRunning(): string {
    if (!this.running()) return "";
    try {
      return this.capture();
    } catch (e) {
      if (!this.running()) return "";
      throw e;
    }
  }

  /** Stops the server and whatever it runs. */
  kill(): void {
    spawnSync("tmux", ["-L", this.socket, "kill-server"]);
  }

  private tmux(args: string[], env?: NodeJS.ProcessEnv): string {
    return execFileSync("tmux", ["-L", this.socket, ...args], { encoding: "utf8", env: env ?? process.env });
  }
}
