// Several prefill and decode endpoints: requests spread by outstanding count, a dead endpoint is
// skipped (its refused connection is retried on a healthy one), and answers stay token-exact.
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { rmSync } from "node:fs";
import {
  GATEWAY_BIN,
  freePort,
  makeTinyModel,
  newShmRoot,
  postJson,
  settledLeftovers,
  spawnService,
  startWorkerProc,
  waitHealthy,
  type Service,
} from "./cluster-harness.ts";

const S = 128;
let model: string;
let shmRoot: string;
const services: Service[] = [];
let gateway: Service;
let prefill: Service[];
let decode: Service[];

beforeAll(async () => {
  model = makeTinyModel(["--arch", "llama"]);
  shmRoot = newShmRoot();
  const env = { PD_SHM_ROOT: shmRoot, AIRM_KV_TRANSPORT: "shm" };
  prefill = await Promise.all([startWorkerProc("prefill", "rngd-full", model, env, S), startWorkerProc("prefill", "rngd-chunk", model, env, S)]);
  decode = await Promise.all([startWorkerProc("decode", "atom", model, env, S), startWorkerProc("decode", "rngd", model, env, S)]);
  services.push(...prefill, ...decode);
  const port = await freePort();
  gateway = spawnService(
    "gateway",
    GATEWAY_BIN,
    ["--port", String(port), "--prefill", prefill.map((s) => s.url).join(","), "--decode", decode.map((s) => s.url).join(",")],
    { ...process.env, AIRM_HEALTH_INTERVAL_MS: "60000" },
    `http://127.0.0.1:${port}`,
  );
  services.push(gateway);
  await waitHealthy(gateway);
});
afterAll(async () => {
  await Promise.all(services.map((s) => s.stop()));
  if (shmRoot) rmSync(shmRoot, { recursive: true, force: true });
  if (model) rmSync(model, { recursive: true, force: true });
});

async function served(s: Service, route: string): Promise<number> {
  const text = await (await fetch(`${s.url}/metrics`)).text();
  const m = new RegExp(`^airm_worker_requests_total\\{route="${route}",outcome="ok"[^}]*\\} (\\d+)$`, "m").exec(text);
  return m ? Number(m[1]) : 0;
}

describe("balancing over several endpoints", () => {
  it("spreads concurrent requests over every endpoint and all answers agree", async () => {
    const id = ((await (await fetch(`${gateway.url}/v1/models`)).json()) as any).data[0].id;
    const body = { model: id, prompt: "balance me", max_tokens: 8, temperature: 0 };
    const rs = await Promise.all(Array.from({ length: 8 }, () => postJson(`${gateway.url}/v1/completions`, body)));
    expect(rs.map((r) => r.status)).toEqual(Array(8).fill(200));
    expect(new Set(rs.map((r) => r.body.choices[0].text)).size).toBe(1);
    for (const p of prefill) expect(await served(p, "prefill")).toBeGreaterThan(0);
    for (const d of decode) expect(await served(d, "decode")).toBeGreaterThan(0);
    expect(await settledLeftovers(shmRoot)).toEqual([]);
  });

  it("skips a prefill endpoint that went away, before any health probe noticed", async () => {
    const id = ((await (await fetch(`${gateway.url}/v1/models`)).json()) as any).data[0].id;
    await prefill[0].stop("SIGKILL");
    const body = { model: id, prompt: "still here", max_tokens: 4, temperature: 0 };
    for (let i = 0; i < 4; i++) {
      const r = await postJson(`${gateway.url}/v1/completions`, body);
      expect(r.status, JSON.stringify(r.body)).toBe(200);
    }
    const h = (await (await fetch(`${gateway.url}/health`)).json()) as any;
    const pre = h.roles.find((r: any) => r.role === "prefill").endpoints;
    expect(pre.find((e: any) => e.url === prefill[0].url).healthy).toBe(false);
    expect(pre.find((e: any) => e.url === prefill[1].url).healthy).toBe(true);
  });
});
