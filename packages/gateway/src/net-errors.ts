// What a failed call to a worker says about the worker: a short cause for messages, and whether
// nothing listens there at all. Used by the endpoint pool's probes and the orchestrator's calls.

/** A short cause of a failed fetch: "timed out", ECONNREFUSED, or the message. */
export function causeOf(err: unknown): string {
  const e = err as Error & { cause?: { code?: string; message?: string } };
  if (e?.name === "TimeoutError") return "timed out";
  if (e?.cause) return e.cause.code ?? e.cause.message ?? String(e.cause);
  return e?.message ?? String(err);
}

/**
 * True when nothing listens at the endpoint (the connection was refused, or no route or name):
 * the endpoint is down until a probe says otherwise. A connection that was accepted and then
 * dropped is not that: behind a Service the next connection may reach another pod, and one pod
 * going away must not take the whole endpoint out of the pool.
 */
export function nothingListens(err: unknown): boolean {
  const code = (err as { cause?: { code?: string } })?.cause?.code;
  return code === "ECONNREFUSED" || code === "EHOSTUNREACH" || code === "ENETUNREACH" || code === "ENOTFOUND" || code === "EAI_AGAIN";
}
