// An endpoint that is a Service, not a pod: when a pod behind it drains, a probe that went over a
// connection the Service's proxy keeps on that pod answers "draining" (and the pod closes the
// connection). The gateway asks again at once until a new connection, which the proxy sends to a
// pod still serving, answers, and keeps the endpoint; a worker addressed directly that drains
// keeps saying so and is taken out. The proxy is a real TCP forwarder that picks a backend per connection
// (as kube-proxy does); the pods are scripted HTTP servers answering /health.
import { createServer as createHttpServer, type Server } from "node:http";
import { connect, createServer, type AddressInfo, type Server as NetServer } from "node:net";
import { afterAll, describe, expect, it } from "vitest";
import { DRAINING_RETRIES, EndpointPool } from "../src/index.ts";
import { scriptedHealth } from "./scripted-health.ts";

const closers: Array<() => void> = [];
afterAll(() => {
  for (const c of closers.splice(0)) c();
});

/** A pod's /health: ready, or draining (503, and the connection closed after the answer, as a real worker does). */
async function pod(): Promise<{ url: string; port: number; draining: boolean; probes: number }> {
  const state = { url: "", port: 0, draining: false, probes: 0 };
  const server: Server = createHttpServer((_req, res) => {
    state.probes++;
    const body = state.draining ? { ...scriptedHealth(), status: "draining", ready: false } : scriptedHealth();
    res.writeHead(state.draining ? 503 : 200, { "content-type": "application/json", ...(state.draining ? { connection: "close" } : {}) }).end(JSON.stringify(body));
  });
  await new Promise<void>((r) => server.listen(0, "127.0.0.1", r));
  state.port = (server.address() as AddressInfo).port;
  state.url = `http://127.0.0.1:${state.port}`;
  closers.push(() => {
    server.closeAllConnections();
    server.close();
  });
  return state;
}

/** A Service: each new connection goes to the first of `backends` (ports) as they are at that moment. */
async function service(backends: number[]): Promise<string> {
  const server: NetServer = createServer((client) => {
    const upstream = connect(backends[0]!, "127.0.0.1");
    client.pipe(upstream).pipe(client);
    const end = () => {
      client.destroy();
      upstream.destroy();
    };
    client.on("error", end).on("close", end);
    upstream.on("error", end).on("close", end);
  });
  await new Promise<void>((r) => server.listen(0, "127.0.0.1", r));
  closers.push(() => server.close());
  return `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
}

describe("a Service endpoint whose pod drains", () => {
  it("stays up: the probe that reached the draining pod is asked again and the new connection reaches the pod that serves", async () => {
    const old = await pod();
    const next = await pod();
    const backends = [old.port];
    const pool = new EndpointPool("decode", [await service(backends)]);
    await pool.probeAll();
    await pool.probeAll(); // a second probe over the same kept-open connection
    expect(pool.endpoints[0]!.healthy).toBe(true);
    expect(old.probes).toBe(2);

    // The rollout: the old pod drains and leaves the Service's endpoints; the kept-open connection still reaches it.
    old.draining = true;
    backends.splice(0, 1, next.port);
    await pool.probeAll();
    expect(old.probes).toBeGreaterThanOrEqual(3); // one draining answer per kept-open connection
    expect(next.probes).toBe(1);
    expect(pool.endpoints[0]!.healthy).toBe(true);
    expect(pool.pick()).toBe(pool.endpoints[0]);
  });

  it("a worker addressed directly that drains is taken out", async () => {
    const only = await pod();
    const pool = new EndpointPool("decode", [only.url]);
    await pool.probeAll();
    expect(pool.endpoints[0]!.healthy).toBe(true);
    only.draining = true;
    await pool.probeAll();
    expect(only.probes).toBe(2 + DRAINING_RETRIES); // asked again while draining, then taken out
    expect(pool.endpoints[0]!.healthy).toBe(false);
    expect(pool.describeDown()).toMatch(/health answered 503 \(draining\)/);
    expect(pool.pick()).toBeUndefined();
  });
});
