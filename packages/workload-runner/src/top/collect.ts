// One reading of a cluster: every part's /health and /metrics, fetched at once with a short
// timeout, as they are (the figures are computed in snapshot.ts). A part that does not answer is
// kept with the reason, so the view can say plainly what it cannot reach.

import { fetchVia } from "@airm/internal-api";
import type { TlsMaterial } from "@airm/rm-core";
import { type Metrics, parseMetrics } from "./prom-text.ts";
import type { GetJson, Source, Target } from "./targets.ts";

export interface PartSample {
  target: Target;
  /** Its /health: HTTP status and JSON body; null when it did not answer. */
  health: { status: number; body: unknown } | null;
  metrics: Metrics | null;
  /** Why /health or /metrics could not be read (null when both were). */
  error: string | null;
}

export interface RawSample {
  /** When it was taken (ms since the epoch). */
  at: number;
  parts: PartSample[];
  notes: string[];
}

/** How `airm top` talks HTTP to the parts (the tests pass the real one). */
export interface Http {
  getJson: GetJson;
  getText(url: string, o?: { headers?: Record<string, string>; timeoutMs?: number }): Promise<{ status: number; text: string }>;
  send(url: string, method: string, headers: Record<string, string>): Promise<{ status: number; body: unknown }>;
}

const TIMEOUT_MS = 1500;

/** A reason from a fetch error: its cause's code when there is one (ECONNREFUSED, a TLS refusal...). */
export function reasonOf(e: unknown): string {
  const err = e as Error & { cause?: { code?: string; message?: string } };
  if (err.name === "TimeoutError") return "no answer in time";
  return err.cause?.code ?? err.cause?.message ?? err.message;
}

/** fetch, over mutual TLS with `tls` for https URLs. */
export function nodeHttp(tls: TlsMaterial | undefined): Http {
  const call = (url: string, init: RequestInit & { timeoutMs?: number }) =>
    fetch(url, { ...init, ...(url.startsWith("https:") ? fetchVia(tls) : {}), signal: AbortSignal.timeout(init.timeoutMs ?? TIMEOUT_MS) });
  const json = async (r: Response) => {
    const text = await r.text();
    try {
      return JSON.parse(text) as unknown;
    } catch {
      return text;
    }
  };
  return {
    async getJson(url, o = {}) {
      const r = await call(url, { headers: o.headers, timeoutMs: o.timeoutMs });
      return { status: r.status, body: await json(r) };
    },
    async getText(url, o = {}) {
      const r = await call(url, { headers: o.headers, timeoutMs: o.timeoutMs });
      return { status: r.status, text: await r.text() };
    },
    async send(url, method, headers) {
      const r = await call(url, { method, headers, timeoutMs: 5000 });
      return { status: r.status, body: await json(r) };
    },
  };
}

/** The headers a GET of `t` sends: the API key to a gateway. */
function headersFor(t: Target, apiKey: string | undefined): Record<string, string> {
  return t.kind === "gateway" && apiKey ? { authorization: `Bearer ${apiKey}` } : {};
}

/** One part's /health and /metrics. */
async function samplePart(t: Target, http: Http, apiKey: string | undefined): Promise<PartSample> {
  if (!t.url) return { target: t, health: null, metrics: null, error: "no URL known for it" };
  const headers = headersFor(t, apiKey);
  const [health, metrics] = await Promise.allSettled([http.getJson(`${t.url}/health`, { headers }), http.getText(`${t.url}/metrics`, { headers })]);
  const errors: string[] = [];
  if (health.status === "rejected") errors.push(`/health: ${reasonOf(health.reason)}`);
  let m: Metrics | null = null;
  if (metrics.status === "rejected") errors.push(`/metrics: ${reasonOf(metrics.reason)}`);
  else if (metrics.value.status !== 200) errors.push(`/metrics: HTTP ${metrics.value.status}`);
  else m = parseMetrics(metrics.value.text);
  return { target: t, health: health.status === "fulfilled" ? health.value : null, metrics: m, error: errors.length ? errors.join("; ") : null };
}

/** Reads every part the source finds. */
export async function takeSample(source: Source, http: Http, now: () => number = Date.now): Promise<RawSample> {
  const d = await source.discover();
  const at = now();
  const parts = await Promise.all(d.targets.map((t) => samplePart(t, http, source.apiKey)));
  return { at, parts, notes: d.notes };
}
