// One kernel runtime per thread count for a test file: created before its tests, closed after.
import { afterAll, beforeAll } from "vitest";
import { KernelRuntime } from "../../src/kernels/kernel-runtime.ts";

/** `rt1` (one thread) and `rt2` (two threads), valid inside the file's tests. */
export function kernelRuntimes(): { readonly rt1: KernelRuntime; readonly rt2: KernelRuntime } {
  let one: KernelRuntime | undefined;
  let two: KernelRuntime | undefined;
  beforeAll(async () => {
    one = await KernelRuntime.create({ threads: 1 });
    two = await KernelRuntime.create({ threads: 2 });
  });
  afterAll(() => {
    one?.close();
    two?.close();
  });
  return {
    get rt1() {
      return one!;
    },
    get rt2() {
      return two!;
    },
  };
}
