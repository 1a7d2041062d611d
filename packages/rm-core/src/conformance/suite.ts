// Runs the conformance cases: inside a plugin's vitest file (kvTransportSuite) or from the CLI
// (runKVTransportConformance). Same cases, same assertions.

import type { ConformanceFixture, KVTransport } from "../contracts.ts";
import { kvTransportCases, newRunPrefix, type KVCaseContext } from "./kv-transport-cases.ts";

type TestFn = (name: string, fn: () => Promise<void>, timeout?: number) => unknown;

export interface KVTransportSuiteOptions {
  /** vitest's `test`; its `skipIf` skips the cases the plugin declares it cannot run. */
  test: TestFn & { skipIf(condition: boolean): TestFn };
  /** A fresh endpoint of the transport under test; called for the producer and the consumer. */
  factory: () => Promise<KVTransport>;
  /** Case ids to leave out, each with the reason shown in the skipped test's name (an unknown id or an empty reason is refused). */
  skip?: Record<string, string>;
  timeoutMs?: number;
}

async function runCase(run: (ctx: KVCaseContext) => Promise<void>, factory: () => Promise<KVTransport>, prefix: string): Promise<void> {
  const producer = await factory();
  const consumer = await factory();
  let n = 0;
  try {
    await run({ producer, consumer, rid: (s = "r") => `${prefix}-${s}-${n++}` });
  } finally {
    await Promise.allSettled([consumer.close(), producer.close()]);
  }
}

/** Declares one test per conformance case. */
export function kvTransportSuite(opts: KVTransportSuiteOptions): void {
  const prefix = newRunPrefix();
  for (const [id, reason] of Object.entries(opts.skip ?? {})) {
    if (!kvTransportCases.some((c) => c.id === id)) throw new Error(`kvTransportSuite: skip names "${id}", which is not a conformance case`);
    if (typeof reason !== "string" || reason.trim() === "") throw new Error(`kvTransportSuite: skip of "${id}" needs a reason, shown in the skipped test's name`);
  }
  for (const c of kvTransportCases) {
    const reason = opts.skip?.[c.id];
    const name = reason === undefined ? `${c.id}: ${c.title}` : `${c.id}: ${c.title} (skipped: ${reason})`;
    opts.test.skipIf(reason !== undefined)(name, () => runCase(c.run, opts.factory, prefix), opts.timeoutMs ?? 60_000);
  }
}

export interface CaseResult {
  id: string;
  status: "passed" | "failed" | "skipped";
  ms: number;
  error?: string;
}

/** Runs every case against a fixture, in order; reports each through `log`. */
export async function runKVTransportConformance(fixture: ConformanceFixture, log: (line: string) => void = console.log): Promise<CaseResult[]> {
  const prefix = newRunPrefix();
  const results: CaseResult[] = [];
  for (const c of kvTransportCases) {
    const t0 = performance.now();
    if (fixture.skip) {
      results.push({ id: c.id, status: "skipped", ms: 0, error: fixture.skip });
      log(`skip  ${c.id}: ${fixture.skip}`);
      continue;
    }
    try {
      await runCase(c.run, fixture.factory, prefix);
      const ms = performance.now() - t0;
      results.push({ id: c.id, status: "passed", ms });
      log(`ok    ${c.id} (${ms.toFixed(0)} ms): ${c.title}`);
    } catch (e) {
      const ms = performance.now() - t0;
      const error = e instanceof Error ? e.message : String(e);
      results.push({ id: c.id, status: "failed", ms, error });
      log(`FAIL  ${c.id}: ${c.title}\n      ${error.split("\n").join("\n      ")}`);
    }
  }
  return results;
}
