// vLLM's run-time LoRA routes: POST /v1/load_lora_adapter {lora_name, lora_path} and POST
// /v1/unload_lora_adapter {lora_name}, behind the API key like every route. The gateway loads (or
// unloads) the adapter on every worker it calls, of every role, so that prefill and decode alike
// run it; a load that fails on one worker is undone on the others, and the error is the worker's
// (a 400 naming the adapter's field or tensor). Answers are vLLM's: 200 with a line of text. The
// gateway remembers what it loaded (runtime-adapters.ts): a worker that restarts without an
// adapter is given it again before it takes requests.

import { ApiError, toApiError } from "@airm/internal-api";
import type { Context, Hono } from "hono";
import { z } from "zod";
import type { Endpoint } from "../endpoint-pool.ts";
import { type GatewayAppOptions, jsonBody } from "./serving.ts";

const LoadSchema = z.object({ lora_name: z.string().min(1).max(256), lora_path: z.string().min(1), load_inplace: z.literal(false).optional() }).strict();
const UnloadSchema = z.object({ lora_name: z.string().min(1).max(256), lora_int_id: z.number().int().optional() }).strict();

/** A body checked against `schema`, or a 400 naming the first wrong field. */
function checked<T>(schema: z.ZodType<T>, body: unknown): T {
  const r = schema.safeParse(body);
  if (r.success) return r.data;
  const issue = r.error.issues[0];
  const param = issue.path.length ? issue.path.join(".") : issue.code === "unrecognized_keys" ? String((issue as { keys?: string[] }).keys?.[0]) : null;
  throw new ApiError(400, "invalid_request", `${param ?? "body"}: ${issue.message}`, param);
}

/** Every worker endpoint the gateway calls, once each (a URL in two pools is one worker). */
function workers(o: GatewayAppOptions): Endpoint[] {
  const byUrl = new Map<string, Endpoint>();
  for (const p of o.pools) for (const e of p.endpoints) if (!byUrl.has(e.url)) byUrl.set(e.url, e);
  return [...byUrl.values()];
}

async function refreshAll(o: GatewayAppOptions): Promise<void> {
  await Promise.all(o.pools.map((p) => p.refresh()));
}

async function load(c: Context, o: GatewayAppOptions): Promise<Response> {
  const b = checked(LoadSchema, await jsonBody(c));
  const served = o.modelPool.served();
  if (served.modelIds.includes(b.lora_name)) throw new ApiError(400, "invalid_request", `lora_name '${b.lora_name}' is the base model's name; pick another`, "lora_name");
  if (served.loras.has(b.lora_name)) throw new ApiError(400, "invalid_request", `The lora adapter '${b.lora_name}' has already been loaded.`, "lora_name");
  const eps = workers(o);
  const results = await Promise.allSettled(eps.map((e) => e.client.loadLora({ name: b.lora_name, path: b.lora_path })));
  const failed = results.findIndex((r) => r.status === "rejected");
  if (failed >= 0) {
    // All or none: the workers that loaded it unload it again.
    await Promise.allSettled(eps.filter((_, i) => results[i].status === "fulfilled").map((e) => e.client.unloadLora({ name: b.lora_name })));
    const err = toApiError((results[failed] as PromiseRejectedResult).reason);
    o.log?.warn({ lora: b.lora_name, worker: eps[failed].url, err: err.message }, "LoRA adapter load refused");
    throw err;
  }
  o.adapters?.add({ name: b.lora_name, path: b.lora_path });
  await refreshAll(o);
  o.log?.info({ lora: b.lora_name, path: b.lora_path, workers: eps.length }, "LoRA adapter loaded");
  return c.text(`Success: LoRA adapter '${b.lora_name}' added successfully.`);
}

async function unload(c: Context, o: GatewayAppOptions): Promise<Response> {
  const b = checked(UnloadSchema, await jsonBody(c));
  const eps = workers(o);
  o.adapters?.remove(b.lora_name);
  const results = await Promise.allSettled(eps.map((e) => e.client.unloadLora({ name: b.lora_name })));
  await refreshAll(o);
  if (!results.some((r) => r.status === "fulfilled")) {
    const first = results.map((r) => (r.status === "rejected" ? toApiError(r.reason) : null)).find((e) => e && e.status !== 404);
    if (first) throw first;
    throw new ApiError(404, "lora_not_found", `The lora adapter '${b.lora_name}' cannot be found.`, "lora_name");
  }
  o.log?.info({ lora: b.lora_name }, "LoRA adapter unloaded");
  return c.text(`Success: LoRA adapter '${b.lora_name}' removed successfully.`);
}

export function loraRoutes(app: Hono, o: GatewayAppOptions): void {
  app.post("/v1/load_lora_adapter", (c) => load(c, o));
  app.post("/v1/unload_lora_adapter", (c) => unload(c, o));
}
