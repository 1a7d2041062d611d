// A set of worker endpoints of one role: probes each one's /health on a period (an unhealthy one
// every quarter second, so a worker that finished loading or came back is used at once), and
// hands out the healthy endpoint with the fewest outstanding requests. Busy is not dead: a probe
// that times out does not take down an endpoint that is answering the requests it holds (its
// calls report progress); a refused connection or an error answer does. Knows nothing about the
// OpenAI API.

import { WorkerClient, type WorkerHealth } from "@airm/internal-api";
import { causeOf } from "./orchestrator/worker-calls.ts";

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
}

/** How often an unhealthy endpoint is probed (ms; the interval when that is shorter). */
export const RECOVERY_PROBE_MS = 250;

export class EndpointPool {
  endpoints: Endpoint[];
  private timer: NodeJS.Timeout | undefined;
  private turn = 0;

  constructor(
    readonly role: string,
    urls: string[],
    private readonly probeTimeoutMs = 2000,
    /** How long a busy endpoint (requests outstanding) stays up on progress alone while its probes time out. */
    private readonly busyGraceMs = 15_000,
  ) {
    this.endpoints = urls.map((u) => this.endpoint(u));
  }

  private endpoint(u: string): Endpoint {
    const client = new WorkerClient(u, `${this.role} worker ${u.replace(/\/+$/, "")}`);
    return { url: client.url, client, outstanding: 0, healthy: false, health: null, lastError: "not probed yet", probedAt: 0, aliveAt: 0 };
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

  private async probe(e: Endpoint): Promise<void> {
    e.probedAt = performance.now();
    try {
      const { status, health } = await e.client.health({ signal: AbortSignal.timeout(this.probeTimeoutMs) });
      e.health = health ?? e.health;
      e.healthy = status === 200 && health?.ready === true;
      e.lastError = e.healthy ? null : `health answered ${status}${health?.ready === false ? ` (${health.status}${health.error ? `: ${health.error}` : ""})` : ""}`;
      if (e.healthy) e.aliveAt = performance.now();
    } catch (err) {
      // A slow probe from a worker that is computing for its outstanding requests and made
      // progress lately: busy, not dead. Anything else (refused, reset, silent and idle) is down.
      const timedOut = (err as Error).name === "TimeoutError";
      if (timedOut && e.healthy && e.outstanding > 0 && performance.now() - e.aliveAt < this.busyGraceMs) {
        e.lastError = `busy: health probe timed out after ${this.probeTimeoutMs} ms while ${e.outstanding} requests make progress`;
        return;
      }
      e.healthy = false;
      e.lastError = `health probe failed: ${causeOf(err)}`;
    }
  }

  /** Marks an endpoint down after a failed call (the next probe may bring it back). */
  markDown(e: Endpoint, reason: string): void {
    e.healthy = false;
    e.lastError = reason;
  }

  /**
   * The healthy endpoint with the fewest outstanding requests (ties rotate), skipping `exclude`.
   * Returns undefined when none is healthy.
   */
  pick(exclude: Set<Endpoint> = new Set()): Endpoint | undefined {
    const ok = this.endpoints.filter((e) => e.healthy && !exclude.has(e));
    if (ok.length === 0) return undefined;
    const least = Math.min(...ok.map((e) => e.outstanding));
    const tied = ok.filter((e) => e.outstanding === least);
    return tied[this.turn++ % tied.length];
  }

  /** Why no endpoint could be picked, for the 503 message. */
  describeDown(): string {
    return this.endpoints.map((e) => `${e.url}: ${e.lastError ?? "busy"}`).join("; ");
  }

  /** The endpoints' model ids and largest context, from their last /health. */
  served(): { modelIds: string[]; maxContext: number | undefined } {
    const ids = new Set<string>();
    let ctx: number | undefined;
    for (const e of this.endpoints) {
      if (!e.health?.model?.id) continue;
      ids.add(e.health.model.id);
      if (typeof e.health.seqLen === "number") ctx = Math.max(ctx ?? 0, e.health.seqLen);
    }
    return { modelIds: [...ids], maxContext: ctx };
  }
}
