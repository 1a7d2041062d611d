import { expect, test } from "vitest";
import { FLAG_CRC, HEADER_BYTES, MAGIC, Op, checkRequestHeader, decodeHeader, encodeHead } from "./frame.ts";

test("a header round-trips every field, including payload lengths above 4 GiB", () => {
  const head = encodeHead({ op: Op.PUSH, flags: FLAG_CRC, status: 0, tag: 0xfffffffe, payloadLength: 5 * 2 ** 32 + 123, crc: 0xdeadbeef, arg: 4242 }, "req/3/v");
  expect(head.length).toBe(HEADER_BYTES + 7);
  expect(head.subarray(0, 4).toString("latin1")).toBe("AKVR");
  const h = decodeHeader(head);
  expect(h).toMatchObject({ magic: MAGIC, version: 1, op: Op.PUSH, flags: FLAG_CRC, tag: 0xfffffffe, keyLength: 7, payloadLength: 5 * 2 ** 32 + 123, crc: 0xdeadbeef, arg: 4242 });
  expect(head.subarray(HEADER_BYTES).toString("latin1")).toBe("req/3/v");
  expect(checkRequestHeader(h)).toBeUndefined();
});

test("checkRequestHeader names what is wrong", () => {
  const ok = decodeHeader(encodeHead({ op: Op.PULL, flags: 0, status: 0, tag: 1, payloadLength: 0, crc: 0, arg: 0 }, "a/0/k"));
  expect(checkRequestHeader({ ...ok, magic: 1 })?.reason).toBe("bad_magic");
  expect(checkRequestHeader({ ...ok, version: 2 })?.reason).toBe("unknown_version");
  expect(checkRequestHeader({ ...ok, op: 0 })?.reason).toBe("unknown_op");
  expect(checkRequestHeader({ ...ok, keyLength: 201 })?.reason).toBe("key_too_long");
  expect(checkRequestHeader({ ...ok, keyLength: 200 })).toBeUndefined();
  expect(checkRequestHeader({ ...ok, flags: 2 })?.reason).toBe("bad_header");
  expect(checkRequestHeader({ ...ok, op: Op.WAIT_SPACE, payloadLength: 4 })?.reason).toBe("bad_payload_length");
  expect(checkRequestHeader({ ...ok, op: Op.WAIT_SPACE, payloadLength: 8 })).toBeUndefined();
  expect(checkRequestHeader({ ...ok, op: Op.HELLO, keyLength: 0, payloadLength: 0 })).toBeUndefined();
  expect(checkRequestHeader({ ...ok, op: Op.HELLO, keyLength: 0, payloadLength: 256 })).toBeUndefined();
  expect(checkRequestHeader({ ...ok, op: Op.HELLO, keyLength: 0, payloadLength: 257 })?.reason).toBe("bad_payload_length");
  expect(checkRequestHeader({ ...ok, op: 6 })?.reason).toBe("unknown_op");
});
