// LoRA adapters on a worker (vLLM's --enable-lora): which adapter a request names, what the KV
// manifest says about it, which adapters requests run and wait on (vllm:lora_requests_info), and
// the routes that load and unload adapters at run time (POST /internal/lora/load and /unload,
// behind the internal token like every /internal/* route; the gateway's /v1/load_lora_adapter
// calls them on every worker).

import { ApiError, LoraLoadRequestSchema, LoraUnloadRequestSchema, ROUTES, type LoraInfoBody, type LoraUnloadResponse } from "@airm/internal-api";
import { type Engine, type LoraInfo, prefixSalt, UnknownLoraError } from "@airm/rm-core";
import type { Hono } from "hono";
import { parseBody } from "./routes/http.ts";
import type { WorkerRuntime } from "./runtime.ts";

/** The adapter a request names, as the engine has it loaded; null for none. Throws UnknownLoraError (404) when it is not loaded. */
export function loraOf(engine: Engine, name: string | undefined): LoraInfo | null {
  if (name === undefined) return null;
  const loaded = engine.loras?.list() ?? [];
  const info = loaded.find((l) => l.name === name);
  if (!info)
    throw new UnknownLoraError(
      name,
      loaded.map((l) => l.name),
    );
  return info;
}

/** What the KV manifest says about the adapter (absent: the base model). */
export function manifestLora(info: LoraInfo | null): { name: string; fingerprint: string } | undefined {
  return info ? { name: info.name, fingerprint: info.fingerprint } : undefined;
}

/** The salt the engine names this request's blocks under: its cache_salt and its adapter. */
export function requestSalt(cacheSalt: string | undefined, info: LoraInfo | null): string {
  return prefixSalt(cacheSalt, info?.fingerprint);
}

function infoBody(l: LoraInfo): LoraInfoBody {
  return { name: l.name, path: l.path, rank: l.rank, fingerprint: l.fingerprint, resident: l.resident };
}

/** The engine's adapters, or a 400 that says the worker was started without them. */
function lorasOf(rt: WorkerRuntime): NonNullable<Engine["loras"]> {
  const loras = rt.ready().engine.loras;
  if (!loras) throw new ApiError(400, "lora_not_enabled", `this ${rt.role} worker serves no LoRA adapters; start it with --enable-lora`, null);
  return loras;
}

export function loraRoutes(app: Hono, rt: WorkerRuntime): void {
  app.post(ROUTES.loraLoad, async (c) => {
    const loras = lorasOf(rt);
    const b = await parseBody(c, LoraLoadRequestSchema);
    const info = await loras.load(b.name, b.path);
    rt.log.info({ lora: info.name, path: info.path, rank: info.rank }, "LoRA adapter loaded");
    return c.json(infoBody(info));
  });

  app.post(ROUTES.loraUnload, async (c) => {
    const loras = lorasOf(rt);
    const b = await parseBody(c, LoraUnloadRequestSchema);
    if (!loras.unload(b.name))
      throw new UnknownLoraError(
        b.name,
        loras.list().map((l) => l.name),
      );
    rt.log.info({ lora: b.name }, "LoRA adapter unloaded");
    return c.json({ name: b.name, unloaded: true } satisfies LoraUnloadResponse);
  });
}

/** /health's lora: the limits and every loaded adapter (absent when the engine serves none). */
export function loraHealth(engine: Engine | undefined): { lora?: { maxLoras: number; maxLoraRank: number; adapters: LoraInfoBody[] } } {
  const loras = engine?.loras;
  return loras ? { lora: { maxLoras: loras.maxLoras, maxLoraRank: loras.maxLoraRank, adapters: loras.list().map(infoBody) } } : {};
}
