import { describe, expect, test } from "vitest";
import { REGION_ALIGN, RegionAllocator } from "./region-allocator.ts";

describe("RegionAllocator", () => {
  test("gives aligned, non-overlapping regions and fails when full", () => {
    const a = new RegionAllocator(1024);
    const x = a.alloc(1);
    const y = a.alloc(100);
    const z = a.alloc(64);
    expect([x, y, z]).toEqual([0, REGION_ALIGN, REGION_ALIGN * 3]);
    expect(a.used).toBe(REGION_ALIGN * 4);
    expect(a.alloc(1024)).toBe(-1);
    expect(a.largestFree).toBe(1024 - REGION_ALIGN * 4);
  });

  test("merges freed neighbours so a full-size region fits again", () => {
    const a = new RegionAllocator(4 * REGION_ALIGN);
    const offs = [0, 1, 2, 3].map(() => a.alloc(REGION_ALIGN));
    expect(a.alloc(1)).toBe(-1);
    a.release(offs[1], REGION_ALIGN);
    a.release(offs[3], REGION_ALIGN);
    expect(a.alloc(2 * REGION_ALIGN)).toBe(-1);
    a.release(offs[2], REGION_ALIGN);
    expect(a.alloc(3 * REGION_ALIGN)).toBe(REGION_ALIGN);
    a.release(REGION_ALIGN, 3 * REGION_ALIGN);
    a.release(0, REGION_ALIGN);
    expect(a.empty).toBe(true);
    expect(a.alloc(4 * REGION_ALIGN)).toBe(0);
  });

  test("refuses a double free", () => {
    const a = new RegionAllocator(1024);
    const x = a.alloc(10);
    a.release(x, 10);
    expect(() => a.release(x, 10)).toThrow(RangeError);
  });
});
