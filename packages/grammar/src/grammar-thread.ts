// The body of a grammar thread: one xgrammar (wasm) instance, loaded from the npm package's UMD
// bundle, that either checks grammars (no tokenizer: a checker) or compiles them against a
// vocabulary and runs matchers (an engine). It runs as an eval'd script (no TypeScript loader in
// the thread), so `grammarThreadMain` must stay self-contained: no imports, no outer names.
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

/** Runs in the thread. workerData: { xgrammarPath, maxCompiled }. */
export function grammarThreadMain(): void {
  // biome-ignore lint/suspicious/noExplicitAny: the thread has no types of xgrammar's bundle
  type Any = any;
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
  const xg: Any = mod.exports;
  const maxCompiled: number = workerData.maxCompiled;

  let compiler: Any = null;
  let words = 0;
  const compiled = new Map<string, { grammar: Any; users: number }>();
  const matchers = new Map<number, { m: Any; ctl: Int32Array; mask: Int32Array; key: string }>();

  /** The reason xgrammar gave before it aborted, without its source location. */
  function lastReason(fallback: string): string {
    const fatal = [...said].reverse().find((l) => l.includes("[FATAL]") || l.includes("[ERROR]"));
    if (!fatal) return fallback;
    return fatal
      .replace(/^.*?\[(FATAL|ERROR)\]\s*\S+:\d+:\s*/, "")
      .replace(/^Check failed: \(.*?\) is false: /, "")
      .trim();
  }

  async function build(r: Any): Promise<Any> {
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

  function publish(entry: { m: Any; ctl: Int32Array; mask: Int32Array }, status: number, bits?: Int32Array, us = 0): void {
    if (bits) entry.mask.set(bits.subarray(0, words));
    Atomics.store(entry.ctl, 2, Math.round(us));
    Atomics.store(entry.ctl, 1, status);
    Atomics.add(entry.ctl, 0, 1);
    Atomics.notify(entry.ctl, 0);
  }

  async function fill(entry: { m: Any; ctl: Int32Array; mask: Int32Array }): Promise<void> {
    if (entry.m.isTerminated()) return publish(entry, 2);
    const t0 = performance.now();
    const bits: Int32Array = await entry.m.getNextTokenBitmask();
    let all = true;
    for (let w = 0; w < words - 1 && all; w++) if (bits[w] !== -1) all = false;
    publish(entry, all ? 1 : 0, all ? undefined : bits, (performance.now() - t0) * 1000);
  }

  function evict(): void {
    for (const [key, c] of compiled) {
      if (compiled.size <= maxCompiled) break;
      if (c.users > 0) continue;
      c.grammar.dispose();
      compiled.delete(key);
    }
  }

  /** Compiles a grammar unless it is cached; true when it compiled. */
  async function compile(key: string, recipe: Any): Promise<boolean> {
    const have = compiled.get(key);
    if (have) {
      compiled.delete(key);
      compiled.set(key, have); // most recently used last
      return false;
    }
    const g = await build(recipe);
    const c = await compiler.compileGrammar(g);
    g.dispose();
    compiled.set(key, { grammar: c, users: 0 });
    return true;
  }

  /** Handles one request; answers whether it compiled a grammar. */
  async function handle(msg: Any): Promise<boolean> {
    switch (msg.op) {
      case "init": {
        const v = msg.vocab;
        const info = await xg.TokenizerInfo.createTokenizerInfo(v.tokens, v.type, v.prependSpace, v.vocabSize, v.stopIds);
        compiler = await xg.GrammarCompiler.createGrammarCompiler(info);
        words = Math.ceil(v.vocabSize / 32);
        return false;
      }
      case "check": {
        const g = await build(msg.recipe);
        g.dispose();
        return false;
      }
      case "open": {
        const didCompile = await compile(msg.key, msg.recipe);
        const c = compiled.get(msg.key)!;
        const m = await xg.GrammarMatcher.createGrammarMatcher(c.grammar);
        const entry = { m, ctl: new Int32Array(msg.shared, 0, 4), mask: new Int32Array(msg.shared, 16), key: msg.key };
        c.users++;
        matchers.set(msg.mid, entry);
        evict();
        if (msg.replay.some((t: number) => !m.acceptToken(t))) publish(entry, 3);
        else await fill(entry);
        return didCompile;
      }
      case "advance": {
        const entry = matchers.get(msg.mid);
        if (!entry) return false;
        if (!entry.m.acceptToken(msg.token)) publish(entry, 3);
        else await fill(entry);
        return false;
      }
      case "close": {
        const entry = matchers.get(msg.mid);
        if (!entry) return false;
        matchers.delete(msg.mid);
        entry.m.dispose();
        const c = compiled.get(entry.key);
        if (c) c.users--;
        evict();
        return false;
      }
    }
    return false;
  }

  let chain: Promise<void> = Promise.resolve();
  parentPort.on("message", (msg: Any) => {
    chain = chain.then(async () => {
      const t0 = performance.now();
      try {
        said.length = 0;
        const compiledNow = await handle(msg);
        if (msg.id !== undefined) parentPort.postMessage({ id: msg.id, ok: true, ms: performance.now() - t0, compiled: compiledNow });
      } catch (e) {
        const aborted = (e as { name?: string } | null)?.name === "RuntimeError"; // emscripten abort()
        const message = aborted ? lastReason("the grammar engine aborted") : String((e as Error)?.message ?? e);
        if (msg.op === "advance" || msg.op === "open") {
          const entry = matchers.get(msg.mid);
          if (entry) publish(entry, 4);
        }
        if (msg.id !== undefined) parentPort.postMessage({ id: msg.id, ok: false, message, aborted });
        if (aborted) {
          // The instance is not to be trusted after an abort: fail every matcher and leave.
          for (const entry of matchers.values()) publish(entry, 4);
          process.exit(1);
        }
      }
    });
  });
}

/**
 * The thread's script: the function above, called. A bundler or TS loader that keeps function
 * names may have written calls to its `__name` helper into the function's text; the script
 * defines a harmless one.
 */
export const GRAMMAR_THREAD_SOURCE = `var __name = (f) => f;\n(${grammarThreadMain.toString()})();`;
