// POST /internal/kv-hold (decode role): tokenizes the prompt as the prefill side will, and holds
// the longest prefix of it this worker's prefix cache keeps (whole blocks, short of the prompt's
// last token) for the request, answering how many blocks and the block hash of the last. The
// gateway passes that to the prefill side, which then pushes only the blocks after them; this
// worker's decode imports them beside the held ones.

import { ApiError, KvHoldRequestSchema, ROUTES, type KvHoldResponse } from "@airm/internal-api";
import type { Hono } from "hono";
import { tokenize } from "../generation.ts";
import { loraOf } from "../lora.ts";
import type { WorkerRuntime } from "../runtime.ts";
import { parseBody } from "./http.ts";

export function kvHoldRoutes(app: Hono, rt: WorkerRuntime): void {
  app.post(ROUTES.kvHold, async (c) => {
    const { engine } = rt.ready();
    const b = await parseBody(c, KvHoldRequestSchema);
    rt.admit("kv_hold");
    const prompt = tokenize(engine, b.input);
    const tokens = b.resume ? [...prompt, ...b.resume] : prompt;
    const answer: KvHoldResponse = { requestId: b.requestId, held: null, promptTokens: tokens.length };
    loraOf(engine, b.lora);
    const named = { ...(b.cacheSalt === undefined ? {} : { cacheSalt: b.cacheSalt }), ...(b.lora === undefined ? {} : { lora: b.lora }) };
    const hold = engine.holdPrefix?.(tokens, { maxPositions: tokens.length - 1, ...named });
    if (!hold || hold.n === 0 || hold.hash === null) {
      hold?.release();
      return c.json(answer);
    }
    if (!rt.holds.put(b.requestId, hold)) {
      hold.release();
      throw new ApiError(409, "duplicate_request", `request ${b.requestId} already holds KV blocks on this worker`, "requestId");
    }
    rt.noteHold(hold.n);
    return c.json({ ...answer, held: { blocks: hold.n / engine.kvCache().blockSize, hash: hold.hash, positions: hold.n } });
  });
}
