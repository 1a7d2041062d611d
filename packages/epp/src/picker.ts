// Picks a request's endpoints from the scraper's states: a destination that decodes (role decode
// or both) and, when the destination is decode-only and the pool has prefill endpoints, a prefill
// endpoint for the x-prefiller-host-port header. Stale or failing endpoints are skipped,
// saturated ones too; prefix affinity counts where the prompt is prefilled (the prefill endpoint,
// or a "both" destination). Says why when nothing can be picked: 503 when nothing is ready, 429
// when everything ready is saturated.

import { CHARS_PER_TOKEN, decideDisaggregation, estimateTokens, type DisaggregationDecision } from "@airm/rm-core";
import { decodes, type Role } from "@airm/routing";
import { isFresh, pendingPicks, type EndpointState, type MetricsScraper } from "./metrics-scraper.ts";
import type { PreciseAffinity } from "./prefix-events.ts";
import { PrefixIndex } from "./prefix-index.ts";
import {
  type Candidate,
  choose,
  DEFAULT_SATURATION,
  DEFAULT_WEIGHTS,
  type DisaggregationMode as DisaggregationModeName,
  isSaturated,
  type PickReason,
  type Routing,
  type SaturationLimits,
  type Weights,
} from "@airm/routing";

export interface Picked {
  ok: true;
  destination: EndpointState;
  reason: PickReason;
  /** The prefill endpoint for a decode-only destination (null when the destination prefills itself). */
  prefill: EndpointState | null;
  prefillReason: PickReason | null;
  /** True when a decode-only destination prefills this prompt itself (not disaggregated). */
  local: boolean;
  /** Why a decode-only destination with prefill endpoints available got its path (null otherwise). */
  path: { reason: DisaggregationDecision["reason"] | "prompt_length" | "forced"; decision?: DisaggregationDecision } | null;
}

/**
 * How a decode-only destination's path is chosen when prefill endpoints are available (the shared
 * names of @airm/routing that a picker applies): auto = the measured decision (rm-core's
 * decideDisaggregation, from the endpoints' airm_* estimate gauges) for destinations that prefill
 * locally (airm_worker_local_prefill 1), always = every request gets a prefill endpoint, never =
 * none does (the decode pods prefill every request: they must run with --local-prefill),
 * prompt-length = the older threshold (localPrefillMaxTokens). `header` is a gateway's mode.
 */
export const DISAGGREGATION_MODES = ["auto", "always", "never", "prompt-length"] as const satisfies readonly DisaggregationModeName[];
export type DisaggregationMode = (typeof DISAGGREGATION_MODES)[number];

/**
 * How equals of one role are chosen (the shared names of @airm/routing): approx-prefix (default)
 * scores load and the prompt text's first blocks this endpoint took last; prefix scores load and
 * the prompt's blocks the endpoint's worker holds, from its KV events (prefix-events.ts); load
 * scores load alone; random takes any open endpoint.
 */
export const PICKER_ROUTINGS = ["approx-prefix", "prefix", "load", "random"] as const satisfies readonly Routing[];
export type PickerRouting = (typeof PICKER_ROUTINGS)[number];

/** Nothing could be picked: the HTTP status and OpenAI error the client gets. */
export interface Refusal {
  ok: false;
  status: 429 | 503;
  code: "no_endpoints" | "no_ready_endpoints" | "all_endpoints_saturated";
  message: string;
}

export interface PickerOptions {
  /** An endpoint whose last good scrape is older than this is stale (ms, default 2000). */
  staleAfterMs?: number;
  weights?: Weights;
  saturation?: SaturationLimits;
  prefix?: PrefixIndex;
  /** The clock (performance.now() ms by default; tests pass their own). */
  now?: () => number;
  /**
   * Prompts estimated at most this many tokens (characters / 4) are not disaggregated: a
   * decode-only destination gets no prefill endpoint and prefills them itself (default 0: off).
   */
  localPrefillMaxTokens?: number;
  /** How the path is chosen (default auto). */
  disaggregation?: DisaggregationMode;
  /** How equals are chosen (default approx-prefix). */
  routing?: PickerRouting;
}

/** A prompt's blocks, and how many of them an endpoint holds (or took last). */
interface Prefix {
  blocks: number;
  matched(s: EndpointState): number;
}

/** Characters per token of the estimate the disaggregation decision uses (no tokenizer here). */
export { CHARS_PER_TOKEN };

/**
 * LoRA affinity: when `model` names an adapter some endpoints have active or waiting
 * (vllm:lora_requests_info), only those; else all of them (as GIE's scorer, which prefers an
 * endpoint with the adapter active and otherwise one with room to load it).
 */
function withAdapter(pool: EndpointState[], model: string): EndpointState[] {
  const holders = pool.filter((s) => s.load?.lora && (s.load.lora.active.includes(model) || s.load.lora.waiting.includes(model)));
  return holders.length ? holders : pool;
}

/** What a group of endpoints offers: the unsaturated fresh ones, or why there are none. */
type Offer = { ok: true; open: EndpointState[] } | Refusal;

export class Picker {
  readonly staleAfterMs: number;
  readonly weights: Weights;
  readonly saturation: SaturationLimits;
  readonly prefix: PrefixIndex;
  readonly localPrefillMaxTokens: number;
  readonly disaggregation: DisaggregationMode;
  readonly routing: PickerRouting;
  private readonly now: () => number;
  private turn = 0;

  constructor(
    private readonly scraper: Pick<MetricsScraper, "states">,
    options: PickerOptions = {},
  ) {
    this.staleAfterMs = options.staleAfterMs ?? 2000;
    this.weights = options.weights ?? DEFAULT_WEIGHTS;
    this.saturation = options.saturation ?? DEFAULT_SATURATION;
    this.prefix = options.prefix ?? new PrefixIndex();
    this.now = options.now ?? (() => performance.now());
    this.localPrefillMaxTokens = options.localPrefillMaxTokens ?? 0;
    this.disaggregation = options.disaggregation ?? "auto";
    this.routing = options.routing ?? "approx-prefix";
    if (this.localPrefillMaxTokens > 0 && this.disaggregation !== "prompt-length")
      throw new Error(`localPrefillMaxTokens (${this.localPrefillMaxTokens}) is the prompt-length rule: set disaggregation to prompt-length, or leave it 0`);
  }

  /** Picks for one request and counts the picks (they weigh on the next picks until scraped). */
  pick(model: string, prompt: string, precise: PreciseAffinity | null = null): Picked | Refusal {
    const states = this.scraper.states();
    const now = this.now();
    const prefillPool = withAdapter(
      states.filter((s) => s.endpoint.role === "prefill"),
      model,
    );
    const prefillOffer = prefillPool.length ? this.offer(prefillPool, now, "prefill") : null;
    // Decode-only destinations need a prefill endpoint; without one only "both" endpoints can serve.
    const destPool = withAdapter(
      states.filter((s) => decodes(s.endpoint.role) && (prefillOffer === null || prefillOffer.ok || s.endpoint.role === "both")),
      model,
    );
    if (destPool.length === 0 && prefillOffer && !prefillOffer.ok) return prefillOffer;
    const destOffer = this.offer(destPool, now, "decode");
    if (!destOffer.ok) return destOffer;
    const hashes = this.routing === "approx-prefix" ? this.prefix.hashes(model, prompt) : [];
    // Where the prompt is prefilled counts: approx-prefix only knows where it sent it; the index knows where the blocks are.
    const affinity = (where: (s: EndpointState) => boolean): Prefix =>
      precise
        ? { blocks: precise.blocks, matched: (s) => precise.matched(s) }
        : { blocks: hashes.length, matched: (s) => (where(s) ? this.prefix.matchedBlocks(hashes, s.key) : 0) };
    this.turn++;
    const dest = this.best(
      destOffer.open,
      affinity((s) => s.endpoint.role === "both"),
    );
    let prefill: { state: EndpointState; reason: PickReason } | null = null;
    let local = false;
    let path: Picked["path"] = null;
    if (dest.state.endpoint.role === "decode") {
      const tokens = estimateTokens(prompt.length);
      if (this.disaggregation === "prompt-length") {
        // the older rule: short prompts are not disaggregated
        local = this.localPrefillMaxTokens > 0 && tokens <= this.localPrefillMaxTokens;
        if (prefillOffer?.ok) path = { reason: "prompt_length" };
      }
      if (this.disaggregation === "never" && prefillOffer?.ok) {
        local = true;
        path = { reason: "forced" };
      }
      if (prefillOffer?.ok && !local)
        prefill = this.best(
          prefillOffer.open,
          affinity(() => true),
        );
      const est = dest.state.load?.estimates;
      if (prefill && this.disaggregation === "auto" && est?.localPrefill) {
        const decision = decideDisaggregation({
          promptTokens: tokens,
          bandwidth: est.kvBandwidth ?? null,
          kvBytes: est.kvBytes ?? null,
          kvBytesPerToken: est.kvBytesPerToken ?? null,
          remote: prefill.state.load?.estimates?.prefill ?? null,
          local: est.prefill ?? null,
        });
        path = { reason: decision.reason, decision };
        if (!decision.ship) {
          local = true;
          prefill = null;
        }
      } else if (prefill && path === null) path = { reason: "forced" };
    }
    dest.state.picks++;
    if (prefill) prefill.state.picks++;
    const prefilledAt = prefill?.state ?? (dest.state.endpoint.role === "both" || local ? dest.state : null);
    if (prefilledAt && hashes.length) this.prefix.record(hashes, prefilledAt.key);
    return { ok: true, destination: dest.state, reason: dest.reason, prefill: prefill?.state ?? null, prefillReason: prefill?.reason ?? null, local, path };
  }

  /**
   * Any decode-capable endpoint, in turn: fresh ones first, else any known one (fail-open and
   * requests without a body, which GIE routes to a random endpoint). Null when the pool has none.
   */
  pickAny(): EndpointState | null {
    const all = this.scraper.states().filter((s) => decodes(s.endpoint.role));
    const now = this.now();
    const fresh = all.filter((s) => isFresh(s, now, this.staleAfterMs));
    const from = fresh.length ? fresh : all;
    if (from.length === 0) return null;
    const s = from[this.turn++ % from.length];
    s.picks++;
    return s;
  }

  /** Fresh (scraped within staleAfterMs, last scrape ok) endpoints of `states`. */
  fresh(states: EndpointState[] = this.scraper.states()): EndpointState[] {
    const now = this.now();
    return states.filter((s) => isFresh(s, now, this.staleAfterMs));
  }

  private offer(pool: EndpointState[], now: number, what: Role): Offer {
    if (pool.length === 0) return { ok: false, status: 503, code: "no_endpoints", message: `the pool has no ${what} endpoint` };
    const fresh = pool.filter((s) => isFresh(s, now, this.staleAfterMs));
    if (fresh.length === 0) {
      const why = pool.map((s) => `${s.endpoint.name} (${s.key}): ${s.error ?? (s.load ? `metrics ${Math.round(now - s.scrapedAt)} ms old` : "not scraped yet")}`);
      return { ok: false, status: 503, code: "no_ready_endpoints", message: `no ${what} endpoint is ready: ${why.join("; ")}` };
    }
    const open = fresh.filter((s) => !isSaturated(s.load!, this.saturation));
    if (open.length === 0) {
      const lim = this.saturation;
      return {
        ok: false,
        status: 429,
        code: "all_endpoints_saturated",
        message: `every ready ${what} endpoint is saturated (more than ${lim.maxWaiting} requests waiting or KV cache over ${lim.maxKvUsage * 100}% used); retry later`,
      };
    }
    return { ok: true, open };
  }

  private best(open: EndpointState[], prefix: Prefix): { state: EndpointState; reason: PickReason } {
    if (this.routing === "random") return { state: open[Math.floor(Math.random() * open.length)], reason: open.length > 1 ? "random" : "only_candidate" };
    const cands: Candidate[] = open.map((s) => ({
      waiting: s.load!.waiting + pendingPicks(s),
      running: s.load!.running,
      kvUsage: s.load!.kvUsage,
      prefixBlocks: this.routing === "load" ? 0 : prefix.matched(s),
      pending: pendingPicks(s),
    }));
    const c = choose(cands, this.weights, this.routing === "load" ? 0 : prefix.blocks, this.turn);
    return { state: open[c.index], reason: c.reason };
  }
}
