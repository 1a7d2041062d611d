// A push whose request is released while its bytes are still on the way (a link cut stalls it,
// the request fails and is released, the link comes back and the push completes): the relay
// stores nothing and counts it, instead of holding the blob until its TTL. The pusher is answered
// OK: nobody will pull the blob, and its request's fate is told by whoever released it (a decode
// worker that found the KV damaged, say), not by an error of its own.

import { once } from "node:events";
import net from "node:net";
import { patternBytes } from "@airm/rm-core";
import { afterAll, beforeAll, expect, test } from "vitest";
import { RelayClient, frame, startRelay, type Relay } from "../src/index.ts";

const { HEADER_BYTES, Op, Status, encodeHead, decodeHeader } = frame;

let relay: Relay;
beforeAll(async () => {
  relay = await startRelay({ host: "127.0.0.1", port: 0 });
});
afterAll(() => relay.close());

/** Starts a raw push of `size` bytes under `key` and sends only `first` of them; returns the socket and its answers. */
async function halfPush(key: string, size: number, first: number) {
  const s = net.connect(relay.port, "127.0.0.1");
  await once(s, "connect");
  let answer = Buffer.alloc(0);
  s.on("data", (d: Buffer) => (answer = Buffer.concat([answer, d])));
  s.write(Buffer.concat([encodeHead({ op: Op.PUSH, flags: 0, status: 0, tag: 7, payloadLength: size, crc: 0, arg: 0 }, key), patternBytes(3, size).subarray(0, first)]));
  return { s, answer: () => answer };
}

async function until(ok: () => boolean): Promise<void> {
  for (let i = 0; i < 200 && !ok(); i++) await new Promise((r) => setTimeout(r, 10));
}

test("a push that completes after its request was released is dropped, not held", async () => {
  const size = 1 << 20;
  const client = RelayClient.connect(relay.address);
  try {
    const { s, answer } = await halfPush("late-1/0/k", size, 4096);
    await until(() => relay.stats().poolHeldBytes > 0); // the relay has begun the push
    await client.release("late-1");
    s.write(patternBytes(3, size).subarray(4096));
    await until(() => answer().length >= HEADER_BYTES);
    expect(decodeHeader(answer()).status).toBe(Status.OK);
    expect(relay.stats().blobs).toBe(0);
    expect(relay.stats().poolHeldBytes).toBe(0);
    expect(await relay.metricsText()).toMatch(/^airm_kv_relay_late_pushes_total 1$/m);
    // the same connection goes on serving, and other requests are stored as before
    await client.push("late-2/0/k", patternBytes(4, 1000));
    expect(relay.stats().blobs).toBe(1);
    await client.release("late-2");
    s.destroy();
  } finally {
    client.close();
  }
});

test("a released request's push through the client is answered and dropped; a pull of it waits and times out", async () => {
  const client = RelayClient.connect(relay.address);
  try {
    await client.release("late-3");
    await client.push("late-3/0/k", patternBytes(5, 1000));
    expect(relay.stats().blobs).toBe(0);
    expect(await relay.metricsText()).toMatch(/^airm_kv_relay_late_pushes_total 2$/m);
    await expect(client.pull("late-3/0/k", { timeoutMs: 100 })).rejects.toThrow(/no blob late-3\/0\/k was pushed/);
  } finally {
    client.close();
  }
});
