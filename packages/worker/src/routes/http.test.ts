// The NDJSON answer's heartbeat: while a route has nothing to say, blank lines go out (the
// gateway's reader skips them), and none once events flow faster than the heartbeat.
import { readEvents } from "@airm/internal-api";
import { Hono } from "hono";
import { expect, it } from "vitest";
import { eventStream } from "./http.ts";

function app(silentMs: number, heartbeatMs: number): Hono {
  const a = new Hono();
  a.get("/", (c) =>
    eventStream(
      c,
      async (sink) => {
        await new Promise((r) => setTimeout(r, silentMs));
        await sink.write({ type: "token", index: 1, token: 7, text: "x" });
      },
      () => {},
      heartbeatMs,
    ),
  );
  return a;
}

it("sends blank lines while the route is silent, which the reader skips", async () => {
  const text = await (await app(300, 30).request("/")).text();
  const lines = text.split("\n");
  expect(lines.filter((l) => l === "").length).toBeGreaterThan(2);
  expect(lines.filter((l) => l !== "").map((l) => JSON.parse(l))).toEqual([{ type: "token", index: 1, token: 7, text: "x" }]);
  const events = [];
  for await (const e of readEvents((await app(300, 30).request("/")).body!, 5000)) events.push(e);
  expect(events).toEqual([{ type: "token", index: 1, token: 7, text: "x" }]);
});

it("sends none when the route answers within the heartbeat", async () => {
  const text = await (await app(0, 10_000).request("/")).text();
  expect(text).toBe(`${JSON.stringify({ type: "token", index: 1, token: 7, text: "x" })}\n`);
});
