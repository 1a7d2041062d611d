import { createServer } from "node:http";
import type { AddressInfo } from "node:net";
import { setFlagsFromString } from "node:v8";
import { runInNewContext } from "node:vm";
import { ContextOverflowError, KVIntegrityError, TransportError, TransportTimeoutError } from "@airm/rm-core";
import { describe, expect, it } from "vitest";
import { ApiError, toApiError } from "./api-error.ts";
import { DecodeRequestSchema, PrefillRequestSchema, PromptInputSchema, WorkerEventSchema, type WorkerEvent } from "./schemas.ts";
import { encodeEvent, readEvents, StreamIdleError, WorkerClient } from "./worker-client.ts";

const streamOf = (...chunks: string[]) =>
  new ReadableStream<Uint8Array>({
    start(c) {
      for (const ch of chunks) c.enqueue(new TextEncoder().encode(ch));
      c.close();
    },
  });

async function all<T>(g: AsyncGenerator<T>): Promise<T[]> {
  const out: T[] = [];
  for await (const x of g) out.push(x);
  return out;
}

describe("request schemas", () => {
  it("take exactly one prompt form, defaults for sampling, and refuse unknown fields", () => {
    expect(PrefillRequestSchema.parse({ requestId: "r1", input: { prompt: "hi" }, maxTokens: null })).toEqual({
      requestId: "r1",
      input: { prompt: "hi" },
      maxTokens: null,
      sampling: {},
      logprobs: null,
      echo: false,
      ignoreEos: false,
      minTokens: 0,
      n: 1,
    });
    expect(PrefillRequestSchema.safeParse({ requestId: "r", input: { prompt: "x" }, maxTokens: 2, ignoreEos: true, constraint: { type: "json_object" } }).success).toBe(false);
    expect(DecodeRequestSchema.safeParse({ requestId: "r", maxTokens: 2, constraint: { type: "json_schema", schema: "{}", extra: 1 } }).success).toBe(false);
    expect(PromptInputSchema.safeParse({ prompt: "a", promptTokenIds: [1] }).success).toBe(false);
    expect(PromptInputSchema.safeParse({}).success).toBe(false);
    expect(PromptInputSchema.safeParse({ promptTokenIds: [] }).success).toBe(false);
    expect(DecodeRequestSchema.safeParse({ requestId: "r1", maxTokens: 4, max_tokens: 4 }).success).toBe(false);
    expect(DecodeRequestSchema.safeParse({ requestId: "../x", maxTokens: 4 }).success).toBe(false);
    expect(PrefillRequestSchema.safeParse({ requestId: "r", input: { prompt: "x" }, maxTokens: 2, sampling: { temperature: 3 } }).success).toBe(false);
  });
});

describe("NDJSON events", () => {
  it("round-trip through encodeEvent and readEvents, split anywhere", async () => {
    const evs = [
      { type: "ready", promptTokens: 3, seqLen: 64, kvLoadMs: 1.5, kvWaitMs: 2 },
      { type: "token", index: 1, token: 42, text: " é" },
      { type: "done", finishReason: "length", completionTokens: 2, text: "", decodeMs: 3 },
    ] as const;
    const text = evs.map((e) => encodeEvent(e)).join("");
    for (const cut of [1, 7, 40, text.length - 1]) {
      expect(await all(readEvents(streamOf(text.slice(0, cut), text.slice(cut)), 1000))).toEqual(evs);
    }
  });

  it("a line outside the contract is a 502 worker_stream_broken, not a crash", async () => {
    await expect(all(readEvents(streamOf('{"type":"token","index":1}\n'), 1000))).rejects.toMatchObject({ status: 502, code: "worker_stream_broken" });
    await expect(all(readEvents(streamOf("not json\n"), 1000))).rejects.toMatchObject({ status: 502, code: "worker_stream_broken" });
    expect(WorkerEventSchema.safeParse({ type: "bogus" }).success).toBe(false);
  });

  it("a silent stream ends with StreamIdleError after the idle time", async () => {
    const silent = new ReadableStream<Uint8Array>({ start() {} });
    await expect(all(readEvents(silent, 50))).rejects.toBeInstanceOf(StreamIdleError);
  });

  it("waits firstIdleMs for the first event, then idleMs between events", async () => {
    const token = encodeEvent({ type: "token", index: 1, token: 42, text: "a" });
    const later = (first: number, gap: number) =>
      new ReadableStream<Uint8Array>({
        start(c) {
          // the reader cancels the stream once it gives up: later sends find it closed
          const send = () => {
            try {
              c.enqueue(new TextEncoder().encode(token));
            } catch {}
          };
          setTimeout(() => {
            send();
            setTimeout(send, gap);
          }, first);
        },
      });
    const seen: WorkerEvent[] = [];
    const read = async (g: AsyncGenerator<WorkerEvent>) => {
      for await (const e of g) seen.push(e);
    };
    // the first event after 150 ms is fine with firstIdleMs 400; a gap of 150 ms is not with idleMs 60
    await expect(read(readEvents(later(150, 150), 60, 400))).rejects.toMatchObject({ idleMs: 60 });
    expect(seen).toHaveLength(1);
    await expect(all(readEvents(later(150, 0), 60))).rejects.toMatchObject({ idleMs: 60 });
  });
  it("skips the worker's blank heartbeat lines, which do not hold off the idle deadline", async () => {
    const token = encodeEvent({ type: "token", index: 1, token: 42, text: "a" });
    const beats = (n: number, everyMs: number, thenEvent: boolean) =>
      new ReadableStream<Uint8Array>({
        start(c) {
          let i = 0;
          const timer = setInterval(() => {
            try {
              if (i++ < n) c.enqueue(new TextEncoder().encode("\n"));
              else {
                clearInterval(timer);
                if (thenEvent) {
                  c.enqueue(new TextEncoder().encode(token));
                  c.close();
                }
              }
            } catch {
              clearInterval(timer);
            }
          }, everyMs);
        },
      });
    // heartbeats every 20 ms for 200 ms, then the event: a 100 ms first-event deadline still ends it
    await expect(all(readEvents(beats(10, 20, true), 100))).rejects.toMatchObject({ idleMs: 100 });
    // and inside the deadline they are skipped: only the event comes out
    expect(await all(readEvents(beats(3, 10, true), 1000))).toEqual([{ type: "token", index: 1, token: 42, text: "a" }]);
  });
});

describe("API errors", () => {
  it("map rm-core's typed errors to statuses and codes", () => {
    expect(toApiError(new ContextOverflowError(600, 512)).body().error).toMatchObject({ code: "context_overflow", param: "max_tokens", requested: 600, limit: 512 });
    expect(toApiError(new KVIntegrityError("crc", "bad")).status).toBe(502);
    expect(toApiError(new KVIntegrityError("crc", "bad")).param).toBe("crc");
    expect(toApiError(new TransportTimeoutError("late")).status).toBe(504);
    expect(toApiError(new TransportError("down")).code).toBe("kv_transport_error");
    expect(toApiError(new Error("boom"))).toMatchObject({ status: 500, code: "engine_error", type: "server_error" });
  });

  it("rebuild a peer's OpenAI error body (its four fields), or say what came back", () => {
    const e = ApiError.fromBody(400, { error: { message: "m", type: "invalid_request_error", param: "x", code: "c", requested: 1 } }, "fallback");
    expect(e.body()).toEqual({ error: { message: "m", type: "invalid_request_error", param: "x", code: "c" } });
    expect(ApiError.fromBody(503, "<html>", "worker answered 503")).toMatchObject({ status: 503, code: "worker_error", message: "worker answered 503" });
  });
});

describe("WorkerClient event answers", () => {
  it("keep every event when a garbage collection runs while the answer waits unread (as decode waits for prefill)", async () => {
    // undici cancels the body of a fetch Response that is collected before the body is read; the
    // client must hold the Response, not hand out only its body.
    setFlagsFromString("--expose_gc");
    const gc = runInNewContext("gc") as () => void;
    const events: WorkerEvent[] = [
      { type: "ready", promptTokens: 3, seqLen: 64, kvLoadMs: 1, kvWaitMs: 2 },
      { type: "token", index: 1, token: 7, text: "a" },
    ];
    const server = createServer((_req, res) => {
      res.writeHead(200, { "content-type": "application/x-ndjson" });
      res.flushHeaders();
      setTimeout(() => res.end(events.map(encodeEvent).join("")), 300);
    });
    await new Promise<void>((r) => server.listen(0, "127.0.0.1", r));
    try {
      const { port } = server.address() as AddressInfo;
      const answer = await new WorkerClient(`http://127.0.0.1:${port}`).decode({ requestId: "r-gc", maxTokens: 4 });
      for (let i = 0; i < 5; i++) {
        gc();
        await new Promise((r) => setTimeout(r, 20));
      }
      expect(await all(answer.events(5000))).toEqual(events);
    } finally {
      server.close();
    }
  });
});
