// The relay's internal token (AIRM_INTERNAL_TOKEN): real sockets against in-process relays and the
// airm-kv-relay process. A relay with a token serves only connections that open with a HELLO
// carrying it; everything else is answered UNAUTHORIZED, closed, counted and logged, and the
// client turns that into a TransportError saying what to fix.

import { spawnSync } from "node:child_process";
import { once } from "node:events";
import net from "node:net";
import { fileURLToPath } from "node:url";
import { isAirmError, newInternalToken, patternBytes } from "@airm/rm-core";
import { afterAll, afterEach, beforeAll, describe, expect, test } from "vitest";
import { RelayClient, frame, spawnRelay, startRelay, type Relay, type RelayProcess } from "../src/index.ts";

const { HEADER_BYTES, Op, RESPONSE_BIT, Status, decodeHeader, encodeHead } = frame;

const TOKEN = newInternalToken();

const refusal = (address: string) =>
  `the KV relay at ${address} refused this connection: AIRM_INTERNAL_TOKEN is missing or differs from the relay's; give every part of the deployment the same AIRM_INTERNAL_TOKEN`;

async function failure(p: Promise<unknown>): Promise<Error> {
  return p.then(
    () => {
      throw new Error("expected the call to fail");
    },
    (e: Error) => e,
  );
}

/** The value of airm_kv_relay_frames_rejected_total for `reason` in a metrics text (0 when absent). */
function rejected(metrics: string, reason: string): number {
  const m = new RegExp(`^airm_kv_relay_frames_rejected_total\\{reason="${reason}"\\} (\\d+)$`, "m").exec(metrics);
  return m ? Number(m[1]) : 0;
}

/** Writes `bytes` on a fresh connection and collects what comes back until the relay closes it. */
async function exchangeRaw(port: number, bytes: Buffer): Promise<{ data: Buffer; closedByRelay: boolean }> {
  const s = net.connect(port, "127.0.0.1");
  await once(s, "connect");
  const chunks: Buffer[] = [];
  let closedByRelay = false;
  s.on("data", (d: Buffer) => chunks.push(d));
  s.on("end", () => (closedByRelay = true));
  s.on("error", () => {});
  s.write(bytes);
  const timer = setTimeout(() => s.destroy(), 5000);
  await once(s, "close");
  clearTimeout(timer);
  return { data: Buffer.concat(chunks), closedByRelay };
}

function hello(token: string, tag = 7): Buffer {
  const payload = Buffer.from(token, "utf8");
  return Buffer.concat([encodeHead({ op: Op.HELLO, flags: 0, status: 0, tag, payloadLength: payload.length, crc: 0, arg: 0 }), payload]);
}

describe("a relay with a token", () => {
  let relay: Relay;
  const clients: RelayClient[] = [];
  const client = (token?: string) => {
    const c = RelayClient.connect(relay.address, { token });
    clients.push(c);
    return c;
  };
  beforeAll(async () => {
    relay = await startRelay({ host: "127.0.0.1", port: 0, token: TOKEN });
  });
  afterEach(() => {
    while (clients.length) clients.pop()!.close();
  });
  afterAll(() => relay.close());

  test("serves a client with the right token", async () => {
    const c = client(TOKEN);
    const data = patternBytes(1, 300_000);
    await c.push("tok/0/k", data);
    const got = await c.pull("tok/0/k", { timeoutMs: 2000 });
    expect(Buffer.from(got.bytes).equals(data)).toBe(true);
    await c.release("tok");
    expect(relay.stats().blobs).toBe(0);
  });

  test("refuses a client without a token with a TransportError saying what to do, counted as unauthenticated", async () => {
    const before = rejected(await relay.metricsText(), "unauthenticated");
    const c = client();
    const e = await failure(c.push("anon/0/k", patternBytes(2, 100_000)));
    expect(isAirmError(e, "TRANSPORT_ERROR"), String(e)).toBe(true);
    expect(e.message).toBe(refusal(relay.address));
    expect(rejected(await relay.metricsText(), "unauthenticated")).toBe(before + 1);
    // A pull is refused the same way (not a timeout), and nothing was stored.
    const p = await failure(c.pull("anon/0/k", { timeoutMs: 200 }));
    expect(p.message).toBe(refusal(relay.address));
    expect(relay.stats().blobs).toBe(0);
  });

  test("a raw PUSH without HELLO is answered UNAUTHORIZED and closed; its payload is never stored nor given a buffer", async () => {
    const before = relay.stats();
    const beforeUnauth = rejected(await relay.metricsText(), "unauthenticated");
    const payload = patternBytes(3, 200_000);
    const push = encodeHead({ op: Op.PUSH, flags: 0, status: 0, tag: 99, payloadLength: payload.length, crc: 0, arg: 0 }, "raw/0/k");
    const r = await exchangeRaw(relay.port, Buffer.concat([push, payload]));
    expect(r.closedByRelay, "the relay closed the connection").toBe(true);
    const h = decodeHeader(r.data);
    expect(h).toMatchObject({ op: Op.PUSH | RESPONSE_BIT, status: Status.UNAUTHORIZED, tag: 99 });
    expect(r.data.length).toBe(HEADER_BYTES + h.payloadLength); // the answer and nothing more
    expect(r.data.subarray(HEADER_BYTES).toString("utf8")).toMatch(/AIRM_INTERNAL_TOKEN/);
    const after = relay.stats();
    expect(after.blobs).toBe(before.blobs);
    expect(after.slotsAllocated).toBe(before.slotsAllocated);
    expect(after.slotsReused).toBe(before.slotsReused);
    expect(after.poolHeldBytes).toBe(0);
    expect(after.framesRejected).toBe(before.framesRejected + 1);
    expect(rejected(await relay.metricsText(), "unauthenticated")).toBe(beforeUnauth + 1);
    const e = await failure(client(TOKEN).pull("raw/0/k", { timeoutMs: 100 }));
    expect(isAirmError(e, "TRANSPORT_TIMEOUT"), String(e)).toBe(true);
  });

  test("a raw HELLO with the token is answered OK and the connection is then served", async () => {
    const s = net.connect(relay.port, "127.0.0.1");
    await once(s, "connect");
    s.write(Buffer.concat([hello(TOKEN, 5), encodeHead({ op: Op.RELEASE, flags: 0, status: 0, tag: 6, payloadLength: 0, crc: 0, arg: 0 }, "none")]));
    let got = Buffer.alloc(0);
    while (got.length < 2 * HEADER_BYTES) got = Buffer.concat([got, ((await once(s, "data")) as [Buffer])[0]]);
    s.destroy();
    expect(decodeHeader(got)).toMatchObject({ op: Op.HELLO | RESPONSE_BIT, status: Status.OK, tag: 5, payloadLength: 0 });
    expect(decodeHeader(got.subarray(HEADER_BYTES))).toMatchObject({ op: Op.RELEASE | RESPONSE_BIT, status: Status.OK, tag: 6 });
  });

  test("a wrong token is refused and counted as bad_token", async () => {
    const before = rejected(await relay.metricsText(), "bad_token");
    const e = await failure(client(newInternalToken()).push("wrong/0/k", patternBytes(4, 1000)));
    expect(isAirmError(e, "TRANSPORT_ERROR"), String(e)).toBe(true);
    expect(e.message).toBe(refusal(relay.address));
    expect(rejected(await relay.metricsText(), "bad_token")).toBe(before + 1);
    // An empty HELLO is a missing token: refused as well.
    const r = await exchangeRaw(relay.port, hello("", 3));
    expect(decodeHeader(r.data)).toMatchObject({ op: Op.HELLO | RESPONSE_BIT, status: Status.UNAUTHORIZED, tag: 3 });
    expect(r.closedByRelay).toBe(true);
    expect(rejected(await relay.metricsText(), "bad_token")).toBe(before + 2);
    expect(relay.stats().blobs).toBe(0);
  });

  test("a HELLO longer than 256 bytes is a malformed frame", async () => {
    const before = rejected(await relay.metricsText(), "bad_payload_length");
    const r = await exchangeRaw(relay.port, hello("x".repeat(257)));
    expect(r.data.length).toBe(0);
    expect(rejected(await relay.metricsText(), "bad_payload_length")).toBe(before + 1);
  });
});

test("a relay without a token serves a client that sends one", async () => {
  const relay = await startRelay({ host: "127.0.0.1", port: 0 });
  const c = RelayClient.connect(relay.address, { token: TOKEN });
  try {
    const data = patternBytes(5, 70_000);
    await c.push("open/0/k", data);
    expect(Buffer.from((await c.pull("open/0/k")).bytes).equals(data)).toBe(true);
    expect(relay.stats().framesRejected).toBe(0);
  } finally {
    c.close();
    await relay.close();
  }
});

describe("airm-kv-relay with AIRM_INTERNAL_TOKEN", () => {
  let relay: RelayProcess;
  beforeAll(async () => {
    relay = await spawnRelay(["--listen", "127.0.0.1:0", "--metrics-port", "0"], { AIRM_INTERNAL_TOKEN: TOKEN });
  });
  afterAll(() => relay.stop());

  test("refuses an unauthenticated client, serves one with the token, and never logs a token", async () => {
    const anon = RelayClient.connect(relay.address);
    const wrongToken = newInternalToken();
    const wrong = RelayClient.connect(relay.address, { token: wrongToken });
    const good = RelayClient.connect(relay.address, { token: TOKEN });
    try {
      const e = await failure(anon.push("cli/0/k", patternBytes(6, 4096)));
      expect(isAirmError(e, "TRANSPORT_ERROR"), String(e)).toBe(true);
      expect(e.message).toBe(refusal(relay.address));
      expect((await failure(wrong.push("cli/0/k", patternBytes(6, 4096)))).message).toBe(refusal(relay.address));
      await good.push("cli/0/k", patternBytes(6, 4096));
      expect(Buffer.from((await good.pull("cli/0/k")).bytes).equals(patternBytes(6, 4096))).toBe(true);
    } finally {
      anon.close();
      wrong.close();
      good.close();
    }
    const mport = Number(/metrics on port (\d+)/.exec(relay.stdout())![1]);
    const metrics = await (await fetch(`http://127.0.0.1:${mport}/metrics`)).text();
    expect(rejected(metrics, "unauthenticated")).toBe(1);
    expect(rejected(metrics, "bad_token")).toBe(1);
    await new Promise((r) => setTimeout(r, 100));
    const lines = relay
      .stderr()
      .trim()
      .split("\n")
      .map((l) => JSON.parse(l) as { level: number; reason?: string });
    expect(lines.filter((l) => l.reason === "unauthenticated")).toHaveLength(1);
    expect(lines.filter((l) => l.reason === "bad_token")).toHaveLength(1);
    expect(lines.find((l) => l.reason === "bad_token")?.level).toBe(40); // pino's warn
    expect(relay.stderr()).not.toContain(TOKEN);
    expect(relay.stderr()).not.toContain(wrongToken);
  });

  test("--help lists AIRM_INTERNAL_TOKEN", () => {
    const bin = fileURLToPath(new URL("../bin/airm-kv-relay.mjs", import.meta.url));
    const r = spawnSync(process.execPath, [bin, "--help"], { encoding: "utf8" });
    expect(r.status).toBe(0);
    expect(r.stdout).toContain("AIRM_INTERNAL_TOKEN");
  });
});
