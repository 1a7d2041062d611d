// OpenAI-style error answers: the one error shape every gateway route returns
// ({"error": {"message", "type", "param", "code"}}). Knows nothing about routing or workers.

/** An error the gateway answers with an HTTP status and an OpenAI error body. */
export class ApiError extends Error {
  readonly status: number;
  readonly type: string;
  readonly param: string | null;
  readonly code: string;
  constructor(status: number, code: string, message: string, param: string | null = null, type?: string) {
    super(message);
    this.name = "ApiError";
    this.status = status;
    this.code = code;
    this.param = param;
    this.type = type ?? (status >= 500 ? "server_error" : "invalid_request_error");
  }

  body(): { error: { message: string; type: string; param: string | null; code: string } } {
    return { error: { message: this.message, type: this.type, param: this.param, code: this.code } };
  }
}

/** Rebuilds an ApiError from an OpenAI error body a worker sent (or a generic one when it is not). */
export function apiErrorFromBody(status: number, body: unknown, fallback: string): ApiError {
  const e = (body as { error?: Record<string, unknown> } | null)?.error;
  if (e && typeof e.message === "string") {
    return new ApiError(
      status,
      typeof e.code === "string" ? e.code : status >= 500 ? "worker_error" : "invalid_request",
      e.message,
      typeof e.param === "string" ? e.param : null,
    );
  }
  return new ApiError(status >= 400 ? status : 502, status >= 500 ? "worker_error" : "invalid_request", fallback);
}

export function errorResponse(err: ApiError): Response {
  return new Response(JSON.stringify(err.body()), { status: err.status, headers: { "content-type": "application/json" } });
}
