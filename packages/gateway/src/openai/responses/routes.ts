// The /v1/responses route: the Responses body run as the chat request it means (responses.ts) on
// the shared path (../serving.ts), answered as a Response object or its event stream.

import type { Hono } from "hono";
import { type GatewayAppOptions, serveGeneration } from "../serving.ts";
import { parseResponsesRequest, responsesJson, responsesSse } from "./responses.ts";

export function responsesRoutes(app: Hono, o: GatewayAppOptions): void {
  serveGeneration(app, o, {
    path: "/v1/responses",
    kind: "responses",
    parse: parseResponsesRequest,
    answer: (c, a, body) => (a.req.stream ? responsesSse(c, a, body) : responsesJson(c, a, body)),
  });
}
