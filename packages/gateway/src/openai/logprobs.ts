// The OpenAI shapes of log-probabilities, built from the contract's entries (token text, bytes,
// log-probability, alternatives): chat's `{content: [...]}` and the legacy completions object
// `{tokens, token_logprobs, top_logprobs, text_offset}`. Knows the formats, not where the numbers
// come from.

import type { Echo, TokenLogprobsEntry } from "@airm/internal-api";

/** A prompt token of an echo (no log-probability for the first one) or a generated token. */
export type ScoredToken = Echo["tokens"][number] | TokenLogprobsEntry;

export interface ChatLogprobs {
  content: {
    token: string;
    logprob: number;
    bytes: number[];
    top_logprobs: { token: string; logprob: number; bytes: number[] }[];
  }[];
  refusal: null;
}

/** How a token is named: its text, or `token_id:<id>` (vLLM's return_tokens_as_token_ids). */
function named(e: { token: number; text: string }, asIds: boolean): string {
  return asIds ? `token_id:${e.token}` : e.text;
}

/** chat.completion(.chunk) `logprobs` for these generated tokens. */
export function chatLogprobs(entries: TokenLogprobsEntry[], asIds = false): ChatLogprobs {
  return {
    content: entries.map((e) => ({
      token: named(e, asIds),
      logprob: e.logprob,
      bytes: e.bytes,
      top_logprobs: e.top.map((t) => ({ token: named(t, asIds), logprob: t.logprob, bytes: t.bytes })),
    })),
    refusal: null,
  };
}

export interface CompletionLogprobs {
  tokens: string[];
  token_logprobs: (number | null)[];
  top_logprobs: (Record<string, number> | null)[];
  text_offset: number[];
}

/** Length in characters (code points), as OpenAI's offsets count. */
function chars(s: string): number {
  let n = 0;
  for (const _ of s) n++;
  return n;
}

/**
 * text_completion `logprobs` for these tokens. `offset` is where the first token's text starts in
 * the whole answer text (echo included), in characters; returns the offset after the last token,
 * for the next chunk. Each top_logprobs map holds the alternatives and the chosen token, as in the
 * OpenAI API (a prompt token without a log-probability has null there).
 */
export function completionLogprobs(entries: ScoredToken[], offset: number, asIds = false): { logprobs: CompletionLogprobs; next: number } {
  const out: CompletionLogprobs = { tokens: [], token_logprobs: [], top_logprobs: [], text_offset: [] };
  let at = offset;
  for (const e of entries) {
    out.tokens.push(named(e, asIds));
    out.token_logprobs.push(e.logprob);
    out.text_offset.push(at);
    if (e.logprob === null) out.top_logprobs.push(null);
    else {
      const top: Record<string, number> = {};
      for (const t of e.top) if (!(named(t, asIds) in top)) top[named(t, asIds)] = t.logprob;
      if (!(named(e, asIds) in top)) top[named(e, asIds)] = e.logprob;
      out.top_logprobs.push(top);
    }
    at += chars(e.text);
  }
  return { logprobs: out, next: at };
}
