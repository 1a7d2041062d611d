// Draining a worker from `airm top`: POST (drain) or DELETE (resume) the worker's /internal/drain
// with the deployment's internal token, and the API key when one is set. What comes back is one
// line for the console's status bar.

import { INTERNAL_TOKEN_HEADER } from "@airm/rm-core";
import { type Http, reasonOf } from "./collect.ts";
import type { Source, Target } from "./targets.ts";

/** The drain route's answer (docs/internal-api.md). */
interface DrainState {
  draining: boolean;
  drained_by: string | null;
  in_flight: number;
  leases: number;
}

/** The headers of a drain call: the internal token, and the API key when one is set. */
export function drainHeaders(source: Pick<Source, "internalToken" | "apiKey">): Record<string, string> {
  return {
    ...(source.internalToken ? { [INTERNAL_TOKEN_HEADER]: source.internalToken } : {}),
    ...(source.apiKey ? { authorization: `Bearer ${source.apiKey}` } : {}),
  };
}

/** Why a drain call was refused, in words. */
function refusal(status: number, body: unknown, hasToken: boolean): string {
  const msg = (body as { error?: { message?: string } } | null)?.error?.message;
  if (status === 401)
    return hasToken ? "refused: the worker does not take this internal token" : "refused: it asks the internal token (set AIRM_INTERNAL_TOKEN, or attach to airm up's state)";
  return `HTTP ${status}${msg ? `: ${msg}` : ""}`;
}

/** What a drain call did: a line for the key bar, and whether it worked. */
export interface DrainOutcome {
  text: string;
  ok: boolean;
}

/** Drains (`on`) or resumes a worker; never throws. */
export async function setDrain(t: Pick<Target, "name" | "drainUrl">, on: boolean, source: Pick<Source, "internalToken" | "apiKey">, http: Http): Promise<DrainOutcome> {
  const what = on ? "drain" : "resume";
  if (!t.drainUrl) return { text: `${t.name}: only a worker can be drained`, ok: false };
  try {
    const r = await http.send(`${t.drainUrl}/internal/drain`, on ? "POST" : "DELETE", drainHeaders(source));
    if (r.status !== 200) return { text: `${t.name}: ${what} ${refusal(r.status, r.body, Boolean(source.internalToken))}`, ok: false };
    const s = r.body as DrainState;
    const text = s.draining ? `${t.name} drains: it takes no new request (${s.in_flight} in flight finish there)` : `${t.name} takes requests again`;
    return { text, ok: true };
  } catch (e) {
    return { text: `${t.name}: ${what} failed: ${reasonOf(e)}`, ok: false };
  }
}
