// PD over the relay-based transports gives exactly the solo tokens: tcp (blobs through a real
// airm-kv-relay process) and nixl-ucx (UCX one-sided reads; descriptors through the relay).
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { rmSync } from "node:fs";
import { makeTinyModel, pdTokens, postJson, soloTokens, startCluster, startWorkerProc, type Cluster, type Service } from "./cluster-harness.ts";

const S = 128;
let model: string;
let solo: Service;

beforeAll(async () => {
  model = makeTinyModel(["--arch", "qwen2"]);
  solo = await startWorkerProc("solo", "rngd", model, {}, S);
});
afterAll(async () => {
  await solo?.stop();
  if (model) rmSync(model, { recursive: true, force: true });
});

describe.each(["tcp", "nixl-ucx"] as const)("PD over %s", (transport) => {
  let pd: Cluster;
  beforeAll(async () => {
    pd = await startCluster({ mode: "pd", model, seqLen: S, transport, decodeBackend: "atom", env: { AIRM_KV_UCX_POOL_MB: "64" } });
  });
  afterAll(async () => {
    await pd?.stop();
  });

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
    expect(h.transport).toBe(transport);
    const r = await postJson(`${pd.url}/v1/completions`, { model: h.model.id, prompt: "over the wire", max_tokens: 10, temperature: 0 });
    expect(r.status).toBe(200);
    expect(r.body.choices[0].text).toBe((await soloTokens(solo.url, { request_id: "s-x", ...bodies[0] })).text);
  });
});
