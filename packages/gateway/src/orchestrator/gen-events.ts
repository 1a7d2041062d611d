// The events one generation yields to the OpenAI layer: the first token (from prefill), then the
// decode's token events, then done with the KV figures. They are the contract's own event types,
// so nothing is renamed between the worker and the client's answer.

import type { DoneEvent, FirstToken, TokenEvent } from "@airm/internal-api";

export type GenEvent =
  | { type: "first"; first: FirstToken }
  | TokenEvent
  | (DoneEvent & {
      /** KV push (not hidden by prefill) + KV load, in PD; null in solo. */
      kvTransferMs: number | null;
      transport: string | null;
    });

/** Why a generation stopped talking to a worker (the release reason the worker is told). */
export type EndReason = "done" | "client_gone" | "decode_rejected" | "prefill_failed" | "aborted" | "deadline";
