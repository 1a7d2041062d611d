// The worker's HTTP app (hono): the routes of its role (one file each under routes/) plus the
// ones every role has. The contract is @airm/internal-api's schemas (docs/internal-api.md).

import { Hono } from "hono";
import type { WorkerRuntime } from "./runtime.ts";
import { commonRoutes } from "./routes/common.ts";
import { decodeRoutes } from "./routes/decode.ts";
import { generateRoutes } from "./routes/generate.ts";
import { prefillRoutes } from "./routes/prefill.ts";

const ROLE_ROUTES = { prefill: prefillRoutes, decode: decodeRoutes, solo: generateRoutes } as const;

/**
 * The worker's app over a runtime that may still be loading. With `localPrefill` a decode worker
 * also serves /internal/generate: it prefills short prompts itself when an endpoint picker decided
 * not to disaggregate them (llm-d's topology: no x-prefiller-host-port).
 */
export function createWorkerApp(rt: WorkerRuntime, localPrefill = false): Hono {
  const app = new Hono();
  ROLE_ROUTES[rt.role](app, rt);
  if (localPrefill && rt.role === "decode") generateRoutes(app, rt);
  commonRoutes(app, rt);
  return app;
}
