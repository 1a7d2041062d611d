import { describe, expect, test } from "vitest";
import { blobBytes, decodeManifest, encodeManifest, kvCrc32, validateManifest, verifyBlob, windowedBlob, type KVManifest } from "./kv-manifest.ts";
import { KVIntegrityError } from "./errors.ts";

function manifest(over: Partial<KVManifest> = {}): KVManifest {
  const m: KVManifest = {
    layout: "rngd-pd/v2",
    dtype: "bf16",
    blockSize: 4,
    n: 5,
    blocks: 2,
    layers: 2,
    kvHeads: 2,
    headDim: 4,
    modelFingerprint: "m1",
    numericsFingerprint: "n1",
    requestId: "r1",
    firstToken: 7,
    crc: { k: [0, 0], v: [0, 0] },
    ...over,
  };
  return m;
}

function fieldOf(f: () => unknown): string | undefined {
  try {
    f();
  } catch (e) {
    if (e instanceof KVIntegrityError) return e.field;
    throw e;
  }
  return undefined;
}

describe("KV manifest", () => {
  test("held: blocks the decode side holds do not cross; the statement is checked", () => {
    const hash = "ab".repeat(32);
    // n=13 in blocks of 4: 4 blocks, the first 2 held
    const m = validateManifest(manifest({ n: 13, blocks: 4, held: { blocks: 2, hash } }));
    const block = 2 * 4 * 4 * 2; // kv heads x head dim x block size x bf16
    expect(blobBytes(m, 0)).toBe(2 * block);
    expect(blobBytes(m)).toBe(4 * block);
    const blob = Uint8Array.from({ length: 4 * block }, (_, i) => i % 251);
    const trimmed = windowedBlob(m, 1, blob, "trim");
    expect(Buffer.from(trimmed).equals(Buffer.from(blob.subarray(2 * block)))).toBe(true);
    // held blocks are the decode side's own: nothing is widened back
    expect(windowedBlob(m, 1, trimmed, "widen")).toBe(trimmed);
    // at least one position crosses; the hash is a block hash; no sliding window beside it
    expect(fieldOf(() => validateManifest(manifest({ n: 8, blocks: 2, held: { blocks: 2, hash } })))).toBe("held");
    expect(fieldOf(() => validateManifest(manifest({ n: 13, blocks: 4, held: { blocks: 0, hash } })))).toBe("held");
    expect(fieldOf(() => validateManifest(manifest({ n: 13, blocks: 4, held: { blocks: 1, hash: "xyz" } })))).toBe("held");
    expect(fieldOf(() => validateManifest(manifest({ n: 13, blocks: 4, held: { blocks: 1, hash }, slidingWindow: { window: 6, layers: [0], zeroBlocks: 2 } })))).toBe("held");
  });

  test("a sliding-window statement agrees with n and block size, and with the receiver's model", () => {
    // n=13 in blocks of 4, a window of 6: a query at 13 reads [8, 13], so blocks 0 and 1 are zero
    const at13 = { n: 13, blocks: 4, slidingWindow: { window: 6, layers: [0], zeroBlocks: 2 } };
    const want = { window: 6, layers: [0] };
    expect(validateManifest(manifest(at13), { slidingWindow: want }).slidingWindow).toEqual(at13.slidingWindow);
    expect(fieldOf(() => validateManifest(manifest({ ...at13, slidingWindow: { ...at13.slidingWindow, zeroBlocks: 1 } })))).toBe("slidingWindow");
    expect(fieldOf(() => validateManifest(manifest({ ...at13, slidingWindow: { ...at13.slidingWindow, layers: [2] } })))).toBe("slidingWindow");
    // the receiver's model has another window, or none; or it has one the manifest does not state
    expect(fieldOf(() => validateManifest(manifest(at13), { slidingWindow: { window: 8, layers: [0] } }))).toBe("slidingWindow");
    expect(fieldOf(() => validateManifest(manifest(at13), { slidingWindow: null }))).toBe("slidingWindow");
    expect(fieldOf(() => validateManifest(manifest(), { slidingWindow: want }))).toBe("slidingWindow");
    expect(validateManifest(manifest(), { slidingWindow: null }).slidingWindow).toBeUndefined();
  });
  test("a sliding-window layer's blob crosses without its zero blocks and is widened again; others pass unchanged", () => {
    const m = manifest({ n: 13, blocks: 4, slidingWindow: { window: 6, layers: [0], zeroBlocks: 2 } });
    const block = 2 * 4 * 4 * 2;
    expect(blobBytes(m, 0)).toBe(2 * block);
    expect(blobBytes(m, 1)).toBe(4 * block);
    expect(blobBytes(m)).toBe(4 * block);
    const full = new Uint8Array(4 * block);
    for (let i = 2 * block; i < full.length; i++) full[i] = (i * 7) % 251 || 1;
    const crossed = windowedBlob(m, 0, full, "trim");
    expect(crossed.byteLength).toBe(2 * block);
    verifyBlob({ ...m, crc: { k: [kvCrc32(crossed), 0], v: [0, 0] } }, 0, "k", crossed);
    // the whole blob is refused for that layer: its size says the zero blocks came along
    expect(fieldOf(() => verifyBlob({ ...m, crc: { k: [kvCrc32(full), 0], v: [0, 0] } }, 0, "k", full))).toBe("bytes");
    expect(Buffer.from(windowedBlob(m, 0, crossed, "widen")).equals(Buffer.from(full))).toBe(true);
    expect(windowedBlob(m, 1, full, "trim")).toBe(full);
  });
  test("blob size is blocks x kv_heads x head_dim x block size x 2", () => {
    expect(blobBytes(manifest())).toBe(2 * 2 * 4 * 4 * 2);
    // Llama-3.1-8B, a 20-token prompt in blocks of 16: 2 blocks of 32 KiB per layer's K or V.
    expect(blobBytes({ kvHeads: 8, headDim: 128, blockSize: 16, blocks: 2, dtype: "bf16" })).toBe(2 * 32768);
  });
  test("round trips through bytes", () => {
    const m = manifest();
    expect(decodeManifest(encodeManifest(m))).toEqual(m);
  });
  test.each([
    [{ layout: "rngd-pd/v0" }, "layout"],
    [{ dtype: "fp32" }, "dtype"],
    [{ blockSize: 0 }, "blockSize"],
    [{ blockSize: 12, blocks: 1 }, "blockSize"],
    [{ n: 9 }, "blocks"],
    [{ blocks: 3 }, "blocks"],
    [{ n: 0 }, "n"],
    [{ requestId: "../x" }, "requestId"],
    [{ modelFingerprint: "" }, "modelFingerprint"],
    [{ crc: { k: [1], v: [1, 2] } }, "crc"],
  ] as [Partial<KVManifest>, string][])("a bad %j names field %s", (over, field) => {
    expect(fieldOf(() => validateManifest(manifest(over as Partial<KVManifest>)))).toBe(field);
  });
  test.each([
    ["modelFingerprint", "other-model"],
    ["numericsFingerprint", "n2"],
    ["headDim", 8],
    ["blockSize", 16],
    ["layers", 3],
  ] as const)("a mismatch of %s with this side is refused naming it", (field, want) => {
    const err = (() => {
      try {
        validateManifest(manifest(), { [field]: want });
      } catch (e) {
        return e as KVIntegrityError;
      }
    })();
    expect(err?.field).toBe(field);
    expect(err?.message).toContain(field);
  });
  test("verifyBlob checks length and CRC", () => {
    const k0 = new Uint8Array(blobBytes(manifest())).map((_, i) => i);
    const m = manifest({ crc: { k: [kvCrc32(k0), 0], v: [0, 0] } });
    expect(() => verifyBlob(m, 0, "k", k0)).not.toThrow();
    const bad = new Uint8Array(k0);
    bad[3] ^= 0x10;
    expect(fieldOf(() => verifyBlob(m, 0, "k", bad))).toBe("crc");
    expect(fieldOf(() => verifyBlob(m, 0, "k", k0.subarray(1)))).toBe("bytes");
  });
  test("verifyBlob compares the CRC a transport measured on arrival with the manifest", () => {
    const k0 = new Uint8Array(blobBytes(manifest())).map((_, i) => i);
    const m = manifest({ crc: { k: [kvCrc32(k0), 0], v: [0, 0] } });
    // A transport measured a different CRC on arrival than the manifest carries: refused.
    expect(fieldOf(() => verifyBlob(m, 0, "k", { bytes: new Uint8Array(k0), crc32: kvCrc32(k0) ^ 1 }))).toBe("crc");
    // The measured value is what is compared: right bytes with a wrong measurement fail, and
    // bytes without a measurement are computed here and pass.
    expect(() => verifyBlob(m, 0, "k", { bytes: new Uint8Array(k0), crc32: null })).not.toThrow();
    expect(() => verifyBlob(m, 0, "k", { bytes: new Uint8Array(k0), crc32: kvCrc32(k0) })).not.toThrow();
    const damaged = new Uint8Array(k0);
    damaged[3] ^= 1;
    expect(fieldOf(() => verifyBlob(m, 0, "k", { bytes: damaged, crc32: null }))).toBe("crc");
  });
  test("garbage bytes are a manifest error, not a crash", () => {
    expect(fieldOf(() => decodeManifest(new Uint8Array([0xff, 0xfe, 0x00])))).toBe("manifest");
  });
  test("a LoRA adapter's KV continues only with the same adapter; the base model's only without one", () => {
    const a = { name: "sql", fingerprint: "f".repeat(64) };
    const b = { name: "sql", fingerprint: "e".repeat(64) };
    expect(validateManifest(manifest({ lora: a }), { lora: a }).lora).toEqual(a);
    expect(validateManifest(manifest(), { lora: null }).lora).toBeUndefined();
    expect(fieldOf(() => validateManifest(manifest({ lora: a }), { lora: b }))).toBe("lora");
    expect(fieldOf(() => validateManifest(manifest({ lora: a }), { lora: null }))).toBe("lora");
    expect(fieldOf(() => validateManifest(manifest(), { lora: a }))).toBe("lora");
    expect(() => validateManifest(manifest(), { lora: a })).toThrow(/computed with the base model \(no adapter\), but this request decodes with LoRA adapter "sql"/);
    // Not checked when this side says nothing.
    expect(validateManifest(manifest({ lora: a })).lora).toEqual(a);
  });
});
