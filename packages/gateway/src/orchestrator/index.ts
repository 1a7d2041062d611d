// Runs one generation against the workers as a stream of GenEvents: PD (prefill + decode
// workers) or solo. Owns timeouts, endpoint choice, terminal releases and the error a client sees
// for a worker fault; knows nothing about the OpenAI wire format or stop strings.

import { randomBytes } from "node:crypto";
import { trace } from "@opentelemetry/api";
import type { Endpoint, EndpointPool } from "../endpoint-pool.ts";
import type { Generation } from "./generation.ts";
import type { PrefixRouter } from "../prefix-router.ts";
import type { GenEvent } from "./gen-events.ts";
import { choosePath, type DisaggregationMode, type PathChoice } from "./disaggregation.ts";
import { migrating, type MigrationHooks, type MigrationTrail } from "./migration.ts";
import { runPd } from "./pd.ts";
import { runSolo } from "./solo.ts";

export type { GenEvent } from "./gen-events.ts";
export { isMigratable, type MigrationHooks } from "./migration.ts";
export { timeoutSignal } from "./worker-calls.ts";
export { DISAGGREGATION_MODES, estimatesOf, type DisaggregationMode, type PathChoice } from "./disaggregation.ts";

export interface OrchestratorOptions {
  prefill?: EndpointPool;
  decode?: EndpointPool;
  solo?: EndpointPool;
  prefillTimeoutMs: number;
  decodeIdleTimeoutMs: number;
  kvTimeoutMs: number;
  /** How long a request waits for a healthy worker of a role (a restarting one) before 503 (AIRM_WORKER_WAIT_S; default 0). */
  workerWaitMs?: number;
  /**
   * PD: a request no endpoint picker gave a prefill pod (no x-prefiller-host-port) runs whole on a
   * decode worker (its /internal/generate: `airm-worker --local-prefill`), as llm-d's sidecar does.
   */
  localPrefill?: boolean;
  /** With localPrefill: how a request's path is chosen (default auto; see disaggregation.ts). */
  disaggregation?: DisaggregationMode;
  /** Told each PD request's path and why. */
  onPath?(requestId: string, path: PathChoice): void;
  /** Request migration (limit 0: none); see migration.ts. */
  migration?: MigrationHooks;
  /** Prefix-aware routing (AIRM_ROUTING=prefix); absent: the pools pick by their own rule. */
  router?: PrefixRouter;
}

/** A fresh request id: `cmpl-` + 24 hex digits (a valid rm-core request id). */
export function newRequestId(): string {
  return `cmpl-${randomBytes(12).toString("hex")}`;
}

/** Where a request runs when the caller chose (an endpoint picker's header). */
export interface Placement {
  prefill?: Endpoint;
}

export class Orchestrator {
  /** Requests that have not had their first token yet (queued or in prefill). */
  private beforeFirst = 0;
  /** Requests streaming tokens after their first. */
  private streaming = 0;

  constructor(private readonly o: OrchestratorOptions) {}

  /** The requests this gateway holds, by stage (for the vllm:* gauges). */
  get inFlight(): { beforeFirst: number; streaming: number } {
    return { beforeFirst: this.beforeFirst, streaming: this.streaming };
  }

  /** True when the gateway runs against a solo worker instead of a prefill/decode pair. */
  get isSolo(): boolean {
    return this.o.solo !== undefined;
  }

  /**
   * The events of one generation. Abandoning the generator (return()) or aborting `signal` ends
   * the request on the workers. Throws ApiError for worker faults (5xx) and rejected input (4xx).
   */
  run(req: Generation, requestId: string, signal: AbortSignal, at: Placement = {}): AsyncGenerator<GenEvent> {
    const { prefill, decode, solo } = this.o;
    // The request's span (gateway.request) gets an event per attempt and per migration, when it records.
    const active = trace.getActiveSpan();
    const span = active?.isRecording() ? active : undefined;
    // A moved attempt picks its own prefill worker: the one an endpoint picker named may be the one that failed.
    const { router } = this.o;
    const o = this.o;
    async function* dispatch(r: Generation, id: string, trail: MigrationTrail, first: boolean): AsyncGenerator<GenEvent> {
      if (solo) {
        span?.addEvent("airm.dispatch", { "airm.request_id": id, "airm.path": "solo" });
        return yield* runSolo(solo, { ...o, trail }, r, id, signal);
      }
      const prefillAt = first ? at.prefill : undefined;
      // Where the prompt's blocks are, once for the path and the picks (prefix routing).
      const affinity = router ? await router.affinity(r, [prefill!, decode!], decode!, signal) : null;
      if (signal.aborted) return;
      const held = affinity ? Math.max(0, ...decode!.endpoints.filter((e) => e.healthy).map((e) => affinity.matched(e))) * affinity.blockSize : 0;
      const path = choosePath(o.disaggregation ?? "auto", o.localPrefill === true, prefillAt !== undefined, r.input, o, held);
      o.onPath?.(id, path);
      span?.addEvent("airm.dispatch", {
        "airm.request_id": id,
        "airm.path": path.local ? "local" : "pd",
        "airm.path.reason": path.reason,
        ...(path.decision?.pdMs !== undefined ? { "airm.path.pd_ms": path.decision.pdMs } : {}),
        ...(path.decision?.localMs !== undefined ? { "airm.path.local_ms": path.decision.localMs } : {}),
      });
      if (path.local) return yield* runSolo(decode!, { ...o, trail, affinity }, r, id, signal);
      return yield* runPd({ ...o, prefill: prefill!, decode: decode!, prefillAt, trail, affinity }, r, id, signal);
    }
    const hooks = this.o.migration ?? { limit: 0 };
    const traced: MigrationHooks = {
      ...hooks,
      onMigrate(m) {
        span?.addEvent("airm.migration", {
          "airm.attempt": m.attempt,
          "airm.resume_at": m.resumeAt,
          "airm.failed_role": m.role,
          "airm.reason": m.reason,
          ...(m.from ? { "airm.failed_worker": m.from } : {}),
          "airm.error": m.error,
        });
        span?.setAttribute("airm.migrations", m.attempt);
        hooks.onMigrate?.(m);
      },
    };
    return this.counted(migrating(dispatch, req, requestId, signal, traced));
  }

  /** `gen`, counted as before-first until its first event and as streaming after it, until it ends. */
  private async *counted(gen: AsyncGenerator<GenEvent>): AsyncGenerator<GenEvent> {
    let first = false;
    this.beforeFirst++;
    try {
      for await (const ev of gen) {
        if (!first) {
          first = true;
          this.beforeFirst--;
          this.streaming++;
        }
        yield ev;
      }
    } finally {
      if (first) this.streaming--;
      else this.beforeFirst--;
    }
  }
}
