// PD over the relay-based transports gives exactly the solo tokens: tcp (blobs through a real
// airm-kv-relay process) and nixl-ucx (UCX one-sided reads; descriptors through the relay).
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { rmSync } from "node:fs";
import type { PrefillRequest } from "@airm/internal-api";
import type { RunningCluster } from "../../src/index.ts";
import { cluster, pdTokens, postJson, soloTokens, tinyModel } from "../helpers/cluster.ts";

const S = 128;
let model: string;
let solo: RunningCluster;

beforeAll(async () => {
  model = tinyModel({ arch: "qwen2" });
  solo = await cluster({ mode: "solo", model, maxModelLen: S, gateway: false });
});
afterAll(async () => {
  await solo?.stop();
  if (model) rmSync(model, { recursive: true, force: true });
});

describe.each(["tcp", "nixl-ucx"] as const)("PD over %s", (transport) => {
  let pd: RunningCluster;
  beforeAll(async () => {
    pd = await cluster({ model, maxModelLen: S, kvTransport: transport, decode: [{ backend: "atom" }], env: { AIRM_KV_UCX_POOL_MB: "64" } });
  });
  afterAll(async () => {
    await pd?.stop();
  });

  it("gives exactly the solo tokens (qwen2 tiny model, relay in between)", async () => {
    const bodies: Omit<PrefillRequest, "requestId">[] = [
      { input: { prompt: "over the wire" }, maxTokens: 10, sampling: { temperature: 0 } },
      { input: { promptTokenIds: Array.from({ length: S - 10 }, (_, i) => 3 + ((i * 13) % 400)) }, maxTokens: 10, sampling: { temperature: 0 } },
      { input: { prompt: "seeded sampling" }, maxTokens: 10, sampling: { temperature: 0.8, seed: 99 } },
    ];
    for (const [i, body] of bodies.entries()) {
      const want = await soloTokens(solo.part("solo").url, { requestId: `s-${i}`, ...body }, solo.internalToken);
      const got = await pdTokens(pd.part("prefill").url, pd.part("decode").url, { requestId: `p-${i}`, ...body }, pd.internalToken);
      expect(got).toEqual(want);
    }
    expect(pd.parts.map((p) => p.name)).toEqual(["kv-relay", "prefill", "decode", "gateway"]);
    const h: any = await (await fetch(`${pd.part("decode").url}/health`)).json();
    expect(h.transport).toBe(transport);
    const r = await postJson(`${pd.url}/v1/completions`, { model: h.model.id, prompt: "over the wire", max_tokens: 10, temperature: 0 });
    expect(r.status).toBe(200);
    expect(r.body.choices[0].text).toBe((await soloTokens(solo.part("solo").url, { requestId: "s-x", ...bodies[0] }, solo.internalToken)).text);
  });
});
