// Traces for `airm bench replay`: the Azure CSV layout and JSONL parse to offsets and lengths,
// malformed rows are refused with their line number, the synthetic generator is seeded and keeps
// inside the context, and a replay sends each entry at its scaled offset with its own lengths
// (a scripted OpenAI server records what arrived when; real HTTP and SSE).
import { createServer, type Server } from "node:http";
import type { AddressInfo } from "node:net";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { isAirmError } from "@airm/rm-core";
import { parseTrace, replayTrace, syntheticTrace } from "../src/index.ts";

const refusal = (text: string): string => {
  try {
    parseTrace(text, "t.csv");
  } catch (e) {
    expect(isAirmError(e, "CONFIG")).toBe(true);
    return (e as Error).message;
  }
  throw new Error("accepted");
};

describe("trace parsing", () => {
  it("reads the Azure layout as it is (timestamps to offsets) and JSONL", () => {
    const azure = "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6805900,374,44\n2023-11-16 18:15:50.9951690,396,109\n\n";
    expect(parseTrace(azure)).toEqual([
      { atMs: 0, inputTokens: 374, outputTokens: 44 },
      { atMs: expect.closeTo(4314.579, 2), inputTokens: 396, outputTokens: 109 },
    ]);
    const jsonl = '{"t": 1.5, "input_tokens": 10, "output_tokens": 2}\n{"t": 2, "input_tokens": 20, "output_tokens": 3}\n';
    expect(parseTrace(jsonl)).toEqual([
      { atMs: 0, inputTokens: 10, outputTokens: 2 },
      { atMs: 500, inputTokens: 20, outputTokens: 3 },
    ]);
  });

  it("refuses malformed rows with the file and line number", () => {
    expect(refusal("TIMESTAMP,ContextTokens,GeneratedTokens\n1,10,2\n2,ten,2\n")).toMatch(/t\.csv:3.*ContextTokens/);
    expect(refusal("TIMESTAMP,ContextTokens,GeneratedTokens\n1,10,2\n2,10\n")).toMatch(/t\.csv:3.*2 fields where the header has 3/);
    expect(refusal("TIMESTAMP,ContextTokens,GeneratedTokens\nyesterday,10,2\n")).toMatch(/t\.csv:2.*TIMESTAMP "yesterday"/);
    expect(refusal("time,in,out\n1,2,3\n")).toMatch(/t\.csv:1.*TIMESTAMP, ContextTokens and GeneratedTokens/);
    expect(refusal('{"t": 1, "input_tokens": 3, "output_tokens": 1}\n{"t": 2, "input_tokens": 0, "output_tokens": 1}\n')).toMatch(/t\.csv:2.*integers >= 1/);
    expect(refusal('{"t": 1, "input_tokens": 3, "output_tokens": 1}\nnot json\n')).toMatch(/t\.csv:2.*not a JSON object/);
    expect(refusal("TIMESTAMP,ContextTokens,GeneratedTokens\n5,1,1\n4,1,1\n")).toMatch(/back in time/);
  });

  it("the synthetic trace is seeded, parses back, and keeps input + output inside the context", () => {
    const o = { requests: 300, rate: 2, inputMedian: 256, outputMedian: 64, sigma: 0.6, maxTotal: 500, seed: 4 };
    const a = syntheticTrace(o);
    expect(syntheticTrace(o)).toBe(a);
    expect(syntheticTrace({ ...o, seed: 5 })).not.toBe(a);
    const entries = parseTrace(a);
    expect(entries).toHaveLength(300);
    expect(entries.every((e) => e.inputTokens + e.outputTokens <= 500)).toBe(true);
    // right-skewed lengths around the medians, arrivals at about the rate
    const sorted = entries.map((e) => e.inputTokens).sort((x, y) => x - y);
    expect(sorted[150]).toBeGreaterThan(180);
    expect(sorted[150]).toBeLessThan(330);
    expect(entries.at(-1)!.atMs / 1000).toBeGreaterThan(100);
    expect(entries.at(-1)!.atMs / 1000).toBeLessThan(200);
  });
});

describe("replay", () => {
  let server: Server;
  let url: string;
  const arrived: { atMs: number; prompt: number; maxTokens: number }[] = [];
  let t0 = 0;
  beforeAll(async () => {
    server = createServer(async (req, res) => {
      let body = "";
      for await (const c of req) body += c;
      const b = JSON.parse(body);
      arrived.push({ atMs: performance.now() - t0, prompt: b.prompt.length, maxTokens: b.max_tokens });
      res.writeHead(200, { "content-type": "text/event-stream" });
      res.end(`data: ${JSON.stringify({ choices: [{ index: 0, text: "a" }] })}\n\ndata: ${JSON.stringify({ choices: [], usage: { completion_tokens: 1 } })}\n\ndata: [DONE]\n\n`);
    });
    await new Promise<void>((r) => server.listen(0, "127.0.0.1", r));
    url = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
  });
  afterAll(() => server.close());

  it("sends each entry at its offset divided by the time scale, with its own lengths", async () => {
    const entries = [
      { atMs: 0, inputTokens: 5, outputTokens: 2 },
      { atMs: 400, inputTokens: 7, outputTokens: 3 },
      { atMs: 1000, inputTokens: 9, outputTokens: 4 },
    ];
    t0 = performance.now();
    const rows = await replayTrace({ url, model: "m", entries, timeScale: 2, seed: 1 });
    expect(rows.map((r) => r.status)).toEqual([200, 200, 200]);
    expect(arrived.map((a) => [a.prompt, a.maxTokens])).toEqual([
      [5, 2],
      [7, 3],
      [9, 4],
    ]);
    // at 0, 200 and 500 ms (time scale 2), never early
    expect(arrived[1].atMs).toBeGreaterThanOrEqual(195);
    expect(arrived[2].atMs).toBeGreaterThanOrEqual(495);
    expect(arrived[2].atMs).toBeLessThan(800);
  });
});
