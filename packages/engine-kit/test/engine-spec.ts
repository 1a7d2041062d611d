// The CPU engine spec the engine tests start from: a plain CPU reference device, whole-prompt
// prefill, KV resident, one thread, no artifact cache; each test overrides what it is about.
import type { CpuEngineSpec } from "../src/index.ts";

export function testEngineSpec(over: Partial<CpuEngineSpec> = {}): CpuEngineSpec {
  return {
    name: "test",
    backend: "test",
    prefillMode: "whole",
    residence: "device",
    device: { vendor: "cpu", path: "cpu-reference", device: null, detail: "test" },
    chunkSize: 5,
    threads: 1,
    artifactCache: null,
    ...over,
  };
}
