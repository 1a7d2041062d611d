// API keys on the gateway (AIRM_API_KEY, several allowed), as the OpenAI API asks them: the
// official openai client works with a key and gets a 401 (AuthenticationError) with a wrong one;
// a request without a key gets 401 with an OpenAI error body and WWW-Authenticate; /health and
// /metrics stay open for probes and the endpoint picker (AIRM_API_OPEN_PATHS=none closes them).
// A real PD cluster over shm.
import { rmSync } from "node:fs";
import OpenAI from "openai";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { RunningCluster } from "../../src/index.ts";
import { cluster, tinyModel } from "../helpers/cluster.ts";

let model: string;
let pd: RunningCluster;
let closed: RunningCluster;

beforeAll(async () => {
  model = tinyModel();
  [pd, closed] = await Promise.all([
    cluster({ model, maxModelLen: 64, gatewayEnv: { AIRM_API_KEY: "sk-first,sk-second" } }),
    cluster({ model, maxModelLen: 64, gatewayEnv: { AIRM_API_KEY: "sk-only", AIRM_API_OPEN_PATHS: "none" } }),
  ]);
});
afterAll(async () => {
  await Promise.all([pd?.stop(), closed?.stop()]);
  if (model) rmSync(model, { recursive: true, force: true });
});

describe("AIRM_API_KEY", () => {
  it("the official openai client works with either key and gets 401 with a wrong one", async () => {
    for (const apiKey of ["sk-first", "sk-second"]) {
      const client = new OpenAI({ baseURL: `${pd.url}/v1`, apiKey });
      const id = (await client.models.list()).data[0]!.id;
      const r = await client.completions.create({ model: id, prompt: "keys", max_tokens: 4, temperature: 0 });
      expect(r.usage?.completion_tokens).toBe(4);
    }
    const wrong = new OpenAI({ baseURL: `${pd.url}/v1`, apiKey: "sk-first-but-not" });
    const err = await wrong.models.list().then(
      () => null,
      (e: unknown) => e,
    );
    expect(err).toBeInstanceOf(OpenAI.AuthenticationError);
    expect((err as InstanceType<typeof OpenAI.AuthenticationError>).status).toBe(401);
    expect((err as InstanceType<typeof OpenAI.AuthenticationError>).code).toBe("invalid_api_key");
  });

  it("no key: 401 with an OpenAI error body and WWW-Authenticate; probes and metrics stay open by default", async () => {
    const r = await fetch(`${pd.url}/v1/completions`, { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify({ prompt: "x", max_tokens: 2 }) });
    expect(r.status).toBe(401);
    expect(r.headers.get("www-authenticate")).toBe("Bearer");
    const body = (await r.json()) as any;
    expect(body.error).toMatchObject({ code: "missing_api_key", type: "invalid_request_error", param: null });
    expect((await fetch(`${pd.url}/health`)).status).toBe(200);
    expect((await fetch(`${pd.url}/metrics`)).status).toBe(200);
    expect((await fetch(`${pd.url}/v1/models`)).status).toBe(401);
    expect((await fetch(`${pd.url}/v1/models`, { headers: { authorization: "Basic c2stZmlyc3Q=" } })).status).toBe(401);
  });

  it("AIRM_API_OPEN_PATHS=none asks the key on /health and /metrics too", async () => {
    for (const path of ["/health", "/metrics", "/v1/models"]) {
      expect((await fetch(`${closed.url}${path}`)).status, path).toBe(401);
      expect((await fetch(`${closed.url}${path}`, { headers: { authorization: "Bearer sk-only" } })).status, path).toBe(200);
    }
  });
});
