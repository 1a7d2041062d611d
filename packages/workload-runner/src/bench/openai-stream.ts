// One streamed request to an OpenAI-compatible server, timed as a client sees it: time to the
// first content chunk, the gaps between chunks, the end, tokens in and out (the server's usage
// when it sends one, else the chunks counted), and the error when it failed. Failures are data:
// nothing here throws for a refused connection, an error status or an error event.

import { sseEvents } from "./sse.ts";
import type { RequestRow } from "./stats.ts";

export interface StreamRequest {
  /** Base URL ending before /v1 (http://127.0.0.1:8000). */
  url: string;
  model: string;
  /** The prompt as token ids: its length is exactly the input token count, with any tokenizer. */
  promptTokenIds: number[];
  maxTokens: number;
  apiKey?: string;
  /** Ends the request (the run's deadline). */
  signal?: AbortSignal;
}

/** The content chunks of an SSE body as they arrive (their arrival time) and the final usage, if any. */
async function readStream(body: ReadableStream<Uint8Array>, t0: number, onChunk: (atMs: number) => void): Promise<{ usageOut: number | null; error: string | null }> {
  let usageOut: number | null = null;
  let error: string | null = null;
  try {
    for await (const ev of sseEvents<StreamEvent>(body)) {
      if (ev.error) error = ev.error.message ?? JSON.stringify(ev.error);
      if (ev.usage?.completion_tokens !== undefined) usageOut = ev.usage.completion_tokens;
      if (ev.choices?.length) onChunk(performance.now() - t0);
    }
  } catch (e) {
    error = `the stream broke: ${(e as Error).message}`;
  }
  return { usageOut, error };
}

interface StreamEvent {
  choices?: unknown[];
  usage?: { completion_tokens?: number };
  error?: { message?: string };
}

/** Sends one streamed completion; resolves with its row (never rejects). `startMs` is relative to `runStart`. */
export async function streamedCompletion(i: number, req: StreamRequest, runStart: number): Promise<RequestRow> {
  const t0 = performance.now();
  const row: RequestRow = { i, startMs: t0 - runStart, endMs: 0, status: 0, ttftMs: null, tpotMs: null, itlMs: [], inTokens: req.promptTokenIds.length, outTokens: 0, error: null };
  const chunks: number[] = [];
  try {
    const r = await fetch(`${req.url}/v1/completions`, {
      method: "POST",
      headers: { "content-type": "application/json", ...(req.apiKey ? { authorization: `Bearer ${req.apiKey}` } : {}) },
      body: JSON.stringify({
        model: req.model,
        prompt: req.promptTokenIds,
        max_tokens: req.maxTokens,
        temperature: 0,
        stream: true,
        stream_options: { include_usage: true },
        // Every request then produces exactly max_tokens (ours, vLLM and llama-server honour it).
        ignore_eos: true,
      }),
      signal: req.signal,
    });
    row.status = r.status;
    if (r.status !== 200) {
      const text = await r.text();
      let message = text.slice(0, 300);
      try {
        message = (JSON.parse(text) as { error?: { message?: string } }).error?.message ?? message;
      } catch {
        // not JSON: keep the text
      }
      row.error = `${r.status}: ${message}`;
    } else {
      const { usageOut, error } = await readStream(r.body!, t0, (at) => chunks.push(at));
      row.error = error;
      row.outTokens = usageOut ?? chunks.length;
    }
  } catch (e) {
    const err = e as Error & { cause?: { code?: string; message?: string } };
    row.error = err.name === "AbortError" || err.name === "TimeoutError" ? "aborted at the run's end" : (err.cause?.code ?? err.cause?.message ?? err.message);
  }
  const end = performance.now();
  row.endMs = end - runStart;
  if (chunks.length) {
    row.ttftMs = chunks[0];
    for (let k = 1; k < chunks.length; k++) row.itlMs.push(chunks[k] - chunks[k - 1]);
    const last = chunks[chunks.length - 1];
    row.tpotMs = row.outTokens >= 2 ? (last - chunks[0]) / (row.outTokens - 1) : null;
  }
  return row;
}
