// The descriptor a producer publishes under a blob's key: where the bytes sit in its registered
// arena (worker address, remote address, length, packed rkey), their CRC-32, and the ack word the
// consumer writes when done. Binary, little-endian, a few hundred bytes, sealed by a CRC-32 of its
// own (bytes 60..63) so a damaged descriptor never reaches UCX, whose address parser aborts the
// process on garbage. Knows nothing of UCX calls.

import { crc32 } from "@node-rs/crc32";
import { TransportError } from "@airm/rm-core";

const MAGIC = 0x58435541; // "AUCX"
const VERSION = 1;
const FIXED = 64;
const MAX_VAR = 16 * 1024;
const SEAL_AT = 60;

export interface BlobDescriptor {
  /** 16 random bytes naming the producer endpoint (hex); consumers cache connections by it. */
  producerId: string;
  /** The producer's UCX worker address. */
  workerAddress: Uint8Array;
  /** The producer arena's packed rkey. */
  rkey: Uint8Array;
  /** Virtual address of the blob in the producer's arena. */
  remoteAddr: number;
  length: number;
  crc32: number;
  /** Where the consumer puts `ackValue` (4 bytes) once it has read the blob. */
  ackAddr: number;
  ackValue: number;
}

/** Serialises a descriptor. */
export function encodeDescriptor(d: BlobDescriptor): Uint8Array {
  const out = Buffer.alloc(FIXED + d.workerAddress.byteLength + d.rkey.byteLength);
  out.writeUInt32LE(MAGIC, 0);
  out.writeUInt8(VERSION, 4);
  out.writeUInt16LE(d.workerAddress.byteLength, 6);
  out.writeUInt16LE(d.rkey.byteLength, 8);
  Buffer.from(d.producerId, "hex").copy(out, 12);
  out.writeBigUInt64LE(BigInt(d.remoteAddr), 28);
  out.writeBigUInt64LE(BigInt(d.length), 36);
  out.writeUInt32LE(d.crc32 >>> 0, 44);
  out.writeBigUInt64LE(BigInt(d.ackAddr), 48);
  out.writeUInt32LE(d.ackValue >>> 0, 56);
  out.set(d.workerAddress, FIXED);
  out.set(d.rkey, FIXED + d.workerAddress.byteLength);
  out.writeUInt32LE(crc32(out) >>> 0, SEAL_AT);
  return out;
}

/** Parses a descriptor. Throws TransportError for anything that is not a well-formed v1 descriptor. */
export function decodeDescriptor(bytes: Uint8Array, key: string): BlobDescriptor {
  const bad = (why: string) => new TransportError(`the relay entry under ${key} is not a nixl-ucx descriptor (${why}); was it pushed by another transport or a different version?`);
  if (bytes.byteLength < FIXED) throw bad(`${bytes.byteLength} bytes`);
  const b = Buffer.from(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  if (b.readUInt32LE(0) !== MAGIC) throw bad("wrong magic");
  if (b.readUInt8(4) !== VERSION) throw bad(`version ${b.readUInt8(4)}`);
  const sealed = b.readUInt32LE(SEAL_AT);
  const unsealed = Buffer.from(b);
  unsealed.writeUInt32LE(0, SEAL_AT);
  if (crc32(unsealed) >>> 0 !== sealed) throw bad("its own CRC-32 does not match: the descriptor was damaged");
  const addrLen = b.readUInt16LE(6);
  const rkeyLen = b.readUInt16LE(8);
  if (addrLen === 0 || rkeyLen === 0 || addrLen + rkeyLen > MAX_VAR || FIXED + addrLen + rkeyLen !== b.byteLength) throw bad("inconsistent lengths");
  const remoteAddr = Number(b.readBigUInt64LE(28));
  const length = Number(b.readBigUInt64LE(36));
  const ackAddr = Number(b.readBigUInt64LE(48));
  if (!Number.isSafeInteger(remoteAddr) || !Number.isSafeInteger(length) || !Number.isSafeInteger(ackAddr)) throw bad("address out of range");
  return {
    producerId: b.subarray(12, 28).toString("hex"),
    remoteAddr,
    length,
    crc32: b.readUInt32LE(44),
    ackAddr,
    ackValue: b.readUInt32LE(56),
    workerAddress: new Uint8Array(b.subarray(FIXED, FIXED + addrLen)),
    rkey: new Uint8Array(b.subarray(FIXED + addrLen, FIXED + addrLen + rkeyLen)),
  };
}
