// The worker's HTTP app (hono): the routes of its role (one file each under routes/) plus the
// ones every role has. The contract is @airm/internal-api's schemas (docs/internal-api.md).

import { ApiError } from "@airm/internal-api";
import { INTERNAL_TOKEN_HEADER, sameSecret } from "@airm/rm-core";
import { Hono, type MiddlewareHandler } from "hono";
import type { WorkerRuntime } from "./runtime.ts";
import { commonRoutes, probeRoutes } from "./routes/common.ts";
import { decodeRoutes } from "./routes/decode.ts";
import { drainRoutes } from "./routes/drain.ts";
import { loraRoutes } from "./lora.ts";
import { generateRoutes } from "./routes/generate.ts";
import { kvHoldRoutes } from "./routes/kv-hold.ts";
import { prefillRoutes } from "./routes/prefill.ts";

const decodeRole = (app: Hono, rt: WorkerRuntime): void => {
  kvHoldRoutes(app, rt);
  decodeRoutes(app, rt);
};
const ROLE_ROUTES = { prefill: prefillRoutes, decode: decodeRole, solo: generateRoutes } as const;

/**
 * The worker's app over a runtime that may still be loading. With `localPrefill` a decode worker
 * also serves /internal/generate: it prefills short prompts itself when an endpoint picker decided
 * not to disaggregate them (llm-d's topology: no x-prefiller-host-port).
 */
export function createWorkerApp(rt: WorkerRuntime, localPrefill = false, internalToken?: string): Hono {
  const app = new Hono();
  // A draining worker closes each connection after its answer: a client that kept one open (a
  // gateway's pool, through a Service whose proxy keeps established connections on the old pod)
  // connects again, and the Service sends the new connection to a pod that is not going away.
  app.use("*", async (c, next) => {
    await next();
    if (rt.draining) c.header("connection", "close");
  });
  if (internalToken) app.use("/internal/*", requireInternalToken(rt, internalToken));
  ROLE_ROUTES[rt.role](app, rt);
  if (localPrefill && rt.role === "decode") generateRoutes(app, rt);
  drainRoutes(app, rt);
  loraRoutes(app, rt);
  commonRoutes(app, rt);
  return app;
}

/**
 * Every /internal/* route asks the deployment's internal token (AIRM_INTERNAL_TOKEN) in the
 * x-airm-internal-token header: without it anyone who reaches the worker could start prefills or
 * pull another request's KV. /health and /metrics stay open (probes, scrapers; they start nothing).
 */
function requireInternalToken(rt: WorkerRuntime, token: string): MiddlewareHandler {
  return async (c, next) => {
    const got = c.req.header(INTERNAL_TOKEN_HEADER);
    if (sameSecret(token, got)) return next();
    rt.metrics.requests.inc({ route: c.req.path.replace(/^\/internal\//, ""), outcome: "unauthorized" });
    const why = got === undefined ? "internal_token_required" : "invalid_internal_token";
    rt.log.warn({ path: c.req.path, why }, "refused an internal call without the deployment's token");
    return new ApiError(
      401,
      why,
      `${c.req.path} needs the deployment's internal token in ${INTERNAL_TOKEN_HEADER} (AIRM_INTERNAL_TOKEN, the same for every part)`,
      null,
    ).toResponse();
  };
}

/** The plain app of `--metrics-port`: GET /health and GET /metrics only (kubelet probes and scrapers that cannot present a client certificate). */
export function createProbeApp(rt: WorkerRuntime): Hono {
  const app = new Hono();
  probeRoutes(app, rt);
  app.notFound((c) => new ApiError(404, "not_found", `the metrics port serves GET /health and GET /metrics only, not ${c.req.method} ${c.req.path}`).toResponse());
  return app;
}
