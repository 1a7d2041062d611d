// PD over the tcp transport (a real airm-kv-relay process) gives exactly the solo tokens.
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { rmSync } from "node:fs";
import { makeTinyModel, pdTokens, postJson, soloTokens, startCluster, startWorkerProc, type Cluster, type Service } from "./cluster-harness.ts";

const S = 128;
let model: string;
let pd: Cluster;
let solo: Service;

beforeAll(async () => {
  model = makeTinyModel(["--arch", "qwen2"]);
  pd = await startCluster({ mode: "pd", model, seqLen: S, transport: "tcp", decodeBackend: "atom" });
  solo = await startWorkerProc("solo", "rngd", model, {}, S);
});
afterAll(async () => {
  await solo?.stop();
  await pd?.stop();
  if (model) rmSync(model, { recursive: true, force: true });
});

describe("PD over tcp", () => {
  it("gives exactly the solo tokens (qwen2 tiny model, relay in between)", async () => {
    const bodies = [
      { prompt: "over the wire", max_tokens: 10, sampling: { temperature: 0 } },
      { prompt_token_ids: Array.from({ length: S - 10 }, (_, i) => 3 + ((i * 13) % 400)), max_tokens: 10, sampling: { temperature: 0 } },
      { prompt: "seeded sampling", max_tokens: 10, sampling: { temperature: 0.8, seed: 99 } },
    ];
    for (const [i, body] of bodies.entries()) {
      const want = await soloTokens(solo.url, { request_id: `s-${i}`, ...body });
      const got = await pdTokens(pd.services.prefill.url, pd.services.decode.url, { request_id: `p-${i}`, ...body });
      expect(got).toEqual(want);
    }
    const h: any = await (await fetch(`${pd.services.decode.url}/health`)).json();
    expect(h.transport).toBe("tcp");
    const r = await postJson(`${pd.url}/v1/completions`, { model: h.model.id, prompt: "over the wire", max_tokens: 10, temperature: 0 });
    expect(r.status).toBe(200);
    expect(r.body.choices[0].text).toBe((await soloTokens(solo.url, { request_id: "s-x", ...bodies[0] })).text);
  });
});
