// The internal token (AIRM_INTERNAL_TOKEN) over real HTTP: a worker started with one refuses every
// /internal/* call that does not carry it (401, counted), serves the callers that do (the
// contract's WorkerClient), and keeps /health and /metrics open for probes and scrapers. A caller
// with no token or a wrong one learns that the deployment's parts disagree, not that its own key is bad.
import { ApiError, ErrorBodySchema, WorkerClient, type WorkerEvent } from "@airm/internal-api";
import { INTERNAL_TOKEN_HEADER, newInternalToken } from "@airm/rm-core";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { RunningWorker } from "../src/index.ts";
import { tinyWorker } from "./tiny-worker.ts";

const token = newInternalToken();
let w: RunningWorker;

beforeAll(async () => {
  w = await tinyWorker({ role: "solo", backend: "rngd", seed: 3, env: { AIRM_INTERNAL_TOKEN: token } });
}, 60_000);
afterAll(async () => {
  await w?.close();
});

const body = { requestId: "cmpl-token-1", input: { prompt: "hello" }, maxTokens: 3 };

async function refused(headers: Record<string, string>): Promise<{ status: number; code: string }> {
  const r = await fetch(`${w.url}/internal/generate`, { method: "POST", headers: { "content-type": "application/json", ...headers }, body: JSON.stringify(body) });
  const b = ErrorBodySchema.parse(await r.json());
  return { status: r.status, code: b.error.code! };
}

describe("a worker with AIRM_INTERNAL_TOKEN", () => {
  it("refuses an internal call without the token or with another one (401, OpenAI error body)", async () => {
    expect(await refused({})).toEqual({ status: 401, code: "internal_token_required" });
    expect(await refused({ [INTERNAL_TOKEN_HEADER]: newInternalToken() })).toEqual({ status: 401, code: "invalid_internal_token" });
    // the release route too: nobody without the token can end another request's lease
    const rel = await fetch(`${w.url}/internal/release`, { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify({ requestId: "cmpl-x" }) });
    expect(rel.status).toBe(401);
  });

  it("serves a caller with the token, and says what is wrong to one without", async () => {
    const events: WorkerEvent[] = [];
    for await (const ev of (await new WorkerClient(w.url, "solo worker", { token }).generate(body)).events(30_000)) events.push(ev);
    expect(events.at(-1)).toMatchObject({ type: "done" });
    const err = await new WorkerClient(w.url, "solo worker").generate({ ...body, requestId: "cmpl-token-2" }).catch((e) => e);
    expect(err).toBeInstanceOf(ApiError);
    expect(err).toMatchObject({ status: 502, code: "worker_refused_internal_token" });
    expect(err.message).toContain("AIRM_INTERNAL_TOKEN");
  });

  it("keeps /health and /metrics open, and counts the refusals", async () => {
    expect((await fetch(`${w.url}/health`)).status).toBe(200);
    const m = await (await fetch(`${w.url}/metrics`)).text();
    const refusedTotal = [...m.matchAll(/^airm_worker_requests_total\{[^}]*outcome="unauthorized"[^}]*\} (\d+)$/gm)].reduce((a, x) => a + Number(x[1]), 0);
    expect(refusedTotal).toBe(4);
  });
});
