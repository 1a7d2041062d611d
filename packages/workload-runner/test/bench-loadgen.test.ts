// `airm bench`'s statistics and load generator, checked against known answers: exact percentiles
// of fixed arrays, a goodput search over a known attainment curve, and a scripted OpenAI server
// (real HTTP, real SSE) whose delays are chosen so the percentiles and the attainment are known
// beforehand. The server is scripted because a real engine cannot be made to take chosen times.
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { createServer, type Server } from "node:http";
import type { AddressInfo } from "node:net";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { isAirmError } from "@airm/rm-core";
import { attainment, benchCommand, freePort, percentile, resultRow, runLoad, searchGoodput, type RequestRow } from "../src/index.ts";

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

describe("statistics", () => {
  it("percentiles interpolate between the closest ranks (numpy's default)", () => {
    expect(percentile([4, 1, 3, 2], 50)).toBe(2.5);
    expect(percentile([1, 2, 3, 4, 5, 6, 7, 8, 9, 10], 90)).toBeCloseTo(9.1, 10);
    expect(percentile([7], 99)).toBe(7);
    expect(percentile([], 50)).toBeNaN();
  });

  it("attainment counts failures against it; a one-token answer has no TPOT to miss", () => {
    const row = (o: Partial<RequestRow>): RequestRow => ({
      i: 0,
      startMs: 0,
      endMs: 100,
      status: 200,
      ttftMs: 50,
      tpotMs: 10,
      itlMs: [],
      inTokens: 4,
      outTokens: 5,
      error: null,
      ...o,
    });
    const rows = [row({}), row({ ttftMs: 500 }), row({ tpotMs: 200 }), row({ status: 500, error: "500: boom" }), row({ tpotMs: null, outTokens: 1 })];
    expect(attainment(rows, { ttftMs: 100, tpotMs: 150 })).toBe(2 / 5);
    expect(attainment(rows, { ttftMs: Number.POSITIVE_INFINITY, tpotMs: 150 })).toBe(3 / 5);
    expect(resultRow(rows)).toMatchObject({ requests: 5, ok: 4, failed: 1 });
  });

  it("the goodput search finds the knee of a known curve within its precision and its point budget", async () => {
    const knee = 5.3;
    const seen: number[] = [];
    const { goodput, points } = await searchGoodput({
      startRate: 1,
      target: 0.9,
      maxPoints: 10,
      measure: async (rate) => {
        seen.push(rate);
        return rate <= knee ? 0.95 : 0.5;
      },
    });
    expect(points.length).toBeLessThanOrEqual(10);
    expect(seen.slice(0, 4)).toEqual([1, 2, 4, 8]); // doubling until the first miss
    expect(goodput).toBeLessThanOrEqual(knee);
    expect(goodput).toBeGreaterThan(knee * 0.9);
    expect((await searchGoodput({ startRate: 1, target: 0.9, maxPoints: 5, measure: async () => 0 })).goodput).toBe(0);
  });
});

/**
 * An OpenAI-style server: /v1/models, and streamed /v1/completions whose first chunk comes after
 * 40 ms for odd-numbered requests and 240 ms for even ones, then 4 more chunks 20 ms apart and a
 * usage chunk (5 tokens). Request `failAt` answers 500 with an OpenAI error body.
 */
function scriptedServer(failAt: number): Promise<{ server: Server; url: string; prompts: number[][] }> {
  let n = 0;
  const prompts: number[][] = [];
  const server = createServer(async (req, res) => {
    if (req.url === "/v1/models") return res.writeHead(200, { "content-type": "application/json" }).end(JSON.stringify({ data: [{ id: "scripted" }] }));
    let body = "";
    for await (const c of req) body += c;
    const k = ++n;
    prompts.push(JSON.parse(body).prompt);
    if (k === failAt)
      return res
        .writeHead(500, { "content-type": "application/json" })
        .end(JSON.stringify({ error: { message: "scripted failure", type: "server_error", param: null, code: "x" } }));
    res.writeHead(200, { "content-type": "text/event-stream" });
    await sleep(k % 2 ? 40 : 240);
    for (let t = 0; t < 5; t++) {
      if (t) await sleep(20);
      res.write(`data: ${JSON.stringify({ choices: [{ index: 0, text: "a", finish_reason: null }] })}\n\n`);
    }
    res.write(`data: ${JSON.stringify({ choices: [], usage: { prompt_tokens: 8, completion_tokens: 5 } })}\n\n`);
    res.end("data: [DONE]\n\n");
  });
  return new Promise((resolve) => server.listen(0, "127.0.0.1", () => resolve({ server, url: `http://127.0.0.1:${(server.address() as AddressInfo).port}`, prompts })));
}

describe("the load generator against a scripted server", () => {
  let s: Awaited<ReturnType<typeof scriptedServer>>;
  beforeAll(async () => {
    s = await scriptedServer(7);
  });
  afterAll(() => s.server.close());

  it("closed loop: known TTFT percentiles, TPOT, attainment and the failed request as a row", async () => {
    const rows = await runLoad({ url: s.url, model: "scripted", mode: { kind: "closed", concurrency: 1 }, requests: 21, inputTokens: 8, outputTokens: 5, seed: 3 });
    expect(rows).toHaveLength(21);
    const failed = rows.filter((r) => r.error !== null);
    expect(failed).toHaveLength(1);
    expect(failed[0]).toMatchObject({ status: 500, error: "500: scripted failure", ttftMs: null });
    const r = resultRow(rows);
    expect(r).toMatchObject({ requests: 21, ok: 20, failed: 1 });
    // 10 answers with a 40 ms first chunk and 10 with 240 ms (request 7, odd, failed; 21 is odd)
    expect(r.airm_ttft_p90_ms).toBeGreaterThanOrEqual(240);
    expect(r.airm_ttft_p90_ms).toBeLessThan(300);
    expect(
      percentile(
        rows.flatMap((x) => (x.ttftMs !== null && x.ttftMs < 140 ? [x.ttftMs] : [])),
        50,
      ),
    ).toBeLessThan(90);
    expect(r.airm_tpot_p50_ms).toBeGreaterThanOrEqual(19);
    expect(r.airm_tpot_p50_ms).toBeLessThan(45);
    expect(rows.every((x) => x.error !== null || x.outTokens === 5)).toBe(true);
    // a TTFT SLO between the two delays: exactly the fast half attains (failures count against it)
    expect(attainment(rows, { ttftMs: 140, tpotMs: 150 })).toBe(10 / 21);
    expect(attainment(rows, { ttftMs: Number.POSITIVE_INFINITY, tpotMs: 10 })).toBe(0);
  });

  it("the same seed sends the same prompts; another seed does not", async () => {
    const run = async (seed: number) => {
      s.prompts.length = 0;
      await runLoad({ url: s.url, model: "scripted", mode: { kind: "closed", concurrency: 1 }, requests: 3, inputTokens: 16, outputTokens: 5, seed });
      return s.prompts.map((p) => p.join(","));
    };
    const a = await run(11);
    expect(a.every((p) => p.split(",").length === 16)).toBe(true);
    expect(await run(11)).toEqual(a);
    expect(await run(12)).not.toEqual(a);
  });

  it("open loop: Poisson arrivals at the rate, not waiting for answers", async () => {
    const rows = await runLoad({ url: s.url, model: "scripted", mode: { kind: "open", rate: 40 }, seconds: 0.5, inputTokens: 4, outputTokens: 5, seed: 5 });
    expect(rows.length).toBeGreaterThan(8); // ~20 expected; closed loop at one client would send ~2
    const starts = rows.map((r) => r.startMs);
    expect(Math.max(...starts)).toBeLessThan(600);
  });

  it("a run with no target, or one that is not an OpenAI server, ends with a clear usage error", async () => {
    const noSite = join(tmpdir(), "no-such-cluster.local.env");
    const noTarget = await benchCommand(["load", "--requests", "1"], {}, noSite).catch((e) => e);
    expect(isAirmError(noTarget, "USAGE")).toBe(true);
    expect(noTarget.message).toContain("LLMD_GATEWAY_URL");
    const closed = await freePort(); // nothing listens there
    const refused = await benchCommand(["load", "--requests", "1", "--url", `http://127.0.0.1:${closed}`], {}, noSite).catch((e) => e);
    expect(isAirmError(refused, "USAGE")).toBe(true);
    expect(refused.message).toMatch(/did not answer \(ECONNREFUSED\)/);
    // cluster mode: the target from the site file, the shell's variable winning
    const site = join(mkdtempSync(join(tmpdir(), "airm-site-")), "cluster.local.env");
    writeFileSync(site, `LLMD_GATEWAY_URL=http://127.0.0.1:${closed}\n`);
    const fromFile = await benchCommand(["load", "--requests", "1"], {}, site).catch((e) => e);
    expect(fromFile.message).toContain(`http://127.0.0.1:${closed}/v1/models`);
    const shellWins = await benchCommand(["load", "--requests", "1"], { LLMD_GATEWAY_URL: `http://127.0.0.1:${closed}/shell` }, site).catch((e) => e);
    expect(shellWins.message).toContain(`http://127.0.0.1:${closed}/shell/v1/models`);
    rmSync(dirname(site), { recursive: true, force: true });
    // a server that refuses every request (here: no API key) ends the run before it starts
    const locked = createServer((req, res) => {
      if (req.url === "/v1/models") return res.writeHead(200, { "content-type": "application/json" }).end(JSON.stringify({ data: [{ id: "m" }] }));
      res
        .writeHead(401, { "content-type": "application/json" })
        .end(JSON.stringify({ error: { message: "this server needs an API key", type: "invalid_request_error", param: null, code: "missing_api_key" } }));
    });
    await new Promise<void>((r) => locked.listen(0, "127.0.0.1", r));
    const lockedUrl = `http://127.0.0.1:${(locked.address() as AddressInfo).port}`;
    const refusedRun = await benchCommand(["load", "--requests", "5", "--url", lockedUrl], {}, noSite).catch((e) => e);
    locked.close();
    expect(isAirmError(refusedRun, "USAGE")).toBe(true);
    expect(refusedRun.message).toContain("401: this server needs an API key");
  });
});
