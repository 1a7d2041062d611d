import { describe, expect, test } from "vitest";
import { blobKey, manifestKey, requestIdOf, validateKey, validateRequestId } from "./kv-key.ts";
import { isAirmError } from "./errors.ts";

describe("kv keys", () => {
  test("accepts request/layer/kind keys", () => {
    expect(validateKey(blobKey("req-1", 31, "v"))).toBe("req-1/31/v");
    expect(validateKey(manifestKey("r.2_x"))).toBe("r.2_x/manifest");
    expect(requestIdOf("abc/3/k")).toBe("abc");
  });
  test.each(["..", "a/../b", "/abs", "a//b", "a/", "a\0b", ".x", "x".repeat(201), "", "a b", "a\\b", "ü"])("rejects %j", (k) => {
    let err: unknown;
    try {
      validateKey(k);
    } catch (e) {
      err = e;
    }
    expect(isAirmError(err, "INVALID_KEY")).toBe(true);
  });
  test("request ids are one segment", () => {
    expect(() => validateRequestId("a/b")).toThrow(/must not contain/);
    expect(validateRequestId("abc")).toBe("abc");
  });
});
