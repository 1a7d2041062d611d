// POST /internal/drain and DELETE /internal/drain: drain a worker on request (an operator's console,
// a script) without stopping its process. Draining, it admits nothing new (503 worker_draining, so a
// gateway sends the request to another worker), reports 503 "draining" on /health and
// airm_draining 1 on /metrics (pickers and probes stop sending it work), and lets what runs finish.
// DELETE resumes a drain that this route started; a drain a stop signal started is final (409).
// Behind the internal token like every /internal/* route.

import { ApiError, ROUTES } from "@airm/internal-api";
import type { Hono } from "hono";
import type { WorkerRuntime } from "../runtime.ts";

/** What a drain call answers: the state after it, and what the worker still holds. */
function drainState(rt: WorkerRuntime): { draining: boolean; drained_by: string | null; in_flight: number; leases: number } {
  return { draining: rt.draining, drained_by: rt.drainedBy, in_flight: rt.inFlight(), leases: rt.leases.counters().outstanding };
}

export function drainRoutes(app: Hono, rt: WorkerRuntime): void {
  app.get(ROUTES.drain, (c) => c.json(drainState(rt)));

  app.post(ROUTES.drain, (c) => {
    if (!rt.draining) {
      rt.draining = true;
      rt.drainedBy = "api";
      rt.log.info({ in_flight: rt.inFlight() }, "draining on request (POST /internal/drain): no new requests");
    }
    return c.json(drainState(rt));
  });

  app.delete(ROUTES.drain, (c) => {
    if (rt.drainedBy === "signal") throw new ApiError(409, "stopping", `this ${rt.role} worker drains because it was told to stop (a signal); it cannot take work again`);
    if (rt.draining) {
      rt.draining = false;
      rt.drainedBy = null;
      rt.log.info("drain ended on request (DELETE /internal/drain): admitting requests again");
    }
    return c.json(drainState(rt));
  });
}
