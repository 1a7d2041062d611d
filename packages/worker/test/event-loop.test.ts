// Decode steps leave the event loop free between them. Streams that run out of phase (prompts
// prefilled in turns with another stream's decode steps) once made the batcher run group after
// group in one turn: nothing else ran (token writes, /health, new requests) until every stream had
// ended, so clients saw their tokens all at the end and a gateway saw no request running. A real
// worker over HTTP, in this process: an immediate counter measures how many turns the loop took
// while four streams decoded (0 before the fix, one per step after), and /health answers meanwhile.
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { RunningWorker } from "../src/index.ts";
import { tinyWorker } from "./tiny-worker.ts";

let w: RunningWorker;
beforeAll(async () => {
  w = await tinyWorker({ role: "solo", backend: "rngd", seed: 11, env: {} });
}, 60_000);
afterAll(async () => {
  await w?.close();
});

const TOKENS = 48;

/** Starts a streamed generation; resolves `first` at its first event and `done` with its event count. */
function generate(id: string): { first: Promise<void>; done: Promise<number> } {
  let firstSeen!: () => void;
  const first = new Promise<void>((r) => (firstSeen = r));
  const done = (async () => {
    const r = await fetch(`${w.url}/internal/generate`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({ requestId: id, input: { prompt: `stream ${id}` }, maxTokens: TOKENS, ignoreEos: true }),
    });
    expect(r.status).toBe(200);
    const reader = r.body!.getReader();
    const dec = new TextDecoder();
    let text = "";
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      text += dec.decode(value, { stream: true });
      if (text.includes("\n")) firstSeen();
    }
    return text.split("\n").filter((l) => l.trim()).length;
  })();
  return { first, done };
}

describe("decode steps and the event loop", () => {
  it("turns the loop between the steps of streams out of phase, and /health answers meanwhile", async () => {
    for (let round = 0; round < 3; round++) {
      // Four at once: their prompts prefill in turns with the first one's decode steps, so their
      // steps start apart.
      const runs = Array.from({ length: 4 }, (_, i) => generate(`loop-${round}-${i}`));
      await Promise.all(runs.map((r) => r.first));
      // From here all decode; count the loop's turns until one of them has ended.
      let turns = 0;
      let counting = true;
      const tick = () => {
        if (!counting) return;
        turns++;
        setImmediate(tick);
      };
      setImmediate(tick);
      const health = fetch(`${w.url}/health`).then((r) => r.status);
      const firstEnded = await Promise.race(runs.map((r) => r.done));
      counting = false;
      expect(await health).toBe(200);
      // A turn per decode step at least: the streams still running had most of their steps left.
      expect(turns, `round ${round}: ${turns} turns while four streams of ${TOKENS} tokens decoded`).toBeGreaterThanOrEqual(TOKENS / 4);
      expect(firstEnded).toBeGreaterThanOrEqual(TOKENS);
      for (const r of runs) expect(await r.done).toBeGreaterThanOrEqual(TOKENS);
    }
  }, 60_000);
});
