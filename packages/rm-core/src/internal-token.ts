// The internal shared secret (AIRM_INTERNAL_TOKEN) of one deployment's parts: how a caller names
// it on an HTTP request, how a fresh one is made, and the constant-time comparison every checker
// (worker routes, the KV relay) uses. Where the secret comes from is RM_CORE_CONFIG.

import { createHash, randomBytes, timingSafeEqual } from "node:crypto";

/** The HTTP header a gateway (or any internal caller) sends the token in. */
export const INTERNAL_TOKEN_HEADER = "x-airm-internal-token";

/** A fresh token: 32 random bytes, base64url (43 characters). */
export function newInternalToken(): string {
  return randomBytes(32).toString("base64url");
}

const digest = (s: string) => createHash("sha256").update(s, "utf8").digest();

/** True when `got` is `expected`, compared by SHA-256 in constant time (no length or prefix leak). */
export function sameSecret(expected: string, got: string | null | undefined): boolean {
  if (typeof got !== "string") return false;
  return timingSafeEqual(digest(expected), digest(got));
}
