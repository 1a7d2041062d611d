// The body of a grammar thread: one xgrammar (wasm) instance, loaded from the npm package's UMD
// bundle, that either checks grammars (no tokenizer: a checker) or compiles them against a
// vocabulary and runs matchers (an engine). It runs as an eval'd script (no TypeScript loader in
// the thread), so `grammarThreadMain` and `GrammarHost` must stay self-contained: no imports, no
// outer names (the class reaches the function as its argument).
// Masks reach the caller through a SharedArrayBuffer per matcher, so the caller can read them
// synchronously while its forward pass runs; everything else is a message with a reply.

/** Layout of a matcher's shared buffer, in 32-bit words. */
export const MASK_SEQ = 0;
export const MASK_STATUS = 1;
/** How long the thread took to compute the last mask (microseconds). */
export const MASK_FILL_US = 2;
/** Where the bitmask starts. */
export const MASK_WORDS_AT = 4;

/** What a matcher's status word says. */
export const MaskStatus = { mask: 0, all: 1, terminated: 2, rejected: 3, failed: 4 } as const;

/** What the thread turns into a grammar (built on the caller's side from a GrammarSpec). */
export type Recipe =
  | { kind: "ebnf"; ebnf: string }
  | { kind: "structural_tag"; json: string }
  | { kind: "json_schema"; schema: string; anyWhitespace: boolean; splices: { literal: string; rule: string; rules: string[] }[] };

export interface VocabInit {
  tokens: string[];
  type: "byte_level" | "byte_fallback" | "raw";
  prependSpace: boolean;
  vocabSize: number;
  stopIds: number[];
}

export type ThreadRequest =
  | { op: "init"; id: number; vocab: VocabInit }
  | { op: "check"; id: number; recipe: Recipe }
  | { op: "open"; id: number; mid: number; key: string; recipe: Recipe; replay: number[]; shared: SharedArrayBuffer }
  | { op: "advance"; mid: number; token: number }
  | { op: "close"; mid: number };

/** `compiled`: the open had to compile its grammar (`ms` is then mostly compile time). */
export type ThreadReply = { id: number; ok: true; ms: number; compiled?: boolean } | { id: number; ok: false; message: string; aborted: boolean };

// biome-ignore lint/suspicious/noExplicitAny: the thread has no types of xgrammar's bundle
type Any = any;
type Entry = { m: Any; ctl: Int32Array; mask: Int32Array; key: string };

/**
 * One thread's xgrammar instance: its compiler (after init), the compiled grammars (LRU, at most
 * `maxCompiled` unused ones kept) and the open matchers, each publishing its masks into its shared
 * buffer. Its text is sent to the thread with grammarThreadMain's, so it names nothing outside.
 */
export class GrammarHost {
  compiler: Any = null;
  words = 0;
  readonly compiled = new Map<string, { grammar: Any; users: number }>();
  readonly matchers = new Map<number, Entry>();

  constructor(
    readonly xg: Any,
    readonly maxCompiled: number,
    /** What xgrammar said on stderr lately (the reason it gives before an abort). */
    readonly said: string[],
  ) {}

  /** The reason xgrammar gave before it aborted, without its source location. */
  lastReason(fallback: string): string {
    const fatal = [...this.said].reverse().find((l) => l.includes("[FATAL]") || l.includes("[ERROR]"));
    if (!fatal) return fallback;
    return fatal
      .replace(/^.*?\[(FATAL|ERROR)\]\s*\S+:\d+:\s*/, "")
      .replace(/^Check failed: \(.*?\) is false: /, "")
      .trim();
  }

  async build(r: Any): Promise<Any> {
    const xg = this.xg;
    switch (r.kind) {
      case "ebnf":
        return xg.Grammar.fromEBNF(r.ebnf);
      case "structural_tag":
        return xg.Grammar.fromStructuralTag(r.json);
      case "json_schema": {
        const g = r.anyWhitespace ? await xg.Grammar.fromJSONSchema(r.schema, true) : await xg.Grammar.fromJSONSchema(r.schema, false, -1, [", ", ": "]);
        if (r.splices.length === 0) return g;
        let text: string = g.toString();
        g.dispose();
        for (const s of r.splices) {
          if (!text.includes(s.literal)) throw new Error(`the grammar engine's output lost the range rule ${s.rule}`);
          text = text.split(s.literal).join(s.rule);
        }
        return xg.Grammar.fromEBNF(`${text}\n${r.splices.flatMap((s: Any) => s.rules).join("\n")}\n`);
      }
      default:
        throw new Error(`unknown grammar recipe ${r.kind}`);
    }
  }

  publish(entry: Entry, status: number, bits?: Int32Array, us = 0): void {
    if (bits) entry.mask.set(bits.subarray(0, this.words));
    Atomics.store(entry.ctl, 2, Math.round(us));
    Atomics.store(entry.ctl, 1, status);
    Atomics.add(entry.ctl, 0, 1);
    Atomics.notify(entry.ctl, 0);
  }

  async fill(entry: Entry): Promise<void> {
    if (entry.m.isTerminated()) return this.publish(entry, 2);
    const t0 = performance.now();
    const bits: Int32Array = await entry.m.getNextTokenBitmask();
    let all = true;
    for (let w = 0; w < this.words - 1 && all; w++) if (bits[w] !== -1) all = false;
    this.publish(entry, all ? 1 : 0, all ? undefined : bits, (performance.now() - t0) * 1000);
  }

  evict(): void {
    for (const [key, c] of this.compiled) {
      if (this.compiled.size <= this.maxCompiled) break;
      if (c.users > 0) continue;
      c.grammar.dispose();
      this.compiled.delete(key);
    }
  }

  /** Compiles a grammar unless it is cached; true when it compiled. */
  async compile(key: string, recipe: Any): Promise<boolean> {
    const have = this.compiled.get(key);
    if (have) {
      this.compiled.delete(key);
      this.compiled.set(key, have); // most recently used last
      return false;
    }
    const g = await this.build(recipe);
    const c = await this.compiler.compileGrammar(g);
    g.dispose();
    this.compiled.set(key, { grammar: c, users: 0 });
    return true;
  }

  async init(v: Any): Promise<void> {
    const info = await this.xg.TokenizerInfo.createTokenizerInfo(v.tokens, v.type, v.prependSpace, v.vocabSize, v.stopIds);
    this.compiler = await this.xg.GrammarCompiler.createGrammarCompiler(info);
    this.words = Math.ceil(v.vocabSize / 32);
  }

  /** Opens a matcher on the grammar (compiled now or cached), replays its tokens, publishes its first mask; true when it compiled. */
  async open(msg: Any): Promise<boolean> {
    const didCompile = await this.compile(msg.key, msg.recipe);
    const c = this.compiled.get(msg.key)!;
    const m = await this.xg.GrammarMatcher.createGrammarMatcher(c.grammar);
    const entry = { m, ctl: new Int32Array(msg.shared, 0, 4), mask: new Int32Array(msg.shared, 16), key: msg.key };
    c.users++;
    this.matchers.set(msg.mid, entry);
    this.evict();
    if (msg.replay.some((t: number) => !m.acceptToken(t))) this.publish(entry, 3);
    else await this.fill(entry);
    return didCompile;
  }

  async advance(mid: number, token: number): Promise<void> {
    const entry = this.matchers.get(mid);
    if (!entry) return;
    if (!entry.m.acceptToken(token)) this.publish(entry, 3);
    else await this.fill(entry);
  }

  close(mid: number): void {
    const entry = this.matchers.get(mid);
    if (!entry) return;
    this.matchers.delete(mid);
    entry.m.dispose();
    const c = this.compiled.get(entry.key);
    if (c) c.users--;
    this.evict();
  }

  /** Handles one request; answers whether it compiled a grammar. */
  async handle(msg: Any): Promise<boolean> {
    switch (msg.op) {
      case "init":
        await this.init(msg.vocab);
        return false;
      case "check":
        (await this.build(msg.recipe)).dispose();
        return false;
      case "open":
        return this.open(msg);
      case "advance":
        await this.advance(msg.mid, msg.token);
        return false;
      case "close":
        this.close(msg.mid);
        return false;
    }
    return false;
  }

  /** Marks the matcher `mid` failed (its request's step fails instead of waiting). */
  failed(mid: number): void {
    const entry = this.matchers.get(mid);
    if (entry) this.publish(entry, 4);
  }

  /** Marks every matcher failed (the instance aborted and is not to be trusted). */
  failAll(): void {
    for (const entry of this.matchers.values()) this.publish(entry, 4);
  }
}

/**
 * Runs in the thread, given the GrammarHost class (its text travels in the script). workerData:
 * { xgrammarPath, maxCompiled }. Loads xgrammar's bundle, keeps what it says on stderr, and
 * handles the messages one at a time, answering each that has an id.
 */
export function grammarThreadMain(Host: typeof GrammarHost): void {
  const { parentPort, workerData } = require("node:worker_threads");
  const NodeModule = require("node:module");
  const fs = require("node:fs");
  // xgrammar reports why it aborts on stderr (emscripten's printErr is console.error).
  const said: string[] = [];
  console.error = (...args: unknown[]) => {
    said.push(args.map(String).join(" "));
    if (said.length > 32) said.shift();
  };
  console.warn = console.error;
  console.log = () => {};
  const file = workerData.xgrammarPath as string;
  const mod = new NodeModule(file);
  mod.filename = file;
  mod.paths = NodeModule._nodeModulePaths(file);
  mod._compile(fs.readFileSync(file, "utf8"), file);
  const host = new Host(mod.exports, workerData.maxCompiled, said);

  let chain: Promise<void> = Promise.resolve();
  parentPort.on("message", (msg: Any) => {
    chain = chain.then(async () => {
      const t0 = performance.now();
      try {
        said.length = 0;
        const compiledNow = await host.handle(msg);
        if (msg.id !== undefined) parentPort.postMessage({ id: msg.id, ok: true, ms: performance.now() - t0, compiled: compiledNow });
      } catch (e) {
        const aborted = (e as { name?: string } | null)?.name === "RuntimeError"; // emscripten abort()
        const message = aborted ? host.lastReason("the grammar engine aborted") : String((e as Error)?.message ?? e);
        if (msg.op === "advance" || msg.op === "open") host.failed(msg.mid);
        if (msg.id !== undefined) parentPort.postMessage({ id: msg.id, ok: false, message, aborted });
        if (aborted) {
          // The instance is not to be trusted after an abort: fail every matcher and leave.
          host.failAll();
          process.exit(1);
        }
      }
    });
  });
}

/**
 * The thread's script: the function above, called with the class. A bundler or TS loader that
 * keeps function names may have written calls to its `__name` helper into their text; the script
 * defines a harmless one.
 */
export const GRAMMAR_THREAD_SOURCE = `var __name = (f) => f;\n(${grammarThreadMain.toString()})(${GrammarHost.toString()});`;
