import { mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { homedir, tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, describe, expect, it } from "vitest";
import { isAirmError, type ContextOverflowError } from "@airm/rm-core";
import {
  ArtifactCache,
  ENGINE_CONFIG,
  artifactKey,
  defaultVariants,
  parseVariants,
  pickVariant,
  planTensorDelta,
  type ArtifactKeyParts,
  type HashedTensors,
} from "../src/index.ts";

const root = mkdtempSync(join(tmpdir(), "airm-cache-"));
afterAll(() => rmSync(root, { recursive: true, force: true }));

describe("compiled variants", () => {
  it("default to batches 1/4/8/16 at every context bucket up to max_model_len; --B caps the batches", () => {
    expect(defaultVariants({ maxModelLen: 2048 }).map((v) => `${v.batch}x${v.seqLen}`)).toEqual([512, 1024, 2048].flatMap((s) => [1, 4, 8, 16].map((b) => `${b}x${s}`)));
    expect(defaultVariants({ maxModelLen: 3000, batch: 8 }).map((v) => `${v.batch}x${v.seqLen}`)).toEqual(
      [512, 1024, 2048, 3000].flatMap((s) => [1, 4, 8].map((b) => `${b}x${s}`)),
    );
    expect(defaultVariants({ maxModelLen: 256 })).toEqual([1, 4, 8, 16].map((batch) => ({ batch, seqLen: 256 })));
    const configured = ENGINE_CONFIG.resolve({ env: { AIRM_VARIANTS: "B8xS128,4x64" } }).variants;
    expect(configured).toEqual([
      { batch: 4, seqLen: 64 },
      { batch: 8, seqLen: 128 },
    ]);
    expect(() => ENGINE_CONFIG.resolve({ env: { AIRM_VARIANTS: "B8" } })).toThrow(expect.objectContaining({ code: "CONFIG", key: "AIRM_VARIANTS" }));
  });
  it("read the KV cache's settings: block size, budget (share or bytes), max_model_len, pass budget", () => {
    const c = ENGINE_CONFIG.resolve({ env: { AIRM_BLOCK_SIZE: "32", AIRM_KV_CACHE_MEMORY: "512M", AIRM_MAX_MODEL_LEN: "4096", AIRM_MAX_NUM_BATCHED_TOKENS: "512" } });
    expect([c.blockSize, c.kvCacheMemory, c.maxModelLen, c.maxNumBatchedTokens]).toEqual([32, { bytes: 512 * 2 ** 20 }, 4096, 512]);
    const d = ENGINE_CONFIG.resolve({ env: {} });
    expect([d.blockSize, d.kvCacheMemory, d.maxModelLen, d.prefillShare]).toEqual([16, { share: 0.25 }, undefined, 0.25]);
    expect(ENGINE_CONFIG.resolve({ env: { AIRM_KV_CACHE_MEMORY: "0.5" } }).kvCacheMemory).toEqual({ share: 0.5 });
    expect(ENGINE_CONFIG.resolve({ env: { AIRM_KV_CACHE_MEMORY: "2GiB" } }).kvCacheMemory).toEqual({ bytes: 2 ** 31 });
    expect(() => ENGINE_CONFIG.resolve({ env: { AIRM_BLOCK_SIZE: "12" } })).toThrow(expect.objectContaining({ key: "AIRM_BLOCK_SIZE" }));
    expect(() => ENGINE_CONFIG.resolve({ env: { AIRM_KV_CACHE_MEMORY: "lots" } })).toThrow(/AIRM_KV_CACHE_MEMORY.*neither a share/);
  });
  it("parse AIRM_VARIANTS and reject nonsense with a ConfigError naming the item", () => {
    expect(parseVariants("B4xS512, 1x256,B4xS512")).toEqual([
      { batch: 1, seqLen: 256 },
      { batch: 4, seqLen: 512 },
    ]);
    for (const bad of ["B4", "B0xS512", "B4xS4", "", "fourxS512"]) {
      try {
        parseVariants(bad);
        expect.unreachable(bad);
      } catch (e) {
        expect(isAirmError(e, "CONFIG")).toBe(true);
      }
    }
  });
  const compiled = parseVariants("B1xS256,B4xS256,B4xS512");
  it("pick the smallest S that holds prompt + max_tokens, and a batch wide enough", () => {
    expect(pickVariant(compiled, 100, 100)).toEqual({ batch: 1, seqLen: 256 });
    expect(pickVariant(compiled, 100, 156)).toEqual({ batch: 1, seqLen: 256 });
    expect(pickVariant(compiled, 100, 157)).toEqual({ batch: 4, seqLen: 512 });
    expect(pickVariant(compiled, 10, 10, 3)).toEqual({ batch: 4, seqLen: 256 });
  });
  it("refuse past the largest S with ContextOverflowError stating both numbers", () => {
    try {
      pickVariant(compiled, 500, 13);
      expect.unreachable();
    } catch (e) {
      expect(isAirmError(e, "CONTEXT_OVERFLOW")).toBe(true);
      const err = e as ContextOverflowError;
      expect([err.requested, err.limit]).toEqual([513, 512]);
      expect(err.message).toContain("513");
      expect(err.message).toContain("512");
    }
    expect(() => pickVariant(compiled, 500, 12)).not.toThrow();
  });
  it("reject bad counts and batches wider than any variant", () => {
    expect(() => pickVariant(compiled, 0, 1)).toThrow(/promptTokens/);
    expect(() => pickVariant(compiled, 1, -1)).toThrow(/maxTokens/);
    expect(() => pickVariant(compiled, 1, 1, 8)).toThrow(/batch/);
  });
});

describe("artifact cache", () => {
  const parts: ArtifactKeyParts = { kind: "packed-weights", weightsFingerprint: "a".repeat(64), variant: { batch: 4, seqLen: 512 }, kernelVersion: "k1" };
  it("keys by every part and nothing else", () => {
    const k = artifactKey(parts);
    expect(k).toMatch(/^[0-9a-f]{64}$/);
    expect(artifactKey({ ...parts })).toBe(k);
    const variants: ArtifactKeyParts[] = [
      { ...parts, kind: "rbln-graph" },
      { ...parts, weightsFingerprint: "b".repeat(64) },
      { ...parts, variant: { batch: 4, seqLen: 256 } },
      { ...parts, variant: { batch: 8, seqLen: 512 } },
      { ...parts, variant: null },
      { ...parts, kernelVersion: "k2" },
    ];
    const keys = new Set(variants.map(artifactKey));
    expect(keys.size).toBe(variants.length);
    expect(keys.has(k)).toBe(false);
  });
  it("lives under AIRM_ARTIFACT_CACHE, else ~/.cache/airm/artifacts", () => {
    expect(ENGINE_CONFIG.resolve({ env: { AIRM_ARTIFACT_CACHE: "/x/y" } }).artifactCache).toBe("/x/y");
    expect(ENGINE_CONFIG.resolve({}).artifactCache).toBe(join(homedir(), ".cache", "airm", "artifacts"));
  });
  it("round-trips segments and reports a miss for an unknown key", () => {
    const cache = new ArtifactCache(join(root, "rt"));
    const a = new Uint8Array(100_000).map((_, i) => i * 7);
    const b = new Uint8Array([1, 2, 3]);
    const key = cache.write(parts, [a, b]);
    expect(key).toBe(artifactKey(parts));
    const got = cache.read(key)!;
    expect(got.length).toBe(100_003);
    expect(Buffer.from(got.subarray(0, 100_000)).equals(Buffer.from(a))).toBe(true);
    expect([...got.subarray(100_000)]).toEqual([1, 2, 3]);
    expect(cache.meta(key)?.parts).toEqual(parts);
    expect(cache.read(artifactKey({ ...parts, kernelVersion: "other" }))).toBeNull();
  });
  it("treats a damaged or truncated file as a miss and removes it", () => {
    const cache = new ArtifactCache(join(root, "bad"));
    const key = cache.write(parts, [new Uint8Array(5000).fill(9)]);
    const file = cache.pathFor(key);
    const bytes = readFileSync(file);
    bytes[bytes.length - 10] ^= 0xff;
    writeFileSync(file, bytes);
    expect(cache.read(key)).toBeNull();
    expect(cache.has(key)).toBe(false);
    const key2 = cache.write(parts, [new Uint8Array(5000).fill(9)]);
    writeFileSync(cache.pathFor(key2), readFileSync(cache.pathFor(key2)).subarray(0, 4096 + 100));
    expect(cache.read(key2)).toBeNull();
    writeFileSync(cache.pathFor(key2), "garbage");
    expect(cache.read(key2)).toBeNull();
  });
  it("refuses keys that are not 64 hex digits (no path escapes)", () => {
    expect(() => new ArtifactCache(root).pathFor("../../etc/passwd")).toThrow(/64 hex/);
  });
});

describe("delta plan from per-tensor hashes", () => {
  function source(tensors: Record<string, { shape: number[]; hash: string; dtype?: string }>): HashedTensors {
    return {
      list: () => Object.entries(tensors).map(([name, t]) => ({ name, dtype: t.dtype ?? "BF16", shape: t.shape })),
      sha256: (name) => tensors[name].hash,
    };
  }
  const config = { numLayers: 2, hiddenSize: 8 };
  const base = { "a.weight": { shape: [8, 8], hash: "1" }, "b.weight": { shape: [8, 4], hash: "2" }, "c.weight": { shape: [4], hash: "3" } };
  it("uploads only tensors whose bytes changed", () => {
    const plan = planTensorDelta({ config, tensors: source(base) }, { config, tensors: source({ ...base, "b.weight": { shape: [8, 4], hash: "2x" } }) });
    expect(plan.changed).toEqual(["b.weight"]);
    expect(plan.unchanged).toBe(2);
    expect(plan.uploadBytes).toBe(8 * 4 * 2);
    expect(plan.totalBytes).toBe((64 + 32 + 4) * 2);
    expect(plan.fullReloadRequired).toBe(false);
  });
  it("plans nothing for an identical checkpoint", () => {
    const plan = planTensorDelta({ config, tensors: source(base) }, { config, tensors: source(base) });
    expect([plan.changed.length, plan.uploadBytes, plan.fullReloadRequired]).toEqual([0, 0, false]);
  });
  it("asks for a full reload when the structure changes, saying why", () => {
    const cases: [object, Record<string, { shape: number[]; hash: string; dtype?: string }>, RegExp][] = [
      [{ ...config, hiddenSize: 16 }, base, /config differs in hiddenSize/],
      [config, { ...base, "d.weight": { shape: [2], hash: "4" } }, /added/],
      [config, { "a.weight": base["a.weight"], "b.weight": base["b.weight"] }, /removed/],
      [config, { ...base, "c.weight": { shape: [5], hash: "3" } }, /dtype or shape/],
      [config, { ...base, "c.weight": { shape: [4], hash: "3", dtype: "F32" } }, /dtype or shape/],
    ];
    for (const [cfg, tensors, why] of cases) {
      const plan = planTensorDelta({ config, tensors: source(base) }, { config: cfg, tensors: source(tensors) });
      expect(plan.fullReloadRequired).toBe(true);
      expect(plan.reason).toMatch(why);
    }
  });
});
