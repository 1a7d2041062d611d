// A set of worker endpoints of one role: probes each one's /health on a period (an unhealthy one
// every quarter second, so a worker that finished loading or came back is used at once), and
// hands out the healthy endpoint with the fewest outstanding requests. Busy is not dead: a probe
// that times out does not take down an endpoint that is answering the requests it holds (its
// calls report progress); a refused connection or an error answer does. Knows nothing about the
// OpenAI API.

import { WorkerClient, type WorkerHealth } from "@airm/internal-api";
import { choose, DEFAULT_SATURATION, DEFAULT_WEIGHTS, isSaturated, type Candidate, type Routing, type Weights } from "@airm/routing";
import type { SamplingDefaults, TlsMaterial } from "@airm/rm-core";
import { causeOf, nothingListens } from "./net-errors.ts";
import type { RuntimeAdapters } from "./runtime-adapters.ts";

export interface Endpoint {
  readonly url: string;
  readonly client: WorkerClient;
  outstanding: number;
  healthy: boolean;
  /** Last /health body (null until one answered). */
  health: WorkerHealth | null;
  lastError: string | null;
  /** When it was last probed (performance.now()). */
  probedAt: number;
  /** Last sign of life: a probe answered, or a call made progress (performance.now()). */
  aliveAt: number;
  /** Its circuit breaker: calls that failed in a row, and when (performance.now()) an open breaker lets a trial call through. */
  breaker: { state: "closed" | "open" | "half-open"; failures: number; retryAt: number; cooldownMs: number };
  /** Run-time LoRA adapters being loaded on it again (it came back without them), while that runs. */
  restoring?: Promise<void>;
}

/** How many of a prompt's blocks each endpoint holds (prefix-router.ts works it out), for pick(). */
export interface Affinity {
  /** The prompt's full blocks. */
  blocks: number;
  /** Positions per block. */
  blockSize: number;
  matched(e: Endpoint): number;
  /** The prompt's token ids as a worker tokenized it (a moved stream's tokens not included). */
  promptTokens: number[];
}

export interface PoolOptions {
  /** How long a health probe may take (ms, default 2000). */
  probeTimeoutMs?: number;
  /** How long a busy endpoint (requests outstanding) stays up on progress alone while its probes time out (ms, default 15000). */
  busyGraceMs?: number;
  /** The deployment's internal token (AIRM_INTERNAL_TOKEN) the workers ask on /internal/*. */
  token?: string;
  /** The deployment's TLS material (AIRM_TLS_DIR): calls and probes are mutual TLS to https URLs. */
  tls?: TlsMaterial;
  /** Calls that fail in a row before an endpoint's breaker opens (default 3). */
  breakerFailures?: number;
  /** How long an open breaker waits before a trial call (ms, default 1000; doubles on each failed trial, up to 30 s). */
  breakerCooldownMs?: number;
  /** How a healthy endpoint is chosen (AIRM_ROUTING): `prefix` (default: load and the prompt's held prefix, scored), `load` (fewest outstanding, ties in turn) or `random`. */
  routing?: GatewayRouting;
  /** The score's weights with `prefix` (default @airm/routing's DEFAULT_WEIGHTS). */
  weights?: Weights;
  /** The LoRA adapters loaded through the gateway: a worker that answers healthy without one of them is given it again before it is picked. */
  adapters?: RuntimeAdapters;
}

/** The gateway's routing policies (AIRM_ROUTING): the shared names it applies (approx-prefix is the endpoint picker's). */
export const ROUTINGS = ["prefix", "load", "random"] as const satisfies readonly Routing[];
export type GatewayRouting = (typeof ROUTINGS)[number];

const BREAKER_MAX_COOLDOWN_MS = 30_000;

/** How many more times a healthy endpoint that answered "draining" is asked at once before it is taken out (a Service may still send kept-open connections to its draining pod). */
export const DRAINING_RETRIES = 3;

/** How often an unhealthy endpoint is probed (ms; the interval when that is shorter). */
export const RECOVERY_PROBE_MS = 250;

export class EndpointPool {
  endpoints: Endpoint[];
  private timer: NodeJS.Timeout | undefined;
  private turn = 0;

  private readonly probeTimeoutMs: number;
  private readonly busyGraceMs: number;
  private readonly breakerFailures: number;
  private readonly breakerCooldownMs: number;

  constructor(
    readonly role: string,
    urls: string[],
    private readonly o: PoolOptions = {},
  ) {
    this.probeTimeoutMs = o.probeTimeoutMs ?? 2000;
    this.busyGraceMs = o.busyGraceMs ?? 15_000;
    this.breakerFailures = o.breakerFailures ?? 3;
    this.breakerCooldownMs = o.breakerCooldownMs ?? 1000;
    this.endpoints = urls.map((u) => this.endpoint(u));
  }

  private endpoint(u: string): Endpoint {
    const client = new WorkerClient(u, `${this.role} worker ${u.replace(/\/+$/, "")}`, { token: this.o.token, tls: this.o.tls });
    const breaker = { state: "closed" as const, failures: 0, retryAt: 0, cooldownMs: this.breakerCooldownMs };
    return { url: client.url, client, outstanding: 0, healthy: false, health: null, lastError: "not probed yet", probedAt: 0, aliveAt: 0, breaker };
  }

  /**
   * Replaces the members (a pool discovered at run time): endpoints kept keep their state, new
   * ones are probed at once, removed ones are no longer picked (requests on them finish).
   */
  setUrls(urls: string[]): void {
    const byUrl = new Map(this.endpoints.map((e) => [e.url, e]));
    this.endpoints = urls.map((u) => {
      const known = byUrl.get(new WorkerClient(u, "").url);
      if (known) return known;
      const e = this.endpoint(u);
      void this.probe(e);
      return e;
    });
  }

  /** The member at `hostPort` ("10.0.0.5:8101"), whatever its scheme (http, or https with TLS), or undefined. */
  byHostPort(hostPort: string): Endpoint | undefined {
    return this.endpoints.find((e) => e.url.replace(/^https?:\/\//, "") === hostPort);
  }

  /** The member at `url` (same normalisation as the pool's URLs), or undefined. */
  byUrl(url: string): Endpoint | undefined {
    const u = new WorkerClient(url, "").url;
    return this.endpoints.find((e) => e.url === u);
  }

  /** A call on `e` made progress (an answer, a streamed event): it counts as liveness. */
  alive(e: Endpoint): void {
    e.aliveAt = performance.now();
  }

  /** Probes every endpoint now, then healthy ones every `intervalMs` and unhealthy ones every RECOVERY_PROBE_MS. */
  async start(intervalMs: number): Promise<void> {
    await this.probeAll();
    const tick = Math.min(intervalMs, RECOVERY_PROBE_MS);
    this.timer = setInterval(() => {
      const now = performance.now();
      for (const e of this.endpoints) {
        if (now - e.probedAt >= (e.healthy ? intervalMs : tick)) void this.probe(e);
      }
    }, tick);
    this.timer.unref();
  }

  stop(): void {
    if (this.timer) clearInterval(this.timer);
  }

  async probeAll(): Promise<void> {
    await Promise.all(this.endpoints.map((e) => this.probe(e)));
  }

  /** Probes every endpoint now (after a change their /health reports, e.g. a LoRA adapter loaded). */
  async refresh(): Promise<void> {
    await Promise.all(this.endpoints.map((e) => this.probe(e)));
  }

  private async probe(e: Endpoint, again = false, drainingSeen = 0): Promise<void> {
    e.probedAt = performance.now();
    try {
      const { status, health } = await e.client.health({ signal: AbortSignal.timeout(this.probeTimeoutMs) });
      // A pod that drains answers "draining" and closes that connection. Behind a Service a new
      // connection reaches another pod, but the pool may hold more kept-open ones on the draining
      // pod, so an endpoint that was healthy is asked again at once, up to DRAINING_RETRIES times
      // (a worker addressed directly that drains keeps saying so, and is taken out).
      if (e.healthy && drainingSeen < DRAINING_RETRIES && health?.status === "draining") return this.probe(e, again, drainingSeen + 1);
      e.health = health ?? e.health;
      e.healthy = status === 200 && health?.ready === true;
      e.lastError = e.healthy ? null : `health answered ${status}${health?.ready === false ? ` (${health.status}${health.error ? `: ${health.error}` : ""})` : ""}`;
      if (e.healthy) e.aliveAt = performance.now();
      if (e.healthy) this.restoreAdapters(e);
    } catch (err) {
      // A slow probe from a worker that is computing for its outstanding requests and made
      // progress lately: busy, not dead. Anything else (refused, reset, silent and idle) is down.
      const timedOut = (err as Error).name === "TimeoutError";
      if (timedOut && e.healthy && e.outstanding > 0 && performance.now() - e.aliveAt < this.busyGraceMs) {
        e.lastError = `busy: health probe timed out after ${this.probeTimeoutMs} ms while ${e.outstanding} requests make progress`;
        return;
      }
      // A connection accepted and then dropped is asked once more at once: behind a Service the
      // next one may reach another pod, and one pod going away must not take the endpoint out.
      if (e.healthy && !again && !timedOut && !nothingListens(err)) return this.probe(e, true, drainingSeen);
      e.healthy = false;
      e.lastError = `health probe failed: ${causeOf(err)}`;
    }
  }

  /**
   * A worker that answers healthy but lacks adapters loaded through the gateway (it restarted)
   * stays out of picks while they are loaded on it again; then it is probed at once. A load that
   * fails keeps it out, with the worker's error as its lastError, and is tried again at the next
   * probe: every worker of the gateway serves every adapter it loaded, or none is picked.
   */
  private restoreAdapters(e: Endpoint): void {
    const missing = this.o.adapters?.missingOn(e.health) ?? [];
    if (!missing.length) return;
    e.healthy = false;
    e.lastError = `loading LoRA adapters ${missing.map((a) => a.name).join(", ")} again (loaded through the gateway; the worker came back without them)`;
    if (e.restoring) return;
    const loads = missing.map((a) =>
      e.client.loadLora({ name: a.name, path: a.path }).catch((err) => (/already loaded/.test(String((err as Error).message)) ? undefined : Promise.reject(err))),
    );
    e.restoring = Promise.all(loads)
      .then(
        () => this.probe(e),
        (err) => {
          e.lastError = `LoRA adapter load refused while giving back the gateway's adapters: ${(err as Error).message}`;
        },
      )
      .finally(() => {
        e.restoring = undefined;
      });
  }

  /** Marks an endpoint down after a call that could not reach it (the next probe may bring it back); it counts against its breaker too. */
  markDown(e: Endpoint, reason: string): void {
    e.healthy = false;
    e.lastError = reason;
    this.callFailed(e, reason);
  }

  /**
   * A call on `e` failed on the worker's side (a 5xx answer, a broken stream, no answer). After
   * `breakerFailures` in a row its breaker opens: no call goes there for the cooldown, then one
   * trial call does (half-open); a failed trial opens it again for twice as long.
   */
  callFailed(e: Endpoint, reason: string): void {
    const b = e.breaker;
    b.failures++;
    if (b.state === "half-open") b.cooldownMs = Math.min(b.cooldownMs * 2, BREAKER_MAX_COOLDOWN_MS);
    if (b.state === "half-open" || b.failures >= this.breakerFailures) {
      b.state = "open";
      b.retryAt = performance.now() + b.cooldownMs;
      e.lastError = `circuit open after ${b.failures} failed calls in a row (last: ${reason}); a trial call in ${b.cooldownMs} ms`;
    }
  }

  /** A call on `e` succeeded: its breaker closes and its failure count restarts. */
  callSucceeded(e: Endpoint): void {
    const b = e.breaker;
    if (b.state !== "closed" && e.lastError?.startsWith("circuit open")) e.lastError = null;
    b.state = "closed";
    b.failures = 0;
    b.cooldownMs = this.breakerCooldownMs;
  }

  /** True when calls may go to `e` as far as its breaker is concerned (an open one past its cooldown lets one trial through). */
  private breakerAllows(e: Endpoint, now: number): boolean {
    const b = e.breaker;
    return b.state === "closed" || now >= b.retryAt;
  }

  /**
   * The healthy endpoint with the fewest outstanding requests (ties rotate), skipping `exclude`
   * and endpoints whose breaker is open. Returns undefined when none is usable.
   */
  pick(exclude: Set<Endpoint> = new Set(), affinity?: Affinity | null): Endpoint | undefined {
    const now = performance.now();
    const ok = this.endpoints.filter((e) => e.healthy && !exclude.has(e) && this.breakerAllows(e, now));
    if (ok.length === 0) return undefined;
    let e: Endpoint;
    if (this.o.routing === "random") e = ok[Math.floor(Math.random() * ok.length)];
    else if (affinity && affinity.blocks > 0 && ok.length > 1) e = this.scored(ok, affinity);
    else {
      const least = Math.min(...ok.map((x) => x.outstanding));
      const tied = ok.filter((x) => x.outstanding === least);
      e = tied[this.turn++ % tied.length];
    }
    if (e.breaker.state !== "closed") {
      // This call is the trial; if it ends with no verdict (the client left), another may go after the cooldown.
      e.breaker.state = "half-open";
      e.breaker.retryAt = now + e.breaker.cooldownMs;
    }
    return e;
  }

  /**
   * The best of `ok` by the shared score (@airm/routing): requests outstanding from this gateway
   * as the queue, the KV in use from the last probe, and the share of the prompt's blocks it
   * holds. Saturated endpoints (more than 5 outstanding past their slots, or KV over 80 % used)
   * are left out while another is open.
   */
  private scored(ok: Endpoint[], affinity: Affinity): Endpoint {
    const load = (e: Endpoint) => {
      const kv = e.health?.kvCache;
      return { waiting: Math.max(0, e.outstanding - (e.health?.requests.slots ?? 1)), kvUsage: kv && kv.totalBlocks > 0 ? kv.usedBlocks / kv.totalBlocks : 0 };
    };
    const open = ok.filter((e) => !isSaturated(load(e), DEFAULT_SATURATION));
    const from = open.length ? open : ok;
    const cands: Candidate[] = from.map((e) => ({ waiting: e.outstanding, running: 0, kvUsage: load(e).kvUsage, prefixBlocks: affinity.matched(e), pending: 0 }));
    return from[choose(cands, this.o.weights ?? DEFAULT_WEIGHTS, affinity.blocks, this.turn++).index];
  }

  /** pick(), away from the endpoints in `avoid` when another one is healthy (a moved request's next try). */
  /**
   * Resolves true once an endpoint not in `exclude` is healthy and its breaker lets a call through
   * (at once when one is), false after `ms` or when `signal` aborts: a request waits for a worker
   * that restarts instead of failing while it loads. Probes of a down endpoint come every
   * RECOVERY_PROBE_MS, so this looks every 50 ms.
   */
  async untilHealthy(ms: number, signal: AbortSignal, exclude: Set<Endpoint> = new Set()): Promise<boolean> {
    const end = performance.now() + ms;
    for (;;) {
      const now = performance.now();
      if (this.endpoints.some((e) => e.healthy && !exclude.has(e) && this.breakerAllows(e, now))) return true;
      if (now >= end || signal.aborted) return false;
      await new Promise((r) => setTimeout(r, Math.min(50, end - now)));
    }
  }

  pickAvoiding(avoid?: Set<Endpoint>, affinity?: Affinity | null): Endpoint | undefined {
    return (avoid?.size ? this.pick(avoid, affinity) : undefined) ?? this.pick(undefined, affinity);
  }

  /** Why no endpoint could be picked, for the 503 message. */
  describeDown(): string {
    return this.endpoints.map((e) => `${e.url}: ${e.lastError ?? "busy"}`).join("; ");
  }

  /**
   * The endpoints' model ids, max_model_len (the smallest any reported: a request must fit every
   * worker), vocabulary, most slots and each model's sampling defaults (the first endpoint's that
   * serves it), from their last /health.
   */
  served(): {
    modelIds: string[];
    maxContext: number | undefined;
    vocabSize: number | undefined;
    slots: number | undefined;
    generationDefaults: Map<string, SamplingDefaults>;
    loras: Map<string, { parent: string; path: string }>;
  } {
    const ids = new Set<string>();
    let ctx: number | undefined;
    let vocab: number | undefined;
    let slots: number | undefined;
    const defaults = new Map<string, SamplingDefaults>();
    const loras = new Map<string, { parent: string; path: string }>();
    for (const e of this.endpoints) {
      if (!e.health?.model?.id) continue;
      const id = e.health.model.id;
      for (const a of e.health.lora?.adapters ?? []) if (!loras.has(a.name)) loras.set(a.name, { parent: id, path: a.path });
      if (!ids.has(id)) defaults.set(id, e.health.model.generationDefaults ?? {});
      ids.add(id);
      if (typeof e.health.maxModelLen === "number") ctx = Math.min(ctx ?? Number.POSITIVE_INFINITY, e.health.maxModelLen);
      vocab = vocab === undefined ? e.health.model.vocabSize : Math.min(vocab, e.health.model.vocabSize);
      slots = Math.max(slots ?? 0, e.health.requests.slots);
    }
    return { modelIds: [...ids], maxContext: ctx, vocabSize: vocab, slots, generationDefaults: defaults, loras };
  }
}
