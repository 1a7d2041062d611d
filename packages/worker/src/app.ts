// The worker's HTTP app (hono): the routes of its role (one file each under routes/) plus the
// ones every role has. The contract is @airm/internal-api's schemas (docs/internal-api.md).

import { Hono } from "hono";
import type { WorkerRuntime } from "./runtime.ts";
import { commonRoutes } from "./routes/common.ts";
import { decodeRoutes } from "./routes/decode.ts";
import { generateRoutes } from "./routes/generate.ts";
import { prefillRoutes } from "./routes/prefill.ts";

const ROLE_ROUTES = { prefill: prefillRoutes, decode: decodeRoutes, solo: generateRoutes } as const;

/** The worker's app over a runtime that may still be loading. */
export function createWorkerApp(rt: WorkerRuntime): Hono {
  const app = new Hono();
  ROLE_ROUTES[rt.role](app, rt);
  commonRoutes(app, rt);
  return app;
}
