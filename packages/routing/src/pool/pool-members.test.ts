import { expect, test } from "vitest";
import type { PodLike } from "./pod-endpoints.ts";
import { InferencePoolMembers, PoolUnavailableError, type PoolApi } from "./pool-members.ts";

const pool = (labels: Record<string, string>, ports = [8000]) => ({ spec: { selector: { matchLabels: labels }, targetPorts: ports.map((number) => ({ number })) } });
const pod = (name: string, ip: string, labels: Record<string, string>, ready = true): PodLike => ({
  metadata: { name, labels },
  status: { phase: "Running", podIP: ip, conditions: [{ type: "Ready", status: ready ? "True" : "False" }] },
});

/** An in-memory API server: a pool and pods, label selection as the API does it. */
function fakeApi() {
  const state = { pool: pool({ app: "llm" }) as unknown, pods: [] as PodLike[], fail: "", selectors: [] as string[] };
  const api: PoolApi = {
    async readPool(ns, name) {
      if (state.fail) throw new Error(state.fail);
      return ns === "serving" && name === "p" ? state.pool : null;
    },
    async listPods(ns, selector) {
      state.selectors.push(selector);
      const want = selector.split(",").map((kv) => kv.split("="));
      return ns === "serving" ? state.pods.filter((p) => want.every(([k, v]) => p.metadata?.labels?.[k] === v)) : [];
    },
  };
  return { state, api };
}

const tick = (ms: number) => new Promise((r) => setTimeout(r, ms));

test("members are the selected serving pods; changes are announced; has() checks host:port and role", async () => {
  const { state, api } = fakeApi();
  state.pods = [
    pod("pre", "10.0.0.1", { app: "llm", "llm-d.ai/role": "prefill" }),
    pod("dec", "10.0.0.2", { app: "llm", "llm-d.ai/role": "decode" }),
    pod("other", "10.0.0.3", { app: "web" }),
    pod("cold", "10.0.0.4", { app: "llm" }, false),
  ];
  const m = new InferencePoolMembers({ poolName: "p", namespace: "serving", api, pollMs: 20 });
  await m.start();
  try {
    expect(m.endpoints().map((e) => `${e.name}=${e.address}:${e.port}/${e.role}`)).toEqual(["pre=10.0.0.1:8000/prefill", "dec=10.0.0.2:8000/decode"]);
    expect(state.selectors[0]).toBe("app=llm");
    expect(m.has("10.0.0.1:8000")).toBe(true);
    expect(m.has("10.0.0.1:8000", "prefill")).toBe(true);
    expect(m.has("10.0.0.1:8000", "decode")).toBe(false);
    expect(m.has("10.0.0.4:8000")).toBe(false);
    expect(m.has("10.0.0.1:9999")).toBe(false);
    const seen: string[][] = [];
    m.onChange((eps) => seen.push(eps.map((e) => e.name)));
    state.pods[3] = pod("cold", "10.0.0.4", { app: "llm" }, true);
    await tick(100);
    expect(seen).toEqual([["pre", "dec", "cold"]]);
    expect(m.has("10.0.0.4:8000", "prefill")).toBe(true);
    // A failing API keeps the members; a new selector and ports are followed; a deleted pool empties them.
    state.fail = "connection refused";
    await tick(100);
    expect(m.endpoints()).toHaveLength(3);
    state.fail = "";
    state.pool = pool({ app: "web" }, [9000]);
    await tick(100);
    expect(m.endpoints().map((e) => `${e.name}:${e.port}`)).toEqual(["other:9000"]);
    state.pool = null;
    await tick(100);
    expect(m.endpoints()).toEqual([]);
    expect(seen.at(-1)).toEqual([]);
  } finally {
    m.stop();
  }
});

test("start() retries until the pool can be read, then gives up with an error naming the pool", async () => {
  const { state, api } = fakeApi();
  state.fail = "forbidden";
  const late = new InferencePoolMembers({ poolName: "p", namespace: "serving", api, pollMs: 20, startTimeoutMs: 2000 });
  setTimeout(() => {
    state.fail = "";
  }, 100);
  await late.start();
  late.stop();
  const missing = new InferencePoolMembers({ poolName: "nope", namespace: "serving", api, pollMs: 20, startTimeoutMs: 100 });
  await expect(missing.start()).rejects.toBeInstanceOf(PoolUnavailableError);
  await expect(missing.start()).rejects.toThrow(/InferencePool serving\/nope could not be read: not found/);
});
