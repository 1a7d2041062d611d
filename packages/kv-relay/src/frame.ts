// The relay wire format: one fixed 32-byte header per frame, then the key, then the payload.
// Knows the layout, the op and status codes and the limits; knows nothing about sockets.
//
//   offset size  field
//   0      4     magic "AKVR"
//   4      1     version (1)
//   5      1     op (requests 1..5; a response is the request's op | 0x80)
//   6      1     flags (bit 0: the crc field holds the payload's CRC-32)
//   7      1     status (responses, see below; 0 in requests)
//   8      4     tag: the sender's id for this exchange; a response echoes it (multiplexing)
//   12     2     key length in bytes (0..200)
//   14     2     reserved, must be 0
//   16     8     payload length in bytes (u64; <= 2^40)
//   24     4     CRC-32 (IEEE) of the payload when flag bit 0 is set
//   28     4     arg: a wait in ms (PULL, WAIT_SPACE, PUSH) or a count (RELEASE response)
//
// All integers are little-endian.
//
//   op  name        request key / payload                 answer
//   1   PUSH        blob key / the blob                   status; arg = the relay's expired count
//   2   PULL        blob key / none                       the blob (or status + message)
//   3   RELEASE     request id / none                     status; arg = blobs freed
//   4   WAIT_SPACE  none / u64 bytes wanted               status once that much is free (or NO_SPACE)
//   5   HELLO       none / the caller's token (UTF-8,     OK, or UNAUTHORIZED and the connection closes
//                   0..256 bytes: AIRM_INTERNAL_TOKEN)
//
//   status  0 OK, 1 TIMEOUT, 2 NO_SPACE, 3 TOO_LARGE, 4 CRC_MISMATCH, 5 INVALID_KEY,
//           6 UNAUTHORIZED (a relay with a token got a frame before a matching HELLO, or a HELLO
//           with another token; it closes the connection after this answer)
//
// An error answer carries a short UTF-8 message as its payload. A relay started with a token
// (AIRM_INTERNAL_TOKEN) wants HELLO as the first frame of every connection; a relay without one
// answers HELLO with OK and ignores its token.

import { MAX_KEY_LENGTH } from "@airm/rm-core";

export const HEADER_BYTES = 32;
export const MAGIC = 0x52564b41; // "AKVR" read as a little-endian u32
export const PROTOCOL_VERSION = 1;
export const MAX_FRAME_KEY_BYTES = MAX_KEY_LENGTH;
/** A payload length above this is a malformed frame (1 TiB: far beyond any blob). */
export const MAX_PAYLOAD_BYTES = 2 ** 40;
/** The longest token a HELLO may carry (AIRM_INTERNAL_TOKEN is 16..256 characters). */
export const MAX_HELLO_BYTES = 256;

export const Op = {
  /** key + blob; the relay answers once the blob is stored (or why not). */
  PUSH: 1,
  /** key; the relay answers with the blob, waiting up to `arg` ms for it to be pushed. */
  PULL: 2,
  /** key = a request id; frees every blob of that request. */
  RELEASE: 3,
  /** 8-byte payload = bytes wanted; answered once that much space is free, or after `arg` ms. */
  WAIT_SPACE: 4,
  /** payload = the caller's token (UTF-8, <= 256 bytes); the first frame of a connection to a relay with a token. */
  HELLO: 5,
} as const;
export type OpCode = (typeof Op)[keyof typeof Op];
export const RESPONSE_BIT = 0x80;

export const Status = {
  OK: 0,
  TIMEOUT: 1,
  NO_SPACE: 2,
  TOO_LARGE: 3,
  CRC_MISMATCH: 4,
  INVALID_KEY: 5,
  /** The caller did not present the relay's token (no HELLO first, or another token); the relay then closes the connection. */
  UNAUTHORIZED: 6,
} as const;
export type StatusCode = (typeof Status)[keyof typeof Status];

export const FLAG_CRC = 1;

export interface FrameHeader {
  version: number;
  op: number;
  flags: number;
  status: number;
  tag: number;
  keyLength: number;
  reserved: number;
  payloadLength: number;
  crc: number;
  arg: number;
}

/** Writes a header into `out` (at least 32 bytes) and returns `out`. */
export function encodeHeader(out: Buffer, h: Omit<FrameHeader, "version" | "reserved">): Buffer {
  out.writeUInt32LE(MAGIC, 0);
  out[4] = PROTOCOL_VERSION;
  out[5] = h.op;
  out[6] = h.flags;
  out[7] = h.status;
  out.writeUInt32LE(h.tag >>> 0, 8);
  out.writeUInt16LE(h.keyLength, 12);
  out.writeUInt16LE(0, 14);
  out.writeUInt32LE(h.payloadLength % 0x1_0000_0000, 16);
  out.writeUInt32LE(Math.floor(h.payloadLength / 0x1_0000_0000), 20);
  out.writeUInt32LE(h.crc >>> 0, 24);
  out.writeUInt32LE(h.arg >>> 0, 28);
  return out;
}

/** A header plus its key in one small buffer (so a frame is at most two writes: this and the payload). */
export function encodeHead(h: Omit<FrameHeader, "version" | "reserved" | "keyLength">, key = ""): Buffer {
  const keyLength = Buffer.byteLength(key, "latin1");
  const out = Buffer.allocUnsafe(HEADER_BYTES + keyLength);
  encodeHeader(out, { ...h, keyLength });
  if (keyLength) out.write(key, HEADER_BYTES, "latin1");
  return out;
}

/** Decodes 32 header bytes; never throws (checkHeader says what is wrong). */
export function decodeHeader(b: Uint8Array): FrameHeader & { magic: number } {
  const buf = Buffer.isBuffer(b) ? b : Buffer.from(b.buffer, b.byteOffset, b.byteLength);
  return {
    magic: buf.readUInt32LE(0),
    version: buf[4],
    op: buf[5],
    flags: buf[6],
    status: buf[7],
    tag: buf.readUInt32LE(8),
    keyLength: buf.readUInt16LE(12),
    reserved: buf.readUInt16LE(14),
    payloadLength: buf.readUInt32LE(16) + buf.readUInt32LE(20) * 0x1_0000_0000,
    crc: buf.readUInt32LE(24),
    arg: buf.readUInt32LE(28),
  };
}

/** Why a request header is malformed (a short reason for logs and metrics), or undefined if it is well formed. */
export function checkRequestHeader(h: FrameHeader & { magic: number }): { reason: string; detail: string } | undefined {
  if (h.magic !== MAGIC) return { reason: "bad_magic", detail: `bad magic 0x${h.magic.toString(16).padStart(8, "0")} (not an airm-kv-relay client)` };
  if (h.version !== PROTOCOL_VERSION) return { reason: "unknown_version", detail: `unknown protocol version ${h.version}; this relay speaks ${PROTOCOL_VERSION}` };
  if (h.op < Op.PUSH || h.op > Op.HELLO) return { reason: "unknown_op", detail: `unknown op ${h.op}` };
  if (h.status !== 0 || h.reserved !== 0 || (h.flags & ~FLAG_CRC) !== 0) return { reason: "bad_header", detail: "reserved header bits are set" };
  if (h.keyLength > MAX_FRAME_KEY_BYTES) return { reason: "key_too_long", detail: `key length ${h.keyLength} exceeds ${MAX_FRAME_KEY_BYTES}` };
  if (h.payloadLength > MAX_PAYLOAD_BYTES) return { reason: "payload_too_long", detail: `payload length ${h.payloadLength} exceeds ${MAX_PAYLOAD_BYTES}` };
  if (h.op === Op.HELLO) {
    if (h.payloadLength > MAX_HELLO_BYTES) return { reason: "bad_payload_length", detail: `a HELLO carries at most ${MAX_HELLO_BYTES} token bytes, not ${h.payloadLength}` };
    return undefined;
  }
  const fixed = h.op === Op.WAIT_SPACE ? 8 : h.op === Op.PUSH ? -1 : 0;
  if (fixed >= 0 && h.payloadLength !== fixed) return { reason: "bad_payload_length", detail: `op ${h.op} carries ${fixed} payload bytes, not ${h.payloadLength}` };
  return undefined;
}
