// A draining worker closes the connections clients keep open: at the start of the drain the idle
// keep-alive ones, afterwards each one after its answer (Connection: close). Behind a Service a
// client's next call then connects again and reaches a pod that is not going away, instead of
// asking the draining one over a connection that the Service's proxy keeps pinned to it. Real
// worker on a tiny model, real sockets.
import { Agent, get, type IncomingMessage } from "node:http";
import type { Socket } from "node:net";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { RunningWorker } from "../src/index.ts";
import { tinyWorker } from "./tiny-worker.ts";

let w: RunningWorker;
beforeAll(async () => {
  w = await tinyWorker({ role: "solo", backend: "rngd", seed: 5, env: {} });
}, 60_000);
afterAll(async () => {
  await w?.close();
});

/** GET /health over `agent`: status, body, headers and the socket it went over. */
function health(agent: Agent): Promise<{ status: number; body: { status: string }; headers: IncomingMessage["headers"]; socket: Socket }> {
  return new Promise((resolve, reject) => {
    const req = get(`${w.url}/health`, { agent }, (res) => {
      let text = "";
      res.setEncoding("utf8");
      res.on("data", (d) => (text += d));
      res.on("end", () => resolve({ status: res.statusCode ?? 0, body: JSON.parse(text), headers: res.headers, socket: req.socket as Socket }));
    });
    req.on("error", reject);
  });
}

const closed = (s: Socket) => (s.destroyed ? Promise.resolve() : new Promise<void>((r) => s.once("close", () => r())));

describe("a draining worker and kept-open connections", () => {
  it("closes idle keep-alive connections when the drain starts and every connection after its answer while draining", async () => {
    const agent = new Agent({ keepAlive: true, maxSockets: 1 });
    const before = await health(agent);
    expect(before.status).toBe(200);
    expect(before.headers.connection).not.toBe("close");
    // idle connections outlive the callers' own idle timeouts (a few seconds), so a caller never
    // sends on a connection the worker is closing
    expect(before.headers["keep-alive"]).toBe("timeout=65");
    const again = await health(agent);
    expect(again.socket).toBe(before.socket); // kept open and reused

    expect(await w.drain(0)).toBe(0);
    await closed(before.socket); // the worker closed the idle one

    const during = await health(agent);
    expect(during.status).toBe(503);
    expect(during.body.status).toBe("draining");
    expect(during.headers.connection).toBe("close");
    expect(during.socket).not.toBe(before.socket);
    await closed(during.socket);
    agent.destroy();
  });
});
