import { expect, test } from "vitest";
import { BlobPool, sizeClass } from "./blob-pool.ts";

test("size classes: 4 KiB floor, powers of two to 64 KiB, then 64 KiB steps", () => {
  expect(sizeClass(0)).toBe(4096);
  expect(sizeClass(4097)).toBe(8192);
  expect(sizeClass(65536)).toBe(65536);
  expect(sizeClass(65537)).toBe(131072);
  expect(sizeClass(999_999)).toBe(1 << 20);
  expect(sizeClass(1 << 20)).toBe(1 << 20);
});

test("the cap holds, freed slots are reused (already touched), and idle buffers give way to other sizes", () => {
  const pool = new BlobPool(2 << 20);
  const a = pool.tryReserve(1 << 20)!;
  const b = pool.tryReserve(1 << 20)!;
  expect(pool.tryReserve(1)).toBeUndefined();
  expect(pool.heldBytes).toBe(2 << 20);
  a.buf[5] = 9;
  pool.free(a);
  const c = pool.tryReserve(1 << 20)!;
  expect(c.buf).toBe(a.buf);
  expect(pool.reused).toBe(1);
  pool.free(b);
  pool.free(c);
  expect(pool.idleBytes).toBe(2 << 20);
  const d = pool.tryReserve(2 << 20)!; // needs both idle 1 MiB buffers dropped
  expect(d.classBytes).toBe(2 << 20);
  expect(pool.idleBytes).toBe(0);
  expect(pool.heldBytes + pool.idleBytes).toBeLessThanOrEqual(2 << 20);
});

test("without reuse every slot is fresh", () => {
  const pool = new BlobPool(1 << 20, false);
  const a = pool.tryReserve(1000)!;
  pool.free(a);
  expect(pool.idleBytes).toBe(0);
  expect(pool.tryReserve(1000)!.buf).not.toBe(a.buf);
});
