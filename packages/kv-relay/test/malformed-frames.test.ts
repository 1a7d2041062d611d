// Raw sockets send broken frames to a relay: each closes only its own connection, with a logged
// reason and a counted metric, while a client connected before and after keeps being served.

import { once } from "node:events";
import net from "node:net";
import { patternBytes } from "@airm/rm-core";
import { afterAll, beforeAll, describe, expect, test } from "vitest";
import { RelayClient, frame, spawnRelay, startRelay, type Relay, type RelayProcess } from "../src/index.ts";

const { HEADER_BYTES, Op, encodeHead, encodeHeader } = frame;

/** Sends `bytes` (then optionally ends) and resolves when the relay closes the socket, with what it sent back. */
async function sendRaw(port: number, bytes: Buffer, opts: { end?: boolean } = {}): Promise<{ closedByRelay: boolean; received: number }> {
  const s = net.connect(port, "127.0.0.1");
  await once(s, "connect");
  let received = 0;
  s.on("data", (d: Buffer) => (received += d.length));
  let ended = false;
  s.on("end", () => (ended = true));
  s.on("error", () => (ended = true));
  s.write(bytes);
  if (opts.end) s.end();
  const timer = setTimeout(() => s.destroy(), 5000);
  await new Promise((resolve) => s.on("close", resolve)); // a reset (unread bytes) counts as closed too
  clearTimeout(timer);
  return { closedByRelay: ended, received };
}

function header(over: Partial<Parameters<typeof encodeHeader>[1]> = {}): Buffer {
  return encodeHeader(Buffer.alloc(HEADER_BYTES), { op: Op.PULL, flags: 0, status: 0, tag: 1, keyLength: 0, payloadLength: 0, crc: 0, arg: 100, ...over });
}

const cases: { name: string; reason: string; bytes: () => Buffer; end?: boolean }[] = [
  { name: "bad magic", reason: "bad_magic", bytes: () => Buffer.from("GET / HTTP/1.1\r\nHost: relay\r\n\r\n".padEnd(40, " ")) },
  {
    name: "unknown version",
    reason: "unknown_version",
    bytes: () => {
      const h = header();
      h[4] = 9;
      return h;
    },
  },
  { name: "over-long key", reason: "key_too_long", bytes: () => header({ keyLength: 201 }) },
  { name: "unknown op", reason: "unknown_op", bytes: () => header({ op: 77 }) },
  { name: "reserved bits set", reason: "bad_header", bytes: () => header({ status: 3 }) },
  { name: "payload on a PULL", reason: "bad_payload_length", bytes: () => header({ payloadLength: 5 }) },
  { name: "absurd payload length", reason: "payload_too_long", bytes: () => header({ op: Op.PUSH, payloadLength: 2 ** 41 }) },
  { name: "truncated header", reason: "truncated", bytes: () => header().subarray(0, 20), end: true },
  {
    name: "truncated push payload",
    reason: "truncated",
    bytes: () => Buffer.concat([encodeHead({ op: Op.PUSH, flags: 0, status: 0, tag: 1, payloadLength: 1000, crc: 0, arg: 0 }, "t/0/k"), Buffer.alloc(10)]),
    end: true,
  },
];

describe("in-process relay", () => {
  let relay: Relay;
  const seen = new Map<string, number>();
  beforeAll(async () => {
    relay = await startRelay({ host: "127.0.0.1", port: 0 });
  });
  afterAll(() => relay.close());

  test.each(cases)("$name closes that connection only ($reason)", async (c) => {
    const good = RelayClient.connect(relay.address);
    try {
      const key = `ok-${c.reason}/0/k`;
      await good.push(key, patternBytes(1, 50_000)); // connected before the bad frame
      const before = relay.stats().framesRejected;
      const r = await sendRaw(relay.port, c.bytes(), { end: c.end });
      expect(r.closedByRelay, "the relay closed the connection").toBe(true);
      expect(r.received, "the relay answers a malformed frame with nothing").toBe(0);
      expect(relay.stats().framesRejected).toBe(before + 1);
      seen.set(c.reason, (seen.get(c.reason) ?? 0) + 1);
      expect(await relay.metricsText()).toMatch(new RegExp(`^airm_kv_relay_frames_rejected_total\\{reason="${c.reason}"\\} ${seen.get(c.reason)}$`, "m"));
      const got = await good.pull(key, { timeoutMs: 2000 }); // the same pooled connection still works
      expect(Buffer.from(got.bytes).equals(patternBytes(1, 50_000))).toBe(true);
    } finally {
      good.close();
    }
  });

  test("a bad key in a well-formed frame is answered with INVALID_KEY, not a closed connection", async () => {
    const s = net.connect(relay.port, "127.0.0.1");
    await once(s, "connect");
    s.write(encodeHead({ op: Op.PULL, flags: 0, status: 0, tag: 42, payloadLength: 0, crc: 0, arg: 100 }, "../etc/passwd"));
    const [d] = (await once(s, "data")) as [Buffer];
    const h = frame.decodeHeader(d);
    expect(h.tag).toBe(42);
    expect(h.status).toBe(frame.Status.INVALID_KEY);
    expect(d.subarray(HEADER_BYTES).toString()).toMatch(/bad segment/);
    s.destroy();
  });
});

describe("child-process relay", () => {
  let relay: RelayProcess;
  beforeAll(async () => {
    relay = await spawnRelay(["--listen", "127.0.0.1:0"]);
  });
  afterAll(() => relay.stop());

  test("the reason for closing is logged on stderr and other clients keep being served", async () => {
    const good = RelayClient.connect(relay.address);
    try {
      await good.push("child/0/k", patternBytes(3, 4096));
      const h = header();
      h[4] = 2;
      await sendRaw(relay.port, h);
      await sendRaw(relay.port, header({ keyLength: 999 }));
      expect(Buffer.from((await good.pull("child/0/k")).bytes).equals(patternBytes(3, 4096))).toBe(true);
      await new Promise((r) => setTimeout(r, 100));
      const lines = relay
        .stderr()
        .trim()
        .split("\n")
        .map((l) => JSON.parse(l) as { reason?: string; msg: string });
      expect(lines.find((l) => l.reason === "unknown_version")?.msg).toMatch(/unknown protocol version 2/);
      expect(lines.find((l) => l.reason === "key_too_long")?.msg).toMatch(/key length 999 exceeds 200/);
      expect(relay.proc.exitCode).toBeNull();
    } finally {
      good.close();
    }
  });
});
