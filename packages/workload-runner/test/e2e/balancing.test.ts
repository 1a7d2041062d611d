// Several prefill and decode endpoints: requests spread by outstanding count, a dead endpoint is
// skipped (its refused connection is retried on a healthy one), and answers stay token-exact.
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { rmSync } from "node:fs";
import type { ChildPart, RunningCluster } from "../../src/index.ts";
import { cluster, postJson, settledLeftovers, tinyModel } from "../helpers/cluster.ts";

const S = 128;
let model: string;
let pd: RunningCluster;
let prefill: ChildPart[];
let decode: ChildPart[];

beforeAll(async () => {
  model = tinyModel();
  pd = await cluster({
    model,
    seqLen: S,
    prefill: [{ backend: "rngd-full" }, { backend: "rngd-chunk" }],
    decode: [{ backend: "atom" }, { backend: "rngd" }],
    gatewayEnv: { AIRM_HEALTH_INTERVAL_MS: "60000" },
  });
  prefill = [pd.part("prefill"), pd.part("prefill-2")];
  decode = [pd.part("decode"), pd.part("decode-2")];
});
afterAll(async () => {
  await pd?.stop();
  if (model) rmSync(model, { recursive: true, force: true });
});

async function served(s: ChildPart, route: string): Promise<number> {
  const text = await (await fetch(`${s.url}/metrics`)).text();
  const m = new RegExp(`^airm_worker_requests_total\\{route="${route}",outcome="ok"[^}]*\\} (\\d+)$`, "m").exec(text);
  return m ? Number(m[1]) : 0;
}

describe("balancing over several endpoints", () => {
  it("spreads concurrent requests over every endpoint and all answers agree", async () => {
    const id = ((await (await fetch(`${pd.url}/v1/models`)).json()) as any).data[0].id;
    const body = { model: id, prompt: "balance me", max_tokens: 8, temperature: 0 };
    const rs = await Promise.all(Array.from({ length: 8 }, () => postJson(`${pd.url}/v1/completions`, body)));
    expect(rs.map((r) => r.status)).toEqual(Array(8).fill(200));
    expect(new Set(rs.map((r) => r.body.choices[0].text)).size).toBe(1);
    for (const p of prefill) expect(await served(p, "prefill")).toBeGreaterThan(0);
    for (const d of decode) expect(await served(d, "decode")).toBeGreaterThan(0);
    expect(await settledLeftovers(pd.clusterDir!)).toEqual([]);
  });

  it("skips a prefill endpoint that went away, before any health probe noticed", async () => {
    const id = ((await (await fetch(`${pd.url}/v1/models`)).json()) as any).data[0].id;
    await prefill[0].stop("SIGKILL");
    const body = { model: id, prompt: "still here", max_tokens: 4, temperature: 0 };
    for (let i = 0; i < 4; i++) {
      const r = await postJson(`${pd.url}/v1/completions`, body);
      expect(r.status, JSON.stringify(r.body)).toBe(200);
    }
    const h = (await (await fetch(`${pd.url}/health`)).json()) as any;
    const pre = h.roles.find((r: any) => r.role === "prefill").endpoints;
    expect(pre.find((e: any) => e.url === prefill[0].url).healthy).toBe(false);
    expect(pre.find((e: any) => e.url === prefill[1].url).healthy).toBe(true);
  });
});
