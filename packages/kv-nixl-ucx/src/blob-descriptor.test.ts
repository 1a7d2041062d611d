import { describe, expect, test } from "vitest";
import { isAirmError } from "@airm/rm-core";
import { decodeDescriptor, encodeDescriptor, type BlobDescriptor } from "./blob-descriptor.ts";

const sample: BlobDescriptor = {
  producerId: "00112233445566778899aabbccddeeff",
  workerAddress: new Uint8Array(Array.from({ length: 79 }, (_, i) => (i * 7) & 0xff)),
  rkey: new Uint8Array([1, 2, 3, 4, 5, 6, 7, 8, 9, 10]),
  remoteAddr: 0x7f12_3456_7000,
  length: 1 << 20,
  crc32: 0xdeadbeef,
  ackAddr: 0x7f12_3450_0010,
  ackValue: 42,
};

describe("blob descriptor", () => {
  test("round-trips every field", () => {
    const bytes = encodeDescriptor(sample);
    expect(bytes.byteLength).toBe(64 + 79 + 10);
    expect(decodeDescriptor(bytes, "r/0/k")).toEqual(sample);
  });

  test("any flipped byte is refused with a TransportError, never decoded", () => {
    const bytes = encodeDescriptor(sample);
    for (const at of [0, 5, 13, 30, 40, 45, 50, 57, 61, 64, 100, bytes.byteLength - 1]) {
      const bad = new Uint8Array(bytes);
      bad[at] ^= 0x10;
      let err: unknown;
      try {
        decodeDescriptor(bad, "r/0/k");
      } catch (e) {
        err = e;
      }
      expect(isAirmError(err, "TRANSPORT_ERROR"), `byte ${at}`).toBe(true);
    }
  });

  test("truncated, empty and foreign payloads are refused", () => {
    const bytes = encodeDescriptor(sample);
    for (const bad of [new Uint8Array(0), bytes.subarray(0, 63), bytes.subarray(0, bytes.byteLength - 1), new TextEncoder().encode("x".repeat(200))]) {
      expect(() => decodeDescriptor(bad, "r/0/k")).toThrow(/not a nixl-ucx descriptor/);
    }
  });
});
