// Request migration: a streamed generation whose worker fails after the first token (it died, its
// stream broke or went silent, its KV never arrived, it handed the request back on drain) goes on
// elsewhere. The prompt and the completion tokens already sent are prefilled again (the worker
// contract's `resume`), on a prefill worker with a KV handoff to a healthy decode worker, or on a
// solo / local-prefill worker, and the stream resumes at the next token. The numerics make the
// rest exact: prefill computes the same bits as decoding token by token, and the sampler draws
// token p with (seed, p), so the resumed tokens are those the first worker would have sent. The
// client sees one stream: the same id, no duplicate, no gap, usage counted once.

import { ApiError } from "@airm/internal-api";
import type { Endpoint } from "../endpoint-pool.ts";
import type { Generation } from "./generation.ts";
import type { GenEvent } from "./gen-events.ts";

/** Which worker an attempt blames for its failure, and the endpoints later attempts avoid. */
export interface MigrationTrail {
  avoid: Set<Endpoint>;
  blamed?: { role: string; url: string };
}

/** Records that `endpoint` (of `role`) failed this attempt: the next one avoids it. */
export function blame(trail: MigrationTrail | undefined, role: string, endpoint: Endpoint): void {
  if (!trail) return;
  trail.blamed = { role, url: endpoint.url };
  trail.avoid.add(endpoint);
}

/**
 * Error codes of a failure another worker can take over: the worker broke or went silent, could
 * not be reached or was not ready when the request moved to it, lost the KV on its way (the
 * prefill worker died after answering), or handed the request back while draining. Not: bad
 * input, a full server, a KV that arrived corrupted (kv_integrity_error is a fault to surface,
 * never to paper over), a grammar failure.
 */
const MIGRATABLE = new Set([
  "worker_stream_broken",
  "worker_timeout",
  "worker_draining",
  "worker_unreachable",
  "decode_unreachable",
  "prefill_unreachable",
  "not_ready",
  "kv_timeout",
  "kv_transport_error",
]);

/** Codes of a worker that refused a request at admission (draining, or restarting and still loading). */
const REFUSED = new Set(["worker_draining", "not_ready"]);

export function isMigratable(err: unknown): err is ApiError {
  return err instanceof ApiError && MIGRATABLE.has(err.code);
}

export interface MigrationHooks {
  /** Most migrations of one generation (0: none). */
  limit: number;
  /** A stream broke at `resumeAt` tokens and moves (counted before the new attempt starts). */
  onMigrate?(m: { requestId: string; attempt: number; resumeAt: number; role: string; reason: string; from: string | null; error: string }): void;
  /** The moved stream's next token arrived `seconds` after the break. */
  onResumed?(m: { requestId: string; attempt: number; resumeAt: number; seconds: number }): void;
}

type Dispatch = (req: Generation, requestId: string, trail: MigrationTrail, first: boolean) => AsyncGenerator<GenEvent>;

/**
 * The events of one generation, moved to another worker on a migratable failure after its first
 * token, at most `hooks.limit` times. A resumed attempt's first token becomes the token event it
 * stands for (or nothing, when it ends the completion: the done event says so).
 */
export async function* migrating(dispatch: Dispatch, req: Generation, requestId: string, signal: AbortSignal, hooks: MigrationHooks): AsyncGenerator<GenEvent> {
  const trail: MigrationTrail = { avoid: new Set() };
  if (hooks.limit === 0 || req.n > 1) {
    yield* dispatch(req, requestId, trail, true);
    return;
  }
  const sent: number[] = [];
  let attempt = 0;
  let brokeAt = 0;
  for (;;) {
    // Before any token a new attempt is a plain retry; after, it resumes from the tokens sent.
    const resume = sent.length ? [...sent] : undefined;
    const gen = dispatch(resume ? { ...req, echo: false, resume } : req, attempt > 0 ? `${requestId}-m${attempt}` : requestId, trail, attempt === 0);
    try {
      for await (const ev of gen) {
        if (ev.type === "first" && resume) {
          hooks.onResumed?.({ requestId, attempt, resumeAt: resume.length, seconds: (performance.now() - brokeAt) / 1000 });
          const f = ev.first;
          // An end-of-sequence token that ends the completion has no token event (decode's rule).
          if (f.eos && !req.ignoreEos) continue;
          sent.push(f.token);
          yield { type: "token", index: sent.length - 1, token: f.token, text: f.text, ...(f.logprobs ? { logprobs: f.logprobs } : {}) };
          continue;
        }
        if (ev.type === "first") sent.push(ev.first.token);
        else if (ev.type === "token") sent.push(ev.token);
        yield ev;
      }
      return;
    } catch (err) {
      // Before its first token a request moves only when a worker refused it at admission (it took nothing).
      if (signal.aborted || (sent.length === 0 && !(isMigratable(err) && REFUSED.has(err.code)))) throw err;
      if (!isMigratable(err) || attempt >= hooks.limit) {
        if (attempt === 0 || !(err instanceof ApiError)) throw err;
        const why = isMigratable(err) ? `its ${attempt} migration(s) (AIRM_MIGRATION_LIMIT) are spent` : "it could not move";
        throw new ApiError(err.status, err.code, `the stream broke after ${sent.length} tokens and ${why}: ${err.message}`, err.param);
      }
      attempt++;
      brokeAt = performance.now();
      const blamed = trail.blamed;
      trail.blamed = undefined;
      hooks.onMigrate?.({ requestId, attempt, resumeAt: sent.length, role: blamed?.role ?? "unknown", reason: err.code, from: blamed?.url ?? null, error: err.message });
    }
  }
}
