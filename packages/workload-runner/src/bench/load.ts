// The load generator: a seeded stream of synthetic requests (prompt token ids of a fixed length,
// a fixed max_tokens) sent open-loop (Poisson arrivals at a rate, whatever the server's pace) or
// closed-loop (a fixed number of clients, each sending its next request when the last ended),
// for a number of requests or a duration. Returns one row per request, failures included.

import { streamedCompletion } from "./openai-stream.ts";
import { Rng } from "./rng.ts";
import type { RequestRow } from "./stats.ts";

export interface LoadOptions {
  url: string;
  model: string;
  /** open: Poisson arrivals at `rate` per second; closed: `concurrency` clients back to back. */
  mode: { kind: "open"; rate: number } | { kind: "closed"; concurrency: number };
  /** Stop sending after this many requests... */
  requests?: number;
  /** ...or after this many seconds (whichever comes first; at least one of the two). */
  seconds?: number;
  inputTokens: number;
  outputTokens: number;
  seed: number;
  apiKey?: string;
  /** Token ids prompts are drawn from: [lo, hi) (default [10, 500): valid in any vocabulary of 512 or more). */
  tokenRange?: [number, number];
  /** Called after each request (progress). */
  onRow?(row: RequestRow): void;
}

/** The i-th prompt of the seeded stream: `n` token ids. */
function promptOf(rng: Rng, n: number, [lo, hi]: [number, number]): number[] {
  return Array.from({ length: n }, () => rng.int(lo, hi));
}

/** Runs the load; resolves with every request's row in send order. */
export async function runLoad(o: LoadOptions): Promise<RequestRow[]> {
  if (o.requests === undefined && o.seconds === undefined) throw new Error("give a request count or a duration");
  const rng = new Rng(o.seed);
  const range = o.tokenRange ?? [10, 500];
  const start = performance.now();
  const endAt = o.seconds === undefined ? Number.POSITIVE_INFINITY : start + o.seconds * 1000;
  const max = o.requests ?? Number.POSITIVE_INFINITY;
  const rows: RequestRow[] = [];
  let sent = 0;
  const send = async (i: number, prompt: number[]) => {
    const row = await streamedCompletion(i, { url: o.url, model: o.model, promptTokenIds: prompt, maxTokens: o.outputTokens, apiKey: o.apiKey }, start);
    rows.push(row);
    o.onRow?.(row);
  };
  if (o.mode.kind === "closed") {
    const client = async () => {
      while (sent < max && performance.now() < endAt) {
        const i = sent++;
        await send(i, promptOf(rng, o.inputTokens, range));
      }
    };
    await Promise.all(Array.from({ length: o.mode.concurrency }, client));
  } else {
    const inFlight: Promise<void>[] = [];
    let next = start;
    while (sent < max) {
      next += rng.gapMs(o.mode.rate);
      if (next >= endAt) break;
      const wait = next - performance.now();
      if (wait > 0) await new Promise((r) => setTimeout(r, wait));
      inFlight.push(send(sent, promptOf(rng, o.inputTokens, range)));
      sent++;
    }
    await Promise.all(inFlight);
  }
  return rows.sort((a, b) => a.i - b.i);
}
