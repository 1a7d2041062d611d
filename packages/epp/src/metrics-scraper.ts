// Keeps every endpoint's load fresh: GET http://<ip>:<port>/metrics every intervalMs over one
// keep-alive connection per endpoint (a scrape still in flight is not doubled), parses the vLLM
// gauges, and counts the picks made since the last scrape was sent so the picker can add them to
// the queue it sees. Knows nothing about scoring; the picker reads its states.
// Given TLS material (AIRM_TLS_DIR) it scrapes over mutual TLS: a pool can hold both workers whose
// port is mutual TLS (llm-d's prefill pods) and gateways that speak plain HTTP, so an endpoint whose
// server answers the TLS hello in plain HTTP is scraped in plain HTTP from then on (logged once).

import { Agent, request, type ClientRequest, type IncomingMessage } from "node:http";
import { Agent as HttpsAgent, request as httpsRequest } from "node:https";
import { clientTlsOptions, type TlsMaterial } from "@airm/rm-core";
import { hostPortOf, type Endpoint } from "@airm/routing";
import { parseServerLoad, type ServerLoad } from "./prometheus-text.ts";

/** What the picker knows about one endpoint. Mutated in place by the scraper and the picker. */
export interface EndpointState {
  readonly endpoint: Endpoint;
  /** "ip:port". */
  readonly key: string;
  /** The last good scrape's figures (null before the first). */
  load: ServerLoad | null;
  /** When the last good scrape answered (performance.now() ms; 0 before the first). */
  scrapedAt: number;
  /** Why the last scrape failed (null when it succeeded). */
  error: string | null;
  /** Picks of this endpoint so far. */
  picks: number;
  /** `picks` when the request of the last good scrape was sent: later picks are not in its figures. */
  picksAtScrape: number;
  /** A scrape is in flight. */
  scraping: boolean;
  /** How /metrics is read: "https" (mutual TLS) first when the scraper has TLS material, "http" once the server answered TLS in plain HTTP. */
  scheme: "http" | "https";
}

/** Picks made since the last good scrape was sent (not yet in the scraped queue). */
export function pendingPicks(s: EndpointState): number {
  return s.picks - s.picksAtScrape;
}

/** Scraped successfully within `staleAfterMs` of `now` (performance.now() ms). */
export function isFresh(s: EndpointState, now: number, staleAfterMs: number): boolean {
  return s.error === null && s.load !== null && now - s.scrapedAt <= staleAfterMs;
}

export interface ScraperOptions {
  /** Scrape period in ms (default 50). */
  intervalMs?: number;
  /** A scrape not answered in this many ms fails (default 1000). */
  timeoutMs?: number;
  /** Largest /metrics body read, in bytes (default 4 MiB). */
  maxBytes?: number;
  /** Called after each scrape (ok or not), e.g. for metrics. */
  onScrape?: (s: EndpointState) => void;
  /** Scrape over mutual TLS presenting this certificate (AIRM_TLS_DIR); plain HTTP without. */
  tls?: TlsMaterial;
  /** Told once per endpoint that answered the TLS hello in plain HTTP. */
  onPlain?: (s: EndpointState) => void;
}

/** Whether a TLS client's error says the server speaks plain HTTP (its answer is not a TLS record). */
function plainAnswer(e: NodeJS.ErrnoException): boolean {
  return e.code === "ERR_SSL_WRONG_VERSION_NUMBER" || e.code === "ERR_SSL_PACKET_LENGTH_TOO_LONG" || /wrong version number|packet length too long/.test(e.message);
}

export class MetricsScraper {
  private readonly byKey = new Map<string, EndpointState>();
  private readonly agent = new Agent({ keepAlive: true, maxSockets: 1 });
  /** Scrapes over mutual TLS go through it; a new one after the TLS files reloaded. */
  private tlsAgent: HttpsAgent | null;
  private stopReloads = () => {};
  private readonly onPlain: (s: EndpointState) => void;
  private timer: NodeJS.Timeout | undefined;
  readonly intervalMs: number;
  private readonly timeoutMs: number;
  private readonly maxBytes: number;
  private readonly onScrape: (s: EndpointState) => void;

  constructor(options: ScraperOptions = {}) {
    this.intervalMs = options.intervalMs ?? 50;
    this.timeoutMs = options.timeoutMs ?? 1000;
    this.maxBytes = options.maxBytes ?? 4 * 1024 * 1024;
    this.onScrape = options.onScrape ?? (() => {});
    this.onPlain = options.onPlain ?? (() => {});
    const tls = options.tls;
    const agentOf = (m: TlsMaterial) => new HttpsAgent({ keepAlive: true, maxSockets: 1, ...clientTlsOptions(m) });
    this.tlsAgent = tls ? agentOf(tls) : null;
    if (tls) {
      this.stopReloads = tls.onReload(() => {
        // the scrape under way (if any) ends on the old agent; its connection closes after
        const old = this.tlsAgent;
        this.tlsAgent = agentOf(tls);
        setTimeout(() => old?.destroy(), this.timeoutMs + 1000).unref();
      });
    }
  }

  /** Replaces the endpoint set; endpoints already known keep their state (same address, port and role). */
  setEndpoints(endpoints: Endpoint[]): void {
    const next = new Map<string, EndpointState>();
    for (const e of endpoints) {
      const key = hostPortOf(e);
      const old = this.byKey.get(key);
      const keep = old && old.endpoint.role === e.role && old.endpoint.name === e.name;
      const scheme = this.tlsAgent ? "https" : "http";
      next.set(key, keep ? old : { endpoint: e, key, load: null, scrapedAt: 0, error: null, picks: 0, picksAtScrape: 0, scraping: false, scheme });
    }
    this.byKey.clear();
    for (const [k, s] of next) this.byKey.set(k, s);
    if (this.timer) for (const s of this.byKey.values()) if (s.load === null && !s.scraping) this.scrape(s);
  }

  /** Every endpoint's state (live objects). */
  states(): EndpointState[] {
    return [...this.byKey.values()];
  }

  /** Scrapes every endpoint now and every intervalMs after. */
  start(): void {
    if (this.timer) return;
    const tick = () => {
      for (const s of this.byKey.values()) if (!s.scraping) this.scrape(s);
    };
    this.timer = setInterval(tick, this.intervalMs);
    this.timer.unref();
    tick();
  }

  stop(): void {
    clearInterval(this.timer);
    this.timer = undefined;
    this.agent.destroy();
    this.stopReloads();
    this.tlsAgent?.destroy();
  }

  /** Resolves once every endpoint has been scraped at least once (ok or failed) or `timeoutMs` passed. */
  async settled(timeoutMs = 2000): Promise<void> {
    const end = performance.now() + timeoutMs;
    while (performance.now() < end && this.states().some((s) => s.load === null && s.error === null)) await new Promise((r) => setTimeout(r, 5));
  }

  private scrape(s: EndpointState): void {
    s.scraping = true;
    const picksAtSend = s.picks;
    const done = (err: string | null, load?: ServerLoad) => {
      if (!s.scraping) return;
      s.scraping = false;
      s.error = err;
      if (load) {
        s.load = load;
        s.scrapedAt = performance.now();
        s.picksAtScrape = picksAtSend;
      }
      this.onScrape(s);
    };
    const req = this.get(s, (res) => {
      if (res.statusCode !== 200) {
        res.resume();
        done(`/metrics answered HTTP ${res.statusCode}`);
        return;
      }
      res.setEncoding("utf8");
      let body = "";
      res.on("data", (chunk: string) => {
        body += chunk;
        if (body.length > this.maxBytes) res.destroy(new Error(`/metrics is larger than ${this.maxBytes} bytes`));
      });
      res.on("error", (e) => done(e.message));
      res.on("end", () => {
        try {
          done(null, parseServerLoad(body));
        } catch (e) {
          done((e as Error).message);
        }
      });
    });
    req.on("timeout", () => req.destroy(new Error(`/metrics did not answer within ${this.timeoutMs} ms`)));
    req.on("error", (e: NodeJS.ErrnoException) => {
      if (s.scheme === "https" && plainAnswer(e)) {
        s.scheme = "http";
        this.onPlain(s);
        s.scraping = false;
        this.scrape(s);
        return;
      }
      done(e.message);
    });
    req.end();
  }

  /** GET /metrics of `s` in its scheme. */
  private get(s: EndpointState, onResponse: (res: IncomingMessage) => void): ClientRequest {
    const at = { host: s.endpoint.address, port: s.endpoint.port, path: "/metrics", timeout: this.timeoutMs };
    if (s.scheme === "https" && this.tlsAgent) return httpsRequest({ ...at, agent: this.tlsAgent }, onResponse);
    return request({ ...at, agent: this.agent }, onResponse);
  }
}
