// A worker's grammar engine: compiled grammars (cached by spec and vocabulary) and the matchers of
// its constrained requests, all in one xgrammar thread, so compiling never holds the worker's event
// loop. A matcher is the engine's TokenConstraint: the worker advances it with each token (the
// thread starts on the next mask at once) and the engine reads the mask after its forward pass,
// so the mask is computed while the model runs. Specs are checked (GrammarChecker) before the
// engine thread compiles them: nothing that could abort its instance reaches it.

import { GrammarError, type TokenConstraint } from "@airm/rm-core";
import { GrammarChecker } from "./grammar-checker.ts";
import { type GrammarSpec, grammarKey, recipeOf } from "./grammar-spec.ts";
import { MASK_FILL_US, MASK_SEQ, MASK_STATUS, MASK_WORDS_AT, MaskStatus, type VocabInit } from "./grammar-thread.ts";
import { GrammarThread } from "./grammar-thread-client.ts";

export type { VocabInit } from "./grammar-thread.ts";

export interface GrammarEngineOptions {
  /** Compiled grammars kept per worker (least recently used go first; grammars in use stay). */
  maxCompiled?: number;
  /** Longest a sampler waits for a mask before the request fails (ms). */
  maskTimeoutMs?: number;
}

/** What the engine has done, for metrics and benches. */
export interface GrammarEngineStats {
  compiles: number;
  compileMs: number;
  opens: number;
  /** Masks read by samplers, and the time the thread spent computing them (us). */
  masks: number;
  maskFillUs: number;
  /** Time samplers waited for a mask that was not ready yet (us): what constraints added to steps. */
  maskWaitUs: number;
}

export class GrammarEngine {
  private thread: GrammarThread;
  private ready: Promise<void>;
  private nextMatcher = 1;
  private readonly checker = new GrammarChecker();
  private readonly open = new Set<GrammarMatcher>();
  readonly stats: GrammarEngineStats = { compiles: 0, compileMs: 0, opens: 0, masks: 0, maskFillUs: 0, maskWaitUs: 0 };
  readonly words: number;

  private constructor(
    private readonly vocab: VocabInit,
    private readonly options: Required<GrammarEngineOptions>,
  ) {
    this.words = Math.ceil(vocab.vocabSize / 32);
    this.thread = new GrammarThread(options.maxCompiled);
    this.ready = this.thread.request({ op: "init", vocab }).then(() => {});
    this.ready.catch(() => {});
  }

  /**
   * Starts an engine for a vocabulary (building xgrammar's tokenizer info in the thread: ~0.2 s
   * for 49k tokens). Resolves at once; the first open waits for the thread.
   */
  static start(vocab: VocabInit, options: GrammarEngineOptions = {}): GrammarEngine {
    return new GrammarEngine(vocab, { maxCompiled: options.maxCompiled ?? 64, maskTimeoutMs: options.maskTimeoutMs ?? 60_000 });
  }

  /** Resolves when the engine thread has the vocabulary (rejects with GrammarError if it cannot). */
  whenReady(): Promise<void> {
    return this.ready;
  }

  /** A fresh thread when the last one ended (its matchers have failed already). */
  private live(): GrammarThread {
    if (this.thread.ended === null) return this.thread;
    this.thread = new GrammarThread(this.options.maxCompiled);
    this.ready = this.thread.request({ op: "init", vocab: this.vocab }).then(() => {});
    this.ready.catch(() => {});
    return this.thread;
  }

  /** Resolves when `spec` builds into a grammar; throws GrammarError (invalid, naming `param`) when it does not. */
  check(spec: GrammarSpec, param: string): Promise<void> {
    return this.checker.check(spec, param);
  }

  /**
   * A matcher for `spec` that has accepted `replay` (the tokens already generated under it).
   * `param` names the request field in errors. Throws GrammarError: invalid specs (400), a replay
   * the grammar rejects, the engine failing.
   */
  async matcher(spec: GrammarSpec, replay: number[], param: string): Promise<GrammarMatcher> {
    await this.checker.check(spec, param);
    const thread = this.live();
    await this.ready;
    const shared = new SharedArrayBuffer(4 * (MASK_WORDS_AT + this.words));
    const m = new GrammarMatcher(this, thread, this.nextMatcher++, shared, replay);
    const key = grammarKey(spec);
    const r = await thread.request({ op: "open", mid: m.id, key: `${this.vocab.vocabSize}:${key}`, recipe: recipeOf(spec, param), replay, shared });
    this.stats.opens++;
    if (r.compiled) {
      this.stats.compiles++;
      this.stats.compileMs += r.ms;
    }
    this.open.add(m);
    if (m.rejectedReplay()) {
      m.close();
      throw new GrammarError(`${param}: the grammar does not accept the ${replay.length} token(s) generated before (${replay.join(", ")})`, { param, invalid: false });
    }
    return m;
  }

  /** @internal */
  forget(m: GrammarMatcher): void {
    this.open.delete(m);
  }

  /** Matchers open now. */
  get openMatchers(): number {
    return this.open.size;
  }

  get maskTimeoutMs(): number {
    return this.options.maskTimeoutMs;
  }

  async close(): Promise<void> {
    await Promise.all([this.thread.close(), this.checker.close()]);
  }
}

/**
 * One request's place in its grammar. `advance` after each token that came out (the thread starts
 * on the next mask), `allowedTokens` when the sampler needs it, `close` at the end.
 */
export class GrammarMatcher implements TokenConstraint {
  private readonly ctl: Int32Array;
  private readonly mask: Int32Array;
  /** Publications of the thread this matcher has asked for (the open is the first). */
  private expected = 1;
  private closed = false;
  /** Every token the matcher accepted, the replay included: what a new matcher replays to reach the same place. */
  readonly accepted: number[];

  /** @internal */
  constructor(
    private readonly engine: GrammarEngine,
    private readonly thread: GrammarThread,
    readonly id: number,
    shared: SharedArrayBuffer,
    replay: number[],
  ) {
    this.ctl = new Int32Array(shared, 0, MASK_WORDS_AT);
    this.mask = new Int32Array(shared, 4 * MASK_WORDS_AT);
    this.accepted = [...replay];
  }

  /** @internal True when the tokens replayed at open were not all accepted. */
  rejectedReplay(): boolean {
    return Atomics.load(this.ctl, MASK_SEQ) >= 1 && Atomics.load(this.ctl, MASK_STATUS) === MaskStatus.rejected;
  }

  /** Accepts `token` (the one just sampled) and starts the next mask. */
  advance(token: number): void {
    if (this.closed) throw new GrammarError("the grammar matcher is closed", { invalid: false });
    this.accepted.push(token);
    this.expected++;
    this.thread.post({ op: "advance", mid: this.id, token });
  }

  allowedTokens(): Int32Array | null {
    if (this.closed) throw new GrammarError("the grammar matcher is closed", { invalid: false });
    const stats = this.engine.stats;
    if (Atomics.load(this.ctl, MASK_SEQ) < this.expected) {
      const t0 = performance.now();
      const deadline = t0 + this.engine.maskTimeoutMs;
      for (;;) {
        const seq = Atomics.load(this.ctl, MASK_SEQ);
        if (seq >= this.expected) break;
        if (this.thread.ended !== null) throw new GrammarError(`the grammar engine thread ended (${this.thread.ended})`, { invalid: false });
        const left = deadline - performance.now();
        if (left <= 0) throw new GrammarError(`the grammar engine gave no mask within ${this.engine.maskTimeoutMs} ms`, { invalid: false });
        Atomics.wait(this.ctl, MASK_SEQ, seq, Math.min(left, 1000));
      }
      stats.maskWaitUs += (performance.now() - t0) * 1000;
    }
    stats.masks++;
    stats.maskFillUs += Atomics.load(this.ctl, MASK_FILL_US);
    switch (Atomics.load(this.ctl, MASK_STATUS)) {
      case MaskStatus.mask:
        return this.mask;
      case MaskStatus.all:
        return null;
      case MaskStatus.terminated:
        throw new GrammarError("the grammar has ended (it accepted an end-of-sequence token); no token may follow", { invalid: false });
      case MaskStatus.rejected:
        throw new GrammarError(`the grammar does not accept token ${this.accepted[this.accepted.length - 1]} at this position`, { invalid: false });
      default:
        throw new GrammarError("the grammar engine failed on this request", { invalid: false });
    }
  }

  /** Frees the matcher in the thread. Idempotent. */
  close(): void {
    if (this.closed) return;
    this.closed = true;
    this.engine.forget(this);
    this.thread.post({ op: "close", mid: this.id });
  }
}
