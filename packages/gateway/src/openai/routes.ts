// The OpenAI-compatible routes, mounted: /health, /metrics and /v1/models here, then each
// endpoint folder's own: tokenize/ (/tokenize, /detokenize, /v1/models/{id}, /version),
// completions/ (/v1/completions), chat/ (/v1/chat/completions) and responses/ (/v1/responses),
// which share the serving path of serving.ts (parse, run, then the JSON or the SSE answer).

import { createRequire } from "node:module";
import type { Hono } from "hono";
import { chatRoutes } from "./chat/routes.ts";
import { completionsRoutes } from "./completions/routes.ts";
import { loraRoutes } from "./lora.ts";
import { responsesRoutes } from "./responses/routes.ts";
import type { GatewayAppOptions } from "./serving.ts";
import { tokenizeRoutes } from "./tokenize/routes.ts";

/** This gateway's version (GET /version). */
const VERSION = (createRequire(import.meta.url)("../../package.json") as { version: string }).version;

export function openAIRoutes(app: Hono, o: GatewayAppOptions): void {
  tokenizeRoutes(app, o.modelPool, VERSION);
  app.get("/health", (c) => {
    const roles = o.pools.map((p) => ({
      role: p.role,
      endpoints: p.endpoints.map((e) => ({ url: e.url, healthy: e.healthy, circuit: e.breaker.state, outstanding: e.outstanding, error: e.lastError })),
    }));
    const ok = o.pools.every((p) => p.endpoints.some((e) => e.healthy));
    // Draining: not ready, whatever the workers say, so that nothing routes here any more.
    const status = o.drain?.draining ? "draining" : ok ? "ok" : "degraded";
    return c.json({ status, mode: o.orchestrator.isSolo ? "solo" : "pd", roles, open_requests: o.drain?.openRequests ?? 0 }, status === "ok" ? 200 : 503);
  });

  app.get("/metrics", async () => new Response(await o.metrics.registry.metrics(), { headers: { "content-type": o.metrics.registry.contentType } }));

  app.get("/v1/models", (c) => {
    const created = Math.floor(Date.now() / 1000);
    const { modelIds, maxContext, loras } = o.modelPool.served();
    const card = (id: string, parent: string | null, root: string | null) => ({
      id,
      object: "model",
      created,
      owned_by: "rngd-pd",
      root,
      parent,
      max_model_len: maxContext ?? null,
    });
    // As vLLM lists them: the base model, then each LoRA adapter with its folder (root) and base (parent).
    const data = [...modelIds.map((id) => card(id, null, id)), ...[...loras].map(([name, l]) => card(name, l.parent, l.path))];
    return c.json({ object: "list", data });
  });

  loraRoutes(app, o);

  completionsRoutes(app, o);
  chatRoutes(app, o);
  responsesRoutes(app, o);
}
