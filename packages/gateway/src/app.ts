// The gateway's hono app: the drain's guard (drain.ts), the OpenAI routes behind the API keys (when
// set), and OpenAI-shaped errors for everything else.

import { GrammarChecker } from "@airm/grammar";
import { ApiError } from "@airm/internal-api";
import { Hono } from "hono";
import { requireApiKey } from "./api-keys.ts";
import { GatewayDrain } from "./drain.ts";
import { openAIRoutes } from "./openai/routes.ts";
import type { GatewayAppOptions } from "./openai/serving.ts";

export type { GatewayAppOptions } from "./openai/serving.ts";

/**
 * The app. `grammar` defaults to a checker of its own (its thread does not keep the process
 * alive), `tools` to the hermes parser (AIRM_TOOL_CALL_PARSER's default), `drain` to one that has
 * not begun.
 */
export function createGatewayApp(
  options: Omit<GatewayAppOptions, "grammar" | "tools"> & Partial<Pick<GatewayAppOptions, "grammar" | "tools">> & { apiKeys?: string[]; openPaths?: string[] },
): Hono {
  const o = {
    ...options,
    grammar: options.grammar ?? new GrammarChecker(),
    tools: options.tools ?? { parser: "hermes" as const },
    drain: options.drain ?? new GatewayDrain(),
  };
  const app = new Hono();
  // First: a draining gateway refuses before it asks for a key or reads a body.
  app.use("*", o.drain.middleware());
  if (o.apiKeys?.length) app.use("*", requireApiKey(o.apiKeys, o.openPaths ?? []));
  app.onError((err) => (err instanceof ApiError ? err : new ApiError(500, "internal_error", `gateway error: ${(err as Error).message}`)).toResponse());
  app.notFound((c) =>
    new ApiError(404, "not_found", `no route ${c.req.method} ${c.req.path}; see /v1/completions, /v1/chat/completions, /v1/models, /health, /metrics`).toResponse(),
  );
  openAIRoutes(app, o);
  return app;
}
