// The calling side of one grammar thread: starts it, sends requests and matches their replies,
// and turns the thread's end (an abort, a crash) into a typed error for every caller waiting.
// Knows the message protocol; not what a grammar is.

import { createRequire } from "node:module";
import { Worker } from "node:worker_threads";
import { GrammarError } from "@airm/rm-core";
import { GRAMMAR_THREAD_SOURCE, type ThreadReply, type ThreadRequest } from "./grammar-thread.ts";

const require = createRequire(import.meta.url);

/** The xgrammar bundle the threads load (its path: the package ships a UMD file under "type": "module"). */
export const XGRAMMAR_PATH: string = require.resolve("@mlc-ai/web-xgrammar");

/** The version of the grammar engine, for logs and /health. */
export const XGRAMMAR_VERSION: string = (require("@mlc-ai/web-xgrammar/package.json") as { version: string }).version;

/** A request without its id (the client numbers them). */
type RequestBody = Extract<ThreadRequest, { id: number }> extends infer R ? (R extends { id: number } ? Omit<R, "id"> : never) : never;

type Pending = { resolve(r: ThreadReply & { ok: true }): void; reject(e: Error): void; what: string };

export class GrammarThread {
  private readonly worker: Worker;
  private readonly pending = new Map<number, Pending>();
  private nextId = 1;
  private endedWith: string | null = null;

  /** Starts a thread; `maxCompiled` bounds its cache of compiled grammars. */
  constructor(maxCompiled: number) {
    this.worker = new Worker(GRAMMAR_THREAD_SOURCE, { eval: true, workerData: { xgrammarPath: XGRAMMAR_PATH, maxCompiled } });
    this.worker.unref();
    this.worker.on("message", (r: ThreadReply) => {
      const p = this.pending.get(r.id);
      if (!p) return;
      this.pending.delete(r.id);
      if (r.ok) p.resolve(r);
      else p.reject(new GrammarError(r.message, { invalid: r.aborted }));
    });
    const end = (why: string) => {
      this.endedWith ??= why;
      for (const p of this.pending.values()) p.reject(new GrammarError(`the grammar engine thread ended (${why}) during ${p.what}`, { invalid: false }));
      this.pending.clear();
    };
    this.worker.on("error", (e) => end(e.message));
    this.worker.on("exit", (code) => end(`exit code ${code}`));
  }

  /** Why the thread ended, or null while it runs. */
  get ended(): string | null {
    return this.endedWith;
  }

  /**
   * Sends a request and resolves with its reply. Rejects with GrammarError: `invalid` when
   * xgrammar aborted on the input (the thread is then gone), else a failure.
   */
  request(msg: RequestBody): Promise<ThreadReply & { ok: true }> {
    if (this.endedWith !== null) return Promise.reject(new GrammarError(`the grammar engine thread ended (${this.endedWith})`, { invalid: false }));
    const id = this.nextId++;
    return new Promise((resolve, reject) => {
      this.pending.set(id, { resolve, reject, what: msg.op });
      this.worker.postMessage({ ...msg, id });
    });
  }

  /** Sends a message that has no reply (advance, close). */
  post(msg: Extract<ThreadRequest, { op: "advance" | "close" }>): void {
    if (this.endedWith === null) this.worker.postMessage(msg);
  }

  /** Stops the thread. */
  async close(): Promise<void> {
    this.endedWith ??= "closed";
    await this.worker.terminate();
  }
}
