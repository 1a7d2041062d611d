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
    maxModelLen: S,
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

  it("runs the prefill on the pod an endpoint picker names (x-prefiller-host-port) and refuses any other host", async () => {
    const id = ((await (await fetch(`${pd.url}/v1/models`)).json()) as any).data[0].id;
    const body = { model: id, prompt: "named prefill", max_tokens: 4, temperature: 0 };
    const before = await Promise.all(prefill.map((p) => served(p, "prefill")));
    const named = prefill[1].url.replace(/^http:\/\//, "");
    const rs = await Promise.all(Array.from({ length: 4 }, () => postJson(`${pd.url}/v1/completions`, body, { "x-prefiller-host-port": named })));
    expect(rs.map((r) => r.status)).toEqual([200, 200, 200, 200]);
    expect(await served(prefill[1], "prefill")).toBe(before[1] + 4);
    expect(await served(prefill[0], "prefill")).toBe(before[0]);
    // Not a prefill worker of this gateway (a metadata address, the decode worker): 403, nothing runs.
    for (const other of ["169.254.169.254:80", decode[0].url.replace(/^http:\/\//, "")]) {
      const r = await postJson(`${pd.url}/v1/completions`, body, { "x-prefiller-host-port": other });
      expect(r.status).toBe(403);
      expect(r.body.error.code).toBe("prefiller_not_in_pool");
      expect(r.body.error.param).toBe("x-prefiller-host-port");
    }
    const bad = await postJson(`${pd.url}/v1/completions`, body, { "x-prefiller-host-port": "http://evil/" });
    expect(bad.status).toBe(400);
    expect(await served(prefill[0], "prefill")).toBe(before[0]);
    expect(await served(prefill[1], "prefill")).toBe(before[1] + 4);
  });

  it("serves the pod's vllm:* gauges on the gateway's own port", async () => {
    const text = await (await fetch(`${pd.url}/metrics`)).text();
    for (const name of ["vllm:num_requests_waiting", "vllm:num_requests_running", "vllm:kv_cache_usage_perc"]) {
      expect(text).toMatch(new RegExp(`^${name} 0$`, "m"));
    }
    expect(text).toMatch(/^vllm:lora_requests_info\{max_lora="0",running_lora_adapters="",waiting_lora_adapters=""\} \d+/m);
    // The decode workers' KV blocks (of 16 positions), from their /health.
    const blocks = (await Promise.all(decode.map(async (d) => ((await (await fetch(`${d.url}/health`)).json()) as any).kvCache.totalBlocks))).reduce((a, b) => a + b, 0);
    expect(blocks).toBeGreaterThanOrEqual(2 * (S / 16)); // each holds at least one request of max_model_len
    expect(text).toMatch(new RegExp(`^vllm:cache_config_info\\{block_size="16",num_gpu_blocks="${blocks}"\\} 1$`, "m"));
    expect(text).toMatch(/^airm_tok_s /m);
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
