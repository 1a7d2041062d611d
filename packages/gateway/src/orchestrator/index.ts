// Runs one generation against the workers as a stream of GenEvents: PD (prefill + decode
// workers) or solo. Owns timeouts, endpoint choice, terminal releases and the error a client sees
// for a worker fault; knows nothing about the OpenAI wire format or stop strings.

import { randomBytes } from "node:crypto";
import type { EndpointPool } from "../endpoint-pool.ts";
import type { GenerationRequest } from "../openai/parse.ts";
import type { GenEvent } from "./gen-events.ts";
import { runPd } from "./pd.ts";
import { runSolo } from "./solo.ts";

export type { GenEvent } from "./gen-events.ts";

export interface OrchestratorOptions {
  prefill?: EndpointPool;
  decode?: EndpointPool;
  solo?: EndpointPool;
  prefillTimeoutMs: number;
  decodeIdleTimeoutMs: number;
  kvTimeoutMs: number;
}

/** A fresh request id: `cmpl-` + 24 hex digits (a valid rm-core request id). */
export function newRequestId(): string {
  return `cmpl-${randomBytes(12).toString("hex")}`;
}

export class Orchestrator {
  constructor(private readonly o: OrchestratorOptions) {}

  /** True when the gateway runs against a solo worker instead of a prefill/decode pair. */
  get isSolo(): boolean {
    return this.o.solo !== undefined;
  }

  /**
   * The events of one generation. Abandoning the generator (return()) or aborting `signal` ends
   * the request on the workers. Throws ApiError for worker faults (5xx) and rejected input (4xx).
   */
  run(req: GenerationRequest, requestId: string, signal: AbortSignal): AsyncGenerator<GenEvent> {
    const { prefill, decode, solo } = this.o;
    if (solo) return runSolo(solo, this.o, req, requestId, signal);
    return runPd({ ...this.o, prefill: prefill!, decode: decode! }, req, requestId, signal);
  }
}
