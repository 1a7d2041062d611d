// API keys for the OpenAI routes (AIRM_API_KEY / --api-key), as the OpenAI API and vLLM ask them:
// `Authorization: Bearer <key>`, else 401 with an OpenAI error body and `WWW-Authenticate`. Keys
// are compared by their SHA-256 in constant time and never logged. Some paths (probes, the
// endpoint picker's /metrics) can stay open.

import { createHash, timingSafeEqual } from "node:crypto";
import { ApiError } from "@airm/internal-api";
import type { MiddlewareHandler } from "hono";

const digest = (s: string) => createHash("sha256").update(s, "utf8").digest();

/** A hono middleware asking one of `keys` on every path but `openPaths` (`none` in it: no open path). */
export function requireApiKey(keys: string[], openPaths: string[]): MiddlewareHandler {
  const wanted = keys.map(digest);
  const open = new Set(openPaths.includes("none") ? [] : openPaths);
  return async (c, next) => {
    if (open.has(c.req.path)) return next();
    const m = /^Bearer\s+(\S+)\s*$/i.exec(c.req.header("authorization") ?? "");
    if (!m) {
      return new ApiError(401, "missing_api_key", "this server needs an API key: send `Authorization: Bearer <key>`", null).toResponse({ "www-authenticate": "Bearer" });
    }
    const got = digest(m[1]!);
    // Every key is compared (no early exit), each in constant time.
    let ok = false;
    for (const w of wanted) ok = timingSafeEqual(w, got) || ok;
    if (!ok) return new ApiError(401, "invalid_api_key", "the API key is not valid", null).toResponse({ "www-authenticate": "Bearer" });
    return next();
  };
}
