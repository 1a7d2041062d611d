// Checks that a structured-output spec builds into a grammar, without a vocabulary: what the
// gateway runs to answer 400 before any worker is called, and what a worker runs before its
// engine thread compiles (xgrammar aborts its whole wasm instance on a bad schema, regex or
// grammar, so the checking happens in a thread of its own that is replaced after an abort).
// Checks run one at a time; specs that passed are remembered.

import { GrammarError, isAirmError } from "@airm/rm-core";
import { type GrammarSpec, grammarKey, recipeOf } from "./grammar-spec.ts";
import { GrammarThread } from "./grammar-thread-client.ts";

/** Specs remembered as good (by key). */
const REMEMBERED = 512;

export class GrammarChecker {
  private thread: GrammarThread | null = null;
  private readonly good = new Set<string>();
  private queue: Promise<unknown> = Promise.resolve();
  private closed = false;
  /** Checks sent to a thread, the ones xgrammar aborted on, and the threads started. */
  readonly counts = { checked: 0, aborted: 0, threads: 0 };

  /**
   * Resolves when `spec` builds into a grammar. `param` names the request field. Throws
   * GrammarError: `invalid` (with xgrammar's reason) when it does not, else a failure of the
   * checker itself.
   */
  check(spec: GrammarSpec, param: string): Promise<void> {
    const key = grammarKey(spec);
    if (this.good.has(key)) return Promise.resolve();
    const run = this.queue.then(() => this.checkNow(spec, key, param));
    this.queue = run.catch(() => {});
    return run;
  }

  private async checkNow(spec: GrammarSpec, key: string, param: string): Promise<void> {
    if (this.good.has(key)) return;
    if (this.closed) throw new GrammarError("the grammar checker is closed", { invalid: false });
    const recipe = recipeOf(spec, param);
    if (this.thread === null || this.thread.ended !== null) {
      this.thread = new GrammarThread(0);
      this.counts.threads++;
    }
    this.counts.checked++;
    try {
      await this.thread.request({ op: "check", recipe });
    } catch (e) {
      if (isAirmError(e, "GRAMMAR") && (e as GrammarError).invalid) {
        this.counts.aborted++;
        this.thread = null; // it aborted and is gone; the next check starts a fresh one
        throw new GrammarError(`${param}: ${(e as Error).message}`, { param, invalid: true });
      }
      throw e;
    }
    this.good.add(key);
    if (this.good.size > REMEMBERED) this.good.delete(this.good.values().next().value as string);
  }

  async close(): Promise<void> {
    this.closed = true;
    await this.thread?.close();
    this.thread = null;
  }
}
