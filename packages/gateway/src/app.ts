// The gateway's hono app: the OpenAI routes behind the API keys (when set), and OpenAI-shaped
// errors for everything else.

import { ApiError } from "@airm/internal-api";
import { Hono } from "hono";
import { requireApiKey } from "./api-keys.ts";
import { openAIRoutes, type GatewayAppOptions } from "./openai/routes.ts";

export type { GatewayAppOptions } from "./openai/routes.ts";

export function createGatewayApp(o: GatewayAppOptions & { apiKeys?: string[]; openPaths?: string[] }): Hono {
  const app = new Hono();
  if (o.apiKeys?.length) app.use("*", requireApiKey(o.apiKeys, o.openPaths ?? []));
  app.onError((err) => (err instanceof ApiError ? err : new ApiError(500, "internal_error", `gateway error: ${(err as Error).message}`)).toResponse());
  app.notFound((c) =>
    new ApiError(404, "not_found", `no route ${c.req.method} ${c.req.path}; see /v1/completions, /v1/chat/completions, /v1/models, /health, /metrics`).toResponse(),
  );
  openAIRoutes(app, o);
  return app;
}
