// The /v1/chat/completions route: the chat body parsed (request.ts, through the dispatcher's
// checks across fields) and served on the shared path (../serving.ts), answered as a
// chat.completion or its SSE chunks.

import type { Hono } from "hono";
import { parseGenerationRequest } from "../parse.ts";
import { type GatewayAppOptions, serveGeneration } from "../serving.ts";

export function chatRoutes(app: Hono, o: GatewayAppOptions): void {
  serveGeneration(app, o, {
    path: "/v1/chat/completions",
    kind: "chat",
    parse: (body, options) => ({ req: parseGenerationRequest("chat", body, options), body: undefined }),
  });
}
