// The one error type of the HTTP surfaces (gateway and workers): an HTTP status plus the OpenAI
// error body {"error": {"message", "type", "param", "code"}}. Workers answer with it, the gateway
// rebuilds it from a worker's body and passes it on, and rm-core's typed errors map onto it here.

import { isAirmError, type AirmError } from "@airm/rm-core";
import { z } from "zod";

export const ErrorBodySchema = z.object({
  error: z
    .object({
      message: z.string().describe("what happened and what to do next"),
      type: z.string().describe("invalid_request_error (4xx) or server_error (5xx)"),
      param: z.string().nullable().describe("the request field at fault, if any"),
      code: z.string().describe("a stable code (table below)"),
      requested: z.number().int().optional().describe("context_overflow: prompt + max_tokens"),
      limit: z.number().int().optional().describe("context_overflow: the limit passed (max_model_len, or the KV cache's tokens)"),
    })
    .loose(),
});
export type ErrorBody = z.infer<typeof ErrorBodySchema>;

/** An error answered with `status` and an OpenAI error body. */
export class ApiError extends Error {
  readonly status: number;
  readonly code: string;
  readonly param: string | null;
  readonly type: string;
  /** Extra fields of the error object (e.g. `requested`, `limit`). */
  readonly extra: Record<string, unknown>;

  constructor(status: number, code: string, message: string, param: string | null = null, extra: Record<string, unknown> = {}, type?: string) {
    super(message);
    this.name = "ApiError";
    this.status = status;
    this.code = code;
    this.param = param;
    this.extra = extra;
    this.type = type ?? (status >= 500 ? "server_error" : "invalid_request_error");
  }

  body(): ErrorBody {
    return { error: { message: this.message, type: this.type, param: this.param, code: this.code, ...this.extra } };
  }

  /** A JSON response with this error's status and body. */
  toResponse(headers: Record<string, string> = {}): Response {
    return new Response(JSON.stringify(this.body()), { status: this.status, headers: { "content-type": "application/json", ...headers } });
  }

  /**
   * Rebuilds the error a peer answered with `status` and `body` (an OpenAI error body: message,
   * type, param, code; extra fields stay behind), or a generic one saying `fallback` when the body
   * is not one.
   */
  static fromBody(status: number, body: unknown, fallback: string): ApiError {
    const parsed = ErrorBodySchema.safeParse(body);
    if (parsed.success) {
      const { message, type, param, code } = parsed.data.error;
      return new ApiError(status, code, message, param, {}, type);
    }
    return new ApiError(status >= 400 ? status : 502, status >= 500 ? "worker_error" : "invalid_request", fallback);
  }
}

/** 429 server_overloaded: a full waiting queue. Answered with Retry-After (seconds). */
export class OverloadedError extends ApiError {
  constructor(
    readonly retryAfterS: number,
    message: string,
  ) {
    super(429, "server_overloaded", message);
  }

  override toResponse(headers: Record<string, string> = {}): Response {
    return super.toResponse({ "retry-after": String(this.retryAfterS), ...headers });
  }
}

/**
 * Maps any failure to the API error a caller sees: ApiError as is; rm-core's typed errors by code
 * (context overflow 400, KV integrity 502, KV cache full 503, KV timeout 504, transport 502, a
 * grammar the request got wrong 400 and one that failed 500); anything else 500 with `fallbackCode`.
 */
export function toApiError(err: unknown, fallbackCode = "engine_error"): ApiError {
  if (err instanceof ApiError) return err;
  if (isAirmError(err, "CONTEXT_OVERFLOW")) {
    const e = err as AirmError & { requested: number; limit: number };
    return new ApiError(400, "context_overflow", e.message, "max_tokens", { requested: e.requested, limit: e.limit });
  }
  if (isAirmError(err, "KV_INTEGRITY")) return new ApiError(502, "kv_integrity_error", err.message, (err as AirmError & { field?: string }).field ?? null);
  // Blocks that were not free when a request ran: transient, another worker (or a retry) serves it.
  if (isAirmError(err, "KV_CACHE_FULL") || isAirmError(err, "PREEMPTED")) return new ApiError(503, "kv_cache_full", err.message);
  if (isAirmError(err, "TRANSPORT_TIMEOUT")) return new ApiError(504, "kv_timeout", err.message);
  if (isAirmError(err) && (err.code.startsWith("TRANSPORT") || err.code === "INVALID_KEY" || err.code === "UNSUPPORTED")) {
    return new ApiError(502, "kv_transport_error", err.message);
  }
  // A request naming an adapter the worker has not loaded: vLLM answers 404 for an unknown model.
  if (isAirmError(err, "UNKNOWN_LORA")) return new ApiError(404, "lora_not_found", err.message, "lora");
  if (isAirmError(err, "CONFIG"))
    return new ApiError(400, "invalid_request", err.message, (err as AirmError & { key?: string; field?: string }).key ?? (err as AirmError & { field?: string }).field ?? null);
  if (isAirmError(err, "GRAMMAR")) {
    const e = err as AirmError & { invalid: boolean; param: string | null };
    return e.invalid ? new ApiError(400, "invalid_request", e.message, e.param) : new ApiError(500, "grammar_error", `structured output failed: ${e.message}`, e.param);
  }
  return new ApiError(500, fallbackCode, `${fallbackCode === "engine_error" ? "engine failed: " : ""}${(err as Error)?.message ?? String(err)}`);
}

/** The first issue of a zod error as a 400 naming the field. */
export function invalidRequest(error: z.ZodError, prefix = ""): ApiError {
  const issue = error.issues[0];
  const param = issue.path.length ? issue.path.map(String).join(".") : null;
  const message = param ? `${prefix}${param}: ${issue.message}` : `${prefix}${issue.message}`;
  return new ApiError(400, "invalid_request", message, param);
}
