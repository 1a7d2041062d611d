// The gateway's side of request migration, against scripted solo workers (HTTP servers speaking
// the internal contract, whose events the gateway parses with the contract's own schemas): a
// stream that breaks moves to the other worker with `resume` = the tokens sent, and the client
// sees one stream; a move is bounded by the limit and then fails saying so; a corrupted KV is not
// moved. The real end to end (real workers, SIGKILL, token-exact) is
// packages/workload-runner/test/e2e/migration.test.ts; these cases need a worker that breaks on cue.
import { createServer, type Server } from "node:http";
import type { AddressInfo } from "node:net";
import { encodeEvent, type WorkerEvent } from "@airm/internal-api";
import { afterAll, afterEach, describe, expect, it } from "vitest";
import { createGatewayApp, EndpointPool, GatewayMetrics, Orchestrator } from "../src/index.ts";
import { scriptedHealth } from "./scripted-health.ts";

const health = scriptedHealth("scripted");
const servers: Server[] = [];
const pools: EndpointPool[] = [];

interface Script {
  /** Events (first included) a call sends before its connection is cut; null: it finishes. */
  breakAfter: number | null;
  /** Ends the call with this error event instead of cutting it. */
  errorCode?: string;
  /** The `resume` of every generate call it got. */
  resumes: (number[] | null)[];
}

/** A solo worker whose token at completion index i is i (text `t<i> `), resuming where `resume` says. */
function worker(s: Script): Promise<string> {
  const server = createServer(async (req, res) => {
    if (req.url === "/health") return void res.writeHead(200, { "content-type": "application/json" }).end(JSON.stringify(health));
    if (req.url === "/internal/release") return void res.writeHead(200, { "content-type": "application/json" }).end(JSON.stringify({ requestId: "x", released: false }));
    let raw = "";
    for await (const c of req) raw += c;
    const body = JSON.parse(raw) as { maxTokens: number; resume?: number[] };
    s.resumes.push(body.resume ?? null);
    const from = body.resume?.length ?? 0;
    res.writeHead(200, { "content-type": "application/x-ndjson" });
    const events: WorkerEvent[] = [{ type: "first", token: from, text: `t${from} `, eos: false, promptTokens: 3, seqLen: 64, maxTokens: body.maxTokens, prefillMs: 1 }];
    for (let i = from + 1; i < body.maxTokens; i++) events.push({ type: "token", index: i, token: i, text: `t${i} ` });
    events.push({ type: "done", finishReason: "length", completionTokens: body.maxTokens, text: "", decodeMs: 1 });
    for (const [n, ev] of events.entries()) {
      if (s.breakAfter !== null && n === s.breakAfter) {
        if (s.errorCode) {
          res.end(encodeEvent({ type: "error", status: 502, code: s.errorCode, param: null, message: "scripted failure" }));
        } else res.destroy();
        return;
      }
      res.write(encodeEvent(ev));
      await new Promise((r) => setTimeout(r, 2));
    }
    res.end();
  });
  servers.push(server);
  return new Promise((resolve) => server.listen(0, "127.0.0.1", () => resolve(`http://127.0.0.1:${(server.address() as AddressInfo).port}`)));
}

async function gateway(urls: string[], limit: number) {
  const pool = new EndpointPool("solo", urls);
  pools.push(pool);
  await pool.start(60_000);
  const metrics = new GatewayMetrics();
  const app = createGatewayApp({
    orchestrator: new Orchestrator({
      solo: pool,
      prefillTimeoutMs: 5_000,
      decodeIdleTimeoutMs: 5_000,
      kvTimeoutMs: 5_000,
      migration: { limit, onMigrate: (m) => metrics.migrations.inc({ role: m.role, reason: m.reason }) },
    }),
    pools: [pool],
    modelPool: pool,
    metrics,
    maxBodyBytes: 1 << 20,
  });
  const stream = async () => {
    const r = await app.request("/v1/completions", {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({ prompt: "x", max_tokens: 10, stream: true }),
    });
    const chunks = (await r.text())
      .split("\n\n")
      .filter((b) => b.startsWith("data: {"))
      .map((b) => JSON.parse(b.slice(6)));
    return { status: r.status, chunks };
  };
  const moved = async () => Number(/^airm_migrations_total\{[^}]*\} (\d+)/m.exec(await metrics.registry.metrics())?.[1] ?? 0);
  return { stream, moved };
}

afterEach(() => {
  for (const p of pools.splice(0)) p.stop();
});
afterAll(() => {
  for (const s of servers) s.close();
});

const text = (chunks: any[]) => chunks.map((c) => c.choices?.[0]?.text ?? "").join("");
const whole = Array.from({ length: 10 }, (_, i) => `t${i} `).join("");

describe("migration in the gateway", () => {
  it("a stream cut after 4 tokens moves with resume = those 4 tokens; the client sees one stream, each token once", async () => {
    const a: Script = { breakAfter: 4, resumes: [] };
    const b: Script = { breakAfter: null, resumes: [] };
    const g = await gateway([await worker(a), await worker(b)], 3);
    // The pool's first pick is its first endpoint (a), which breaks.
    const got = await g.stream();
    expect(got.status).toBe(200);
    expect(got.chunks.filter((c) => c.error)).toEqual([]);
    expect(text(got.chunks)).toBe(whole);
    expect(new Set(got.chunks.map((c) => c.id)).size).toBe(1);
    expect(a.resumes).toEqual([null]);
    expect(b.resumes).toEqual([[0, 1, 2, 3]]);
    expect(await g.moved()).toBe(1);
  });

  it("moves at most the limit, then fails naming the limit and the tokens sent", async () => {
    const a: Script = { breakAfter: 3, resumes: [] };
    const b: Script = { breakAfter: 3, resumes: [] };
    const g = await gateway([await worker(a), await worker(b)], 2);
    const got = await g.stream();
    const err = got.chunks.find((c) => c.error)?.error;
    expect(err?.code).toBe("worker_stream_broken");
    expect(err?.message).toMatch(/the stream broke after \d+ tokens and its 2 migration\(s\) \(AIRM_MIGRATION_LIMIT\) are spent/);
    expect(await g.moved()).toBe(2);
    // Each move resumed from every token sent so far: 3, then 3 more.
    expect(
      [...a.resumes, ...b.resumes]
        .filter((r) => r !== null)
        .map((r) => r!.length)
        .sort(),
    ).toEqual([3, 6]);
    // What the client got before the error is the tokens in order, each once.
    expect(text(got.chunks)).toBe(Array.from({ length: 9 }, (_, i) => `t${i} `).join(""));
  });

  it("a corrupted KV (kv_integrity_error) is surfaced, not moved; with limit 0 a cut stream is the client's error", async () => {
    const bad: Script = { breakAfter: 3, errorCode: "kv_integrity_error", resumes: [] };
    const g = await gateway([await worker(bad)], 3);
    const got = await g.stream();
    expect(got.chunks.find((c) => c.error)?.error.code).toBe("kv_integrity_error");
    expect(await g.moved()).toBe(0);
    expect(bad.resumes).toEqual([null]);

    const cut: Script = { breakAfter: 3, resumes: [] };
    const off = await gateway([await worker(cut)], 0);
    const r = await off.stream();
    expect(r.chunks.find((c) => c.error)?.error.code).toBe("worker_stream_broken");
    expect(cut.resumes).toEqual([null]);
  });
});
