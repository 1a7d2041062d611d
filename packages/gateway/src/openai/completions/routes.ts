// The /v1/completions route: the completions body parsed (request.ts, through the dispatcher's
// checks across fields) and served on the shared path (../serving.ts), answered as a
// text_completion or its SSE chunks.

import type { Hono } from "hono";
import { parseGenerationRequest } from "../parse.ts";
import { type GatewayAppOptions, serveGeneration } from "../serving.ts";

export function completionsRoutes(app: Hono, o: GatewayAppOptions): void {
  serveGeneration(app, o, {
    path: "/v1/completions",
    kind: "completion",
    parse: (body, options) => ({ req: parseGenerationRequest("completion", body, options), body: undefined }),
  });
}
