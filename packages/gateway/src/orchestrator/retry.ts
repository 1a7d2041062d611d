// The one retry the orchestrator makes inside an attempt: a worker call that failed before the
// worker took anything of the request (it refused the connection, was full, or its call never
// started) goes to the next healthy endpoint of the same pool; once each was tried, to one that is
// healthy again within the wait (a restarted worker). Failures after the first token are
// migration's (migration.ts), not this.
import type { Span } from "@opentelemetry/api";
import type { Endpoint, EndpointPool } from "../endpoint-pool.ts";
import { notePick } from "./worker-calls.ts";

/** What a failed call means: the client left (stop), retry elsewhere (with why, for the span), or this error ends the attempt. */
export type Failure = { stop: true } | { retry: string } | { fail: unknown };

export interface RetryOptions<T> {
  pool: EndpointPool;
  /** The endpoint the first call goes to (its outstanding count already taken). */
  first: Endpoint;
  span: Span;
  /** One call on `ep` (`attempt` 0 for the first). */
  call(ep: Endpoint, attempt: number): Promise<T>;
  /** What a failure of the call on `ep` means. */
  failed(err: unknown, ep: Endpoint): Failure;
  /** The error when a retry is wanted but no endpoint is left. */
  exhausted(err: unknown, ep: Endpoint): unknown;
  /** The request now runs on `ep` (the outstanding counts have moved). */
  moved(ep: Endpoint): void;
  /**
   * With no untried endpoint left: how long to wait for any endpoint of the pool to be healthy
   * again (the one that died, restarted) before giving up; 0 or absent: give up at once.
   */
  waitMs?: number;
  /** Ends that wait (the client left). */
  signal?: AbortSignal;
}

/** Endpoints tried at most this many times over by one call's retries (a restarted one counts again). */
const MAX_ROUNDS = 3;

/** The first answer of the call on `first` or the endpoints after it; null when the client left. */
export async function onNextEndpoints<T>(o: RetryOptions<T>): Promise<T | null> {
  const tried = new Set<Endpoint>();
  let ep = o.first;
  for (let attempt = 0; ; attempt++) {
    tried.add(ep);
    try {
      return await o.call(ep, attempt);
    } catch (err) {
      const f = o.failed(err, ep);
      if ("stop" in f) return null;
      if ("fail" in f) throw f.fail;
      const next = o.pool.pick(tried) ?? (await again(o, attempt));
      if (!next) throw o.exhausted(err, ep);
      o.span.addEvent("airm.retry", { "airm.from": ep.url, "airm.to": next.url, "airm.reason": f.retry });
      notePick(o.span, o.pool, next, tried);
      ep.outstanding--;
      next.outstanding++;
      ep = next;
      o.moved(ep);
    }
  }
}

/**
 * Every endpoint was tried: one that comes back healthy within `waitMs` (a worker that died and was
 * restarted) is picked again, up to MAX_ROUNDS times the pool's size in all.
 */
async function again<T>(o: RetryOptions<T>, attempt: number): Promise<Endpoint | undefined> {
  if (!o.waitMs || !o.signal || attempt + 1 >= MAX_ROUNDS * o.pool.endpoints.length) return undefined;
  return (await o.pool.untilHealthy(o.waitMs, o.signal)) ? o.pool.pick() : undefined;
}
