// PD over `nixl` gives exactly the solo tokens: two worker processes, the host's NIXL agent
// sidecar (real NIXL 1.5.1 from PyPI) between them, every KV blob crossing by a NIXL READ from the
// prefill worker's registered arena into the decode worker's. Skipped without the wheels.
import { existsSync, rmSync } from "node:fs";
import { homedir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { PrefillRequest } from "@airm/internal-api";
import type { RunningCluster } from "../../src/index.ts";
import { cluster, pdTokens, postJson, soloTokens, tinyModel, until } from "../helpers/cluster.ts";

const S = 128;
// where scripts/tools/nixl.sh puts the wheels (the sidecar's default Python)
const haveNixl = existsSync(join(homedir(), ".cache", "airm", "nixl-1.5.1", "venv", "bin", "python"));

describe.skipIf(!haveNixl)("PD over nixl", () => {
  let model: string;
  let solo: RunningCluster;
  let pd: RunningCluster;
  beforeAll(async () => {
    model = tinyModel({ arch: "llama" });
    solo = await cluster({ mode: "solo", model, maxModelLen: S, gateway: false });
    pd = await cluster({
      model,
      maxModelLen: S,
      kvTransport: "nixl",
      decode: [{ backend: "atom" }],
      env: { AIRM_KV_NIXL_POOL_MB: "64" },
      onPartExit: "restart",
      restart: { firstDelayMs: 200 },
    });
  }, 180_000);
  afterAll(async () => {
    await pd?.stop();
    await solo?.stop();
    if (model) rmSync(model, { recursive: true, force: true });
  });

  it("gives exactly the solo tokens, greedy and seeded, through the agent sidecar", async () => {
    const bodies: Omit<PrefillRequest, "requestId">[] = [
      { input: { prompt: "through the agent" }, maxTokens: 12, sampling: { temperature: 0 } },
      { input: { promptTokenIds: Array.from({ length: S - 12 }, (_, i) => 3 + ((i * 17) % 400)) }, maxTokens: 12, sampling: { temperature: 0 } },
      { input: { prompt: "seeded sampling" }, maxTokens: 12, sampling: { temperature: 0.8, seed: 7 } },
    ];
    for (const [i, body] of bodies.entries()) {
      const want = await soloTokens(solo.part("solo").url, { requestId: `s-${i}`, ...body }, solo.internalToken);
      const got = await pdTokens(pd.part("prefill").url, pd.part("decode").url, { requestId: `p-${i}`, ...body }, pd.internalToken);
      expect(got).toEqual(want);
    }
    expect(pd.parts.map((p) => p.name)).toEqual(["kv-nixl-agent", "prefill", "decode", "gateway"]);
    const h: any = await (await fetch(`${pd.part("decode").url}/health`)).json();
    expect(h.transport).toBe("nixl");
    const r = await postJson(`${pd.url}/v1/completions`, { model: h.model.id, prompt: "through the agent", max_tokens: 12, temperature: 0 });
    expect(r.status).toBe(200);
    expect(r.body.choices[0].text).toBe((await soloTokens(solo.part("solo").url, { requestId: "s-x", ...bodies[0] }, solo.internalToken)).text);
  });

  it("the agent sidecar killed: the launcher starts it again, the workers register their arenas with the new agent, and requests give the solo text again", async () => {
    const h: any = await (await fetch(`${pd.part("decode").url}/health`)).json();
    const body = { model: h.model.id, prompt: "after the agent came back", max_tokens: 10, temperature: 0 };
    const want = (await soloTokens(solo.part("solo").url, { requestId: "s-r", input: { prompt: body.prompt }, maxTokens: 10, sampling: { temperature: 0 } }, solo.internalToken))
      .text;
    const before = pd.part("kv-nixl-agent");
    before.child.kill("SIGKILL");
    await until(() => pd.part("kv-nixl-agent").alive && pd.part("kv-nixl-agent") !== before, "the launcher to restart the agent sidecar", 30_000);
    // the first calls after the restart may still meet the old agent's end (a typed 5xx); then every request works
    let ok = 0;
    const end = Date.now() + 60_000;
    while (ok < 3 && Date.now() < end) {
      const r = await postJson(`${pd.url}/v1/completions`, body);
      if (r.status === 200) {
        expect(r.body.choices[0].text).toBe(want);
        ok++;
      } else {
        expect(r.status, JSON.stringify(r.body)).toBeGreaterThanOrEqual(500);
        await new Promise((res) => setTimeout(res, 200));
      }
    }
    expect(ok).toBe(3);
  }, 120_000);
});
