import { describe, expect, it } from "vitest";
import type { KVReservation } from "@airm/rm-core";
import { Admission, type BlockSource } from "./admission.ts";
import { LeaseTable } from "./kv-leases.ts";

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
  it("an unarmed lease does not expire until arm() starts its TTL (blobs wait from their push on)", async () => {
    const released: string[] = [];
    const t = new LeaseTable(20, async (id) => void released.push(id));
    t.open("long-prefill", undefined, false);
    await new Promise((r) => setTimeout(r, 80));
    expect(released).toEqual([]);
    t.arm("long-prefill");
    await new Promise((r) => setTimeout(r, 80));
    expect(released).toEqual(["long-prefill"]);
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

/** A pool of `total` blocks of 16 positions, as an engine's reserve() hands them out. */
function blocks(total: number): BlockSource & { free: number; freed(): void } {
  const listeners = new Set<() => void>();
  const src = {
    free: total,
    reserve(positions: number, extra = 0): KVReservation | null {
      const n = Math.ceil(positions / 16) + extra;
      if (n > total) throw Object.assign(new Error(`${n} blocks exceed the pool's ${total}`), { code: "CONTEXT_OVERFLOW" });
      if (n > src.free) return null;
      src.free -= n;
      let left = n;
      return {
        blocks: n,
        release: () => {
          src.free += left;
          left = 0;
          src.freed();
        },
      };
    },
    onBlocksFreed(l: () => void) {
      listeners.add(l);
      return () => listeners.delete(l);
    },
    freed() {
      for (const l of listeners) l();
    },
  };
  return src;
}

describe("Admission (by KV blocks and running slots)", () => {
  it("admits while blocks and slots last, first come first served, and counts waiting and running", async () => {
    const a = new Admission(2);
    const pool = blocks(4);
    a.attach(pool);
    const first = await a.acquire({ positions: 40 }); // 3 blocks
    const order: string[] = [];
    const big = a.acquire({ positions: 40 }).then((x) => {
      order.push("big");
      return x;
    }); // 3 more: waits for blocks
    const small = a.acquire({ positions: 1 }).then((x) => {
      order.push("small");
      return x;
    }); // 1 would fit, but waits its turn
    await new Promise((r) => setImmediate(r));
    expect([a.numRunning, a.numWaiting, order]).toEqual([1, 2, []]);
    first.release();
    const b = await big;
    const s = await small;
    expect(order).toEqual(["big", "small"]);
    expect([a.numRunning, a.numWaiting, pool.free]).toEqual([2, 0, 0]);
    // a third request waits for a running slot even with blocks back
    b.release();
    const third = a.acquire({ positions: 1 });
    await new Promise((r) => setImmediate(r));
    expect(a.numRunning).toBe(2);
    s.release();
    (await third).release();
    expect([a.numRunning, a.numWaiting, pool.free]).toEqual([0, 0, 4]);
  });
  it("puts a preempted stream's blocks ahead of new requests, without a second slot", async () => {
    const a = new Admission(1);
    const pool = blocks(2);
    a.attach(pool);
    const running = await a.acquire({ positions: 32 }); // both blocks
    const fresh = a.acquire({ positions: 16 });
    const again = a.readmit({ positions: 16 }); // the running request's preempted stream
    await new Promise((r) => setImmediate(r));
    expect(a.numWaiting).toBe(2);
    running.reservation.release(); // its blocks (preemption took them back)
    const r = await again; // ahead of `fresh`, and no slot needed
    expect(pool.free).toBe(1);
    r.release();
    running.release();
    (await fresh).release();
    expect([a.numRunning, a.numWaiting, pool.free]).toEqual([0, 0, 2]);
  });
  it("refuses at once what the whole pool could never hold, and drops a waiter whose signal aborts", async () => {
    const a = new Admission(4);
    a.attach(blocks(2));
    await expect(a.acquire({ positions: 100 })).rejects.toThrow(/exceed the pool/);
    const held = await a.acquire({ positions: 32 });
    const ac = new AbortController();
    const p = a.acquire({ positions: 16, signal: ac.signal });
    ac.abort(new Error("client left"));
    await expect(p).rejects.toThrow("client left");
    expect(a.numWaiting).toBe(0);
    held.release();
  });
});
