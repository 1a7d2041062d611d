import { describe, expect, it } from "vitest";
import { LeaseTable } from "./kv-leases.ts";
import { RequestSlots } from "./request-slots.ts";

describe("LeaseTable", () => {
  it("releases once per terminal event and counts the reason", async () => {
    const released: string[] = [];
    const ends: string[] = [];
    const t = new LeaseTable(
      60_000,
      async (id) => void released.push(id),
      (r) => ends.push(r),
    );
    expect(t.open("a")).toBe(true);
    expect(t.open("a")).toBe(false);
    expect(t.counters().outstanding).toBe(1);
    expect(await t.end("a", "done")).toBe(true);
    expect(await t.end("a", "done")).toBe(false);
    expect(released).toEqual(["a", "a"]);
    expect(ends).toEqual(["done"]);
    expect(t.counters()).toMatchObject({ outstanding: 0, expired: 0, ended: { done: 1 } });
  });
  it("expires a lease after its TTL, releasing its blobs and calling onExpire", async () => {
    const released: string[] = [];
    let expired = false;
    const t = new LeaseTable(20, async (id) => void released.push(id));
    t.open("b", () => (expired = true));
    await new Promise((r) => setTimeout(r, 80));
    expect(released).toEqual(["b"]);
    expect(expired).toBe(true);
    expect(t.counters()).toMatchObject({ outstanding: 0, expired: 1 });
  });
  it("reports a failing release without throwing", async () => {
    const t = new LeaseTable(60_000, async () => {
      throw new Error("gone");
    });
    t.open("c");
    let seen = "";
    expect(await t.end("c", "client_gone", (e) => (seen = (e as Error).message))).toBe(true);
    expect(seen).toBe("gone");
  });
});

describe("RequestSlots", () => {
  it("admits up to capacity in FIFO order and counts waiting/running", async () => {
    const s = new RequestSlots(1);
    const free1 = await s.acquire();
    const order: number[] = [];
    const p2 = s.acquire().then((f) => {
      order.push(2);
      return f;
    });
    const p3 = s.acquire().then((f) => {
      order.push(3);
      return f;
    });
    expect([s.numRunning, s.numWaiting]).toEqual([1, 2]);
    free1();
    (await p2)();
    (await p3)();
    expect(order).toEqual([2, 3]);
    expect([s.numRunning, s.numWaiting]).toEqual([0, 0]);
  });
  it("drops a waiter whose signal aborts", async () => {
    const s = new RequestSlots(1);
    const free = await s.acquire();
    const ac = new AbortController();
    const p = s.acquire(ac.signal);
    ac.abort(new Error("client left"));
    await expect(p).rejects.toThrow("client left");
    expect(s.numWaiting).toBe(0);
    free();
  });
});
