// vLLM's tokenizer routes and model routes besides the completions: POST /tokenize and POST
// /detokenize (with vLLM's request and answer shapes; the tokenizer and chat template are the
// workers', so the gateway asks one), GET /v1/models/{id} and GET /version.

import { ApiError, type PromptInput } from "@airm/internal-api";
import type { Context, Hono } from "hono";
import { z } from "zod";
import type { EndpointPool } from "../../endpoint-pool.ts";
import { messageSchema, messagesOf } from "../chat/request.ts";
import { toolsOf } from "../chat/tools.ts";
import { fromZod } from "../request-common.ts";

const common = { model: z.string().nullish(), return_token_strs: z.boolean().nullish() };

/** vLLM's TokenizeCompletionRequest or TokenizeChatRequest (the fields it reads; others refused by name). */
const tokenizeSchema = z.union([
  z.object({ ...common, prompt: z.string(), add_special_tokens: z.boolean().nullish() }).strict(),
  z
    .object({
      ...common,
      messages: z.array(messageSchema).min(1),
      add_generation_prompt: z.boolean().nullish(),
      add_special_tokens: z.boolean().nullish(),
      continue_final_message: z.literal(false).nullish(),
      tools: z.unknown().optional(),
    })
    .strict(),
]);

const detokenizeSchema = z.object({ model: z.string().nullish(), tokens: z.array(z.number().int().min(0)) }).strict();

async function body(c: Context): Promise<unknown> {
  try {
    return await c.req.json();
  } catch (err) {
    throw new ApiError(400, "invalid_json", `the request body is not valid JSON: ${(err as Error).message}`);
  }
}

/** A healthy worker of `pool` serving the request's model (404 for another model, 503 without one). */
function workerFor(pool: EndpointPool, model: string | null | undefined) {
  const { modelIds, loras } = pool.served();
  // An adapter tokenizes as its base model does.
  if (model && !modelIds.includes(model) && !loras.has(model)) {
    throw new ApiError(404, "model_not_found", `the model '${model}' does not exist; this server serves ${[...modelIds, ...loras.keys()].join(", ")}`, "model");
  }
  const ep = pool.pick();
  if (!ep) throw new ApiError(503, "no_healthy_worker", `no healthy ${pool.role} worker: ${pool.describeDown()}`);
  return ep;
}

export function tokenizeRoutes(app: Hono, pool: EndpointPool, version: string): void {
  app.post("/tokenize", async (c) => {
    const raw = await body(c);
    const r = tokenizeSchema.safeParse(raw);
    if (!r.success) throw fromZod(r.error);
    const b = r.data;
    let input: PromptInput;
    if ("prompt" in b) {
      if (b.prompt.length === 0) throw new ApiError(400, "invalid_request", "prompt is empty", "prompt");
      input = { prompt: b.prompt };
    } else {
      const tools = toolsOf({ tools: b.tools, tool_choice: "none" }, { parser: null }).tools;
      input = tools ? { messages: messagesOf(b.messages), tools } : { messages: messagesOf(b.messages) };
    }
    const ep = workerFor(pool, b.model);
    const addGenerationPrompt = "messages" in b ? (b.add_generation_prompt ?? true) : true;
    const t = await ep.client.tokenize({ input, ...(b.add_special_tokens != null ? { addSpecialTokens: b.add_special_tokens } : {}), addGenerationPrompt });
    return c.json({ count: t.tokens.length, max_model_len: t.maxModelLen, tokens: t.tokens, token_strs: b.return_token_strs ? t.tokenStrs : null });
  });

  app.post("/detokenize", async (c) => {
    const r = detokenizeSchema.safeParse(await body(c));
    if (!r.success) throw fromZod(r.error);
    const t = await workerFor(pool, r.data.model).client.detokenize({ tokens: r.data.tokens });
    return c.json({ prompt: t.text });
  });

  app.get("/v1/models/:id", (c) => {
    const id = c.req.param("id");
    const { modelIds, maxContext, loras } = pool.served();
    const lora = loras.get(id);
    if (!modelIds.includes(id) && !lora) {
      throw new ApiError(404, "model_not_found", `the model '${id}' does not exist; this server serves ${[...modelIds, ...loras.keys()].join(", ") || "none yet"}`, "model");
    }
    const family = lora ? { root: lora.path, parent: lora.parent } : { root: id, parent: null };
    return c.json({ id, object: "model", created: Math.floor(Date.now() / 1000), owned_by: "rngd-pd", ...family, max_model_len: maxContext ?? null });
  });

  app.get("/version", (c) => c.json({ version }));
}
