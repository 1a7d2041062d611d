import { describe, expect, test } from "vitest";
import { RangeAllocator } from "./range-allocator.ts";

describe("RangeAllocator, 256-byte units", () => {
  test("hands out disjoint aligned ranges and refuses when full", () => {
    const a = new RangeAllocator(4096, 256);
    const x = a.allocate(1);
    const y = a.allocate(300);
    const z = a.allocate(1000);
    expect([x, y, z]).toEqual([0, 256, 768]);
    expect(a.allocatedBytes).toBe(256 + 512 + 1024);
    expect(a.allocate(4096)).toBe(-1);
    expect(a.largestFree()).toBe(4096 - 1792);
  });

  test("coalesces freed neighbours so a large range fits again", () => {
    const a = new RangeAllocator(1024, 256);
    const offs = [a.allocate(256), a.allocate(256), a.allocate(256), a.allocate(256)];
    expect(a.allocate(1)).toBe(-1);
    a.release(offs[1]);
    a.release(offs[3]);
    expect(a.allocate(512)).toBe(-1);
    a.release(offs[2]);
    expect(a.largestFree()).toBe(768);
    expect(a.allocate(768)).toBe(256);
    a.release(256);
    a.release(offs[0]);
    expect(a.largestFree()).toBe(1024);
    expect(a.allocations).toBe(0);
  });

  test("releasing an offset that is not allocated throws", () => {
    const a = new RangeAllocator(1024);
    const x = a.allocate(10);
    a.release(x);
    expect(() => a.release(x)).toThrow(RangeError);
    expect(() => a.release(12345)).toThrow(RangeError);
  });
});

describe("RangeAllocator, 64-byte units (kv-shm's slabs)", () => {
  const ALIGN = 64;
  test("gives aligned, non-overlapping regions and fails when full", () => {
    const a = new RangeAllocator(1024, ALIGN);
    const x = a.allocate(1);
    const y = a.allocate(100);
    const z = a.allocate(64);
    expect([x, y, z]).toEqual([0, ALIGN, ALIGN * 3]);
    expect(a.allocatedBytes).toBe(ALIGN * 4);
    expect(a.allocate(1024)).toBe(-1);
    expect(a.largestFree()).toBe(1024 - ALIGN * 4);
  });

  test("merges freed neighbours so a full-size region fits again", () => {
    const a = new RangeAllocator(4 * ALIGN, ALIGN);
    const offs = [0, 1, 2, 3].map(() => a.allocate(ALIGN));
    expect(a.allocate(1)).toBe(-1);
    a.release(offs[1]);
    a.release(offs[3]);
    expect(a.allocate(2 * ALIGN)).toBe(-1);
    a.release(offs[2]);
    expect(a.allocate(3 * ALIGN)).toBe(ALIGN);
    a.release(ALIGN);
    a.release(0);
    expect(a.allocations).toBe(0);
    expect(a.allocate(4 * ALIGN)).toBe(0);
  });

  test("refuses a double free", () => {
    const a = new RangeAllocator(1024, ALIGN);
    const x = a.allocate(10);
    a.release(x);
    expect(() => a.release(x)).toThrow(RangeError);
  });
});
