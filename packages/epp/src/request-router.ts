// Turns a request body into a destination: parses it (400 when it cannot be routed), asks the
// picker, and applies the failure mode when the picker itself fails (FailOpen: any endpoint in
// turn; FailClose: 500). Counts picks and times each decision. Knows nothing of gRPC.

import { hostPortOf } from "@airm/routing";
import type { EppMetrics } from "./epp-metrics.ts";
import type { RouteAnswer, Router } from "./ext-proc-stream.ts";
import type { Log } from "./log.ts";
import type { EndpointState } from "./metrics-scraper.ts";
import type { Picker } from "./picker.ts";
import type { PreciseAffinity, PrefixEvents } from "./prefix-events.ts";
import { BadRequestBody, type InferenceRequest, parseInferenceBody } from "./request-body.ts";
import type { PickReason } from "@airm/routing";

export type FailureMode = "FailOpen" | "FailClose";
export const FAILURE_MODES = ["FailOpen", "FailClose"] as const;

export interface RouterOptions {
  picker: Pick<Picker, "pick" | "pickAny" | "fresh">;
  /** Precise prefix routing (--routing prefix): the KV events' index and the tokenizer calls. */
  events?: PrefixEvents;
  failureMode: FailureMode;
  metrics?: EppMetrics;
  log: Log;
}

export class PickingRouter implements Router {
  constructor(private readonly o: RouterOptions) {}

  route(body: Buffer | null, headers: Map<string, string>): RouteAnswer | Promise<RouteAnswer> {
    const t0 = performance.now();
    const done = (answer: RouteAnswer) => {
      this.o.metrics?.decisionMs.observe(performance.now() - t0);
      return answer;
    };
    let req: InferenceRequest | null = null;
    try {
      if (body !== null) req = parseInferenceBody(body);
    } catch (e) {
      return done(this.failed(e));
    }
    const events = this.o.events;
    if (!req || !events) return done(this.decide(req, headers, null));
    return events
      .affinity(req.tokenize, this.o.picker.fresh())
      .catch(() => null)
      .then((precise) => done(this.decide(req, headers, precise)));
  }

  private decide(req: InferenceRequest | null, headers: Map<string, string>, precise: PreciseAffinity | null): RouteAnswer {
    try {
      if (req === null) return this.any("round_robin");
      const p = this.o.picker.pick(req.model, req.prompt, precise);
      if (!p.ok) return { kind: "refuse", status: p.status, code: p.code, message: p.message };
      this.count(p.destination, p.reason);
      if (p.prefill) this.count(p.prefill, p.prefillReason!);
      if (p.local) this.o.metrics?.picks.inc({ reason: "local_prefill", role: p.destination.endpoint.role });
      if (p.path) this.o.metrics?.paths.inc({ path: p.local ? "local" : "pd", reason: p.path.reason });
      const answer: RouteAnswer = { kind: "route", destination: p.destination.key, prefill: p.prefill?.key ?? null };
      this.o.log.debug({ requestId: headers.get("x-request-id"), model: req.model, ...answer, reason: p.reason, path: p.path?.reason, ...p.path?.decision }, "picked");
      return answer;
    } catch (e) {
      return this.failed(e);
    }
  }

  /** A body that cannot be routed (400), or the picker's own failure (the failure mode says what then). */
  private failed(e: unknown): RouteAnswer {
    if (e instanceof BadRequestBody) return { kind: "refuse", status: 400, code: "invalid_request", message: e.message, param: e.param };
    this.o.log.error({ err: (e as Error).message, failureMode: this.o.failureMode }, "picker failed");
    if (this.o.failureMode === "FailOpen") return this.any("fail_open");
    return { kind: "refuse", status: 500, code: "picker_error", message: `the endpoint picker failed: ${(e as Error).message}` };
  }

  /** Any decode-capable endpoint in turn (requests without a body, fail-open). */
  private any(reason: PickReason): RouteAnswer {
    const s = this.o.picker.pickAny();
    if (!s) return { kind: "refuse", status: 503, code: "no_endpoints", message: "the pool has no decode endpoint" };
    this.count(s, reason);
    return { kind: "route", destination: hostPortOf(s.endpoint), prefill: null };
  }

  private count(s: EndpointState, reason: PickReason): void {
    this.o.metrics?.picks.inc({ reason, role: s.endpoint.role });
  }
}
