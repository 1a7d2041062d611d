// A worker that answers healthy without a LoRA adapter loaded through the gateway (it restarted):
// the pool keeps it out of picks and loads the adapter there again, then takes it; a load the
// worker refuses keeps it out with the worker's error and is tried again at the next probe; an
// adapter unloaded through the gateway is no longer asked for. The worker is a scripted HTTP server
// speaking the internal contract (/health, /internal/lora/load).
import { createServer, type Server } from "node:http";
import type { AddressInfo } from "node:net";
import { afterEach, describe, expect, it, vi } from "vitest";
import { EndpointPool } from "../src/index.ts";
import { RuntimeAdapters } from "../src/runtime-adapters.ts";
import { scriptedHealth } from "./scripted-health.ts";

const stops: (() => void)[] = [];
afterEach(() => {
  while (stops.length) stops.pop()!();
});

/** A worker holding `loaded` adapters; its load route refuses while `refuse` is set. */
async function worker(state: { loaded: string[]; refuse: boolean; loads: number }): Promise<string> {
  const server: Server = createServer(async (req, res) => {
    let raw = "";
    for await (const c of req) raw += c;
    const json = (status: number, body: unknown) => res.writeHead(status, { "content-type": "application/json" }).end(JSON.stringify(body));
    if (req.url === "/health") {
      const adapters = state.loaded.map((name) => ({ name, path: `/adapters/${name}`, rank: 4, fingerprint: name, resident: true }));
      return json(200, { ...scriptedHealth(), lora: { maxLoras: 4, maxLoraRank: 64, adapters } });
    }
    if (req.url === "/internal/lora/load") {
      state.loads++;
      const b = JSON.parse(raw) as { name: string; path: string };
      if (state.refuse)
        return json(400, { error: { message: `${b.path}/adapter_config.json is missing`, type: "invalid_request_error", param: "lora_path", code: "invalid_request" } });
      state.loaded.push(b.name);
      return json(200, { name: b.name, path: b.path, rank: 4, fingerprint: b.name, resident: true });
    }
    json(404, { error: { message: "no such route", type: "invalid_request_error", param: null, code: "not_found" } });
  });
  await new Promise<void>((r) => server.listen(0, "127.0.0.1", r));
  stops.push(() => server.close());
  return `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
}

async function pool(url: string, adapters: RuntimeAdapters): Promise<EndpointPool> {
  const p = new EndpointPool("decode", [url], { adapters });
  stops.push(() => p.stop());
  await p.start(60_000);
  return p;
}

describe("a worker without the gateway's run-time adapters", () => {
  it("is kept out of picks until the adapter is loaded on it again, then picked", async () => {
    const state = { loaded: ["static"], refuse: false, loads: 0 };
    const adapters = new RuntimeAdapters();
    adapters.add({ name: "sql", path: "/adapters/sql" });
    const p = await pool(await worker(state), adapters);
    expect(p.pick()).toBeUndefined(); // the first probe found it without "sql"
    expect(p.endpoints[0].lastError).toMatch(/loading LoRA adapters sql again/);
    await vi.waitFor(() => expect(p.pick()).toBeDefined(), { timeout: 5000 });
    expect(state.loaded).toEqual(["static", "sql"]);
    expect(state.loads).toBe(1);
  });

  it("stays out while the worker refuses the load (its error shown), and is taken once the load works or the adapter is unloaded", async () => {
    const state = { loaded: [] as string[], refuse: true, loads: 0 };
    const adapters = new RuntimeAdapters();
    adapters.add({ name: "sql", path: "/adapters/sql" });
    adapters.add({ name: "chat", path: "/adapters/chat" });
    const p = await pool(await worker(state), adapters);
    await vi.waitFor(() => expect(p.endpoints[0].lastError).toMatch(/LoRA adapter load refused .*adapter_config\.json is missing/), { timeout: 5000 });
    await vi.waitFor(() => expect(state.loads).toBeGreaterThan(4), { timeout: 5000 }); // tried again at the probes
    expect(p.pick()).toBeUndefined();
    state.refuse = false;
    adapters.remove("chat");
    await vi.waitFor(() => expect(p.pick()).toBeDefined(), { timeout: 5000 });
    expect(state.loaded).toEqual(["sql"]);
  });
});
