// Writes safetensors files: a deterministic header (tensors in the order given, fixed key order)
// followed by each tensor's little-endian bytes, streamed one tensor at a time so a big model
// never sits in memory twice. Knows nothing about where the values come from.

import { closeSync, openSync, writeSync } from "node:fs";

export type SafetensorsDtype = "BF16" | "F16" | "F32";

export interface TensorToWrite {
  name: string;
  dtype: SafetensorsDtype;
  shape: number[];
  /** Produces the tensor's raw little-endian bytes (exactly elements x element size). */
  bytes(): Uint8Array;
}

const ELEMENT_BYTES: Record<SafetensorsDtype, number> = { BF16: 2, F16: 2, F32: 4 };

/** Byte size of a tensor's data. */
export function tensorByteLength(t: { dtype: SafetensorsDtype; shape: number[] }): number {
  return t.shape.reduce((a, b) => a * b, 1) * ELEMENT_BYTES[t.dtype];
}

/**
 * Writes `tensors` to `file` in the given order. `metadata` goes under `__metadata__`. The header
 * is padded with spaces to a multiple of 8 bytes. Throws if a tensor's bytes have the wrong length.
 */
export function writeSafetensors(file: string, tensors: TensorToWrite[], metadata?: Record<string, string>): void {
  const header: Record<string, unknown> = {};
  if (metadata) header.__metadata__ = metadata;
  let offset = 0;
  for (const t of tensors) {
    const n = tensorByteLength(t);
    header[t.name] = { dtype: t.dtype, shape: t.shape, data_offsets: [offset, offset + n] };
    offset += n;
  }
  let json = JSON.stringify(header);
  json += " ".repeat((8 - (Buffer.byteLength(json) % 8)) % 8);
  const headerBytes = Buffer.from(json, "utf8");
  const prefix = Buffer.alloc(8);
  prefix.writeBigUInt64LE(BigInt(headerBytes.length));
  const fd = openSync(file, "w");
  try {
    writeSync(fd, prefix);
    writeSync(fd, headerBytes);
    for (const t of tensors) {
      const bytes = t.bytes();
      if (bytes.length !== tensorByteLength(t)) throw new Error(`tensor ${t.name}: produced ${bytes.length} bytes, expected ${tensorByteLength(t)}`);
      let done = 0;
      while (done < bytes.length) done += writeSync(fd, bytes, done, bytes.length - done);
    }
  } finally {
    closeSync(fd);
  }
}
