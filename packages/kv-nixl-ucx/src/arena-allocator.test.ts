import { describe, expect, test } from "vitest";
import { ArenaAllocator } from "./arena-allocator.ts";

describe("ArenaAllocator", () => {
  test("hands out disjoint aligned ranges and refuses when full", () => {
    const a = new ArenaAllocator(4096, 256);
    const x = a.allocate(1);
    const y = a.allocate(300);
    const z = a.allocate(1000);
    expect([x, y, z]).toEqual([0, 256, 768]);
    expect(a.allocatedBytes).toBe(256 + 512 + 1024);
    expect(a.allocate(4096)).toBe(-1);
    expect(a.largestFree()).toBe(4096 - 1792);
  });

  test("coalesces freed neighbours so a large range fits again", () => {
    const a = new ArenaAllocator(1024, 256);
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
    const a = new ArenaAllocator(1024);
    const x = a.allocate(10);
    a.release(x);
    expect(() => a.release(x)).toThrow(RangeError);
    expect(() => a.release(12345)).toThrow(RangeError);
  });
});
