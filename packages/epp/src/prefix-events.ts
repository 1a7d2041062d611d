// Precise prefix routing (--routing prefix): the picker follows every endpoint's KV events into a
// block index (@airm/routing, the gateway's follower: ZMQ SUB with replay at start, after a gap and
// after a restart), and names a request's blocks as its servers do: the prompt's token ids from a
// decode endpoint's POST /tokenize (vLLM's route, which our gateways serve), hashed from the root
// the endpoint exports in airm_prefix_cache_info (model and numerics fingerprints, block size) and
// the request's cache_salt. Where a worker's events are: the endpoint's own kvEvents / kvReplay
// (an endpoints file), else tcp://<address>:<kvEventsPort> and :<kvReplayPort> (pods).

import { request } from "node:http";
import { BlockIndex, type BlockIds, KvEventSubscriber, promptBlockIds } from "@airm/routing";
import { decodes, hostPortOf, type Endpoint } from "@airm/routing";
import type { Log } from "./log.ts";
import type { EndpointState } from "./metrics-scraper.ts";
import type { PrefixCacheInfo } from "./prometheus-text.ts";

export interface PrefixEventsOptions {
  /** The port of a pod's KV events when its endpoint names none (vLLM's default 5557). */
  kvEventsPort: number;
  /** Its replay port (0: none). */
  kvReplayPort: number;
  /** How long a /tokenize may take before the request is routed by load (ms, default 2000). */
  tokenizeTimeoutMs?: number;
  log?: Log;
}

/** What a request gives the tokenizer: vLLM's /tokenize body fields (prompt, or messages with tools), and its tenant. */
export interface TokenizeBody {
  model: string;
  prompt?: unknown;
  messages?: unknown;
  tools?: unknown;
  cacheSalt?: string;
}

/** How many of the prompt's blocks each endpoint holds. */
export interface PreciseAffinity {
  blocks: number;
  matched(s: EndpointState): number;
}

export class PrefixEvents {
  readonly index = new BlockIndex();
  private readonly subs = new Map<string, { instance: string | null; at: string; sub: KvEventSubscriber }>();
  /** Prompts tokenized for a pick, and tokenizations that failed. */
  readonly counts = { lookups: 0, tokenizeFailures: 0 };

  constructor(private readonly o: PrefixEventsOptions) {}

  private eventsOf(e: Endpoint): { endpoint: string; replay: string | null } {
    const host = e.address.includes(":") ? `[${e.address}]` : e.address;
    if (e.kvEvents) return { endpoint: e.kvEvents, replay: e.kvReplay ?? null };
    return { endpoint: `tcp://${host}:${this.o.kvEventsPort}`, replay: this.o.kvReplayPort ? `tcp://${host}:${this.o.kvReplayPort}` : null };
  }

  /** Follows the events of every endpoint in `states` (afresh when its worker process changed); stops following those gone. */
  sync(states: EndpointState[]): void {
    const seen = new Set<string>();
    for (const s of states) {
      seen.add(s.key);
      const { endpoint, replay } = this.eventsOf(s.endpoint);
      const instance = s.load?.prefixInfo?.instance ?? null;
      const had = this.subs.get(s.key);
      if (had && had.at === endpoint && (instance === null || had.instance === null || had.instance === instance)) {
        if (had.instance === null) had.instance = instance;
        continue;
      }
      had?.sub.close();
      const sub = new KvEventSubscriber({
        worker: s.key,
        endpoint,
        replayEndpoint: replay,
        index: this.index,
        onNote: (what, detail) => this.o.log?.[what === "replay" ? "debug" : "warn"]({ endpoint: s.key, what, detail }, "KV events"),
      });
      this.subs.set(s.key, { instance, at: endpoint, sub });
      sub.start().catch((err) => this.o.log?.warn({ endpoint: s.key, err: (err as Error).message }, "cannot follow KV events"));
    }
    for (const [key, s] of this.subs) {
      if (seen.has(key)) continue;
      s.sub.close();
      this.subs.delete(key);
    }
  }

  /** Event batches and events applied, replays asked, batches given up, over every endpoint. */
  eventCounts(): { batches: number; events: number; replays: number; missed: number } {
    const t = { batches: 0, events: 0, replays: 0, missed: 0 };
    for (const { sub } of this.subs.values()) for (const k of Object.keys(t) as (keyof typeof t)[]) t[k] += sub.counts[k];
    return t;
  }

  /**
   * The prompt's affinity to `states`, or null when there is nothing to go on (an empty index,
   * no endpoint to tokenize on, a failed /tokenize): the pick then goes by load.
   */
  async affinity(body: TokenizeBody, states: EndpointState[]): Promise<PreciseAffinity | null> {
    if (this.index.size === 0) return null;
    const at = states.find((s) => decodes(s.endpoint.role) && s.error === null && s.load?.prefixInfo);
    if (!at) return null;
    let tokens: number[];
    try {
      tokens = await this.tokenize(at.endpoint, body);
    } catch (err) {
      this.counts.tokenizeFailures++;
      this.o.log?.debug({ endpoint: at.key, err: (err as Error).message }, "tokenize failed; routing by load");
      return null;
    }
    this.counts.lookups++;
    const byRoot = new Map<string, BlockIds>();
    const idsFor = (info: PrefixCacheInfo | undefined): BlockIds => {
      if (!info) return [];
      const key = `${info.modelFingerprint}/${info.numericsFingerprint}/${info.blockSize}`;
      let ids = byRoot.get(key);
      if (!ids) byRoot.set(key, (ids = promptBlockIds(info, tokens, body.cacheSalt ?? "")));
      return ids;
    };
    const blocks = Math.max(0, ...states.map((s) => idsFor(s.load?.prefixInfo).length));
    return { blocks, matched: (s) => this.index.matched(idsFor(s.load?.prefixInfo), s.key) };
  }

  /** The prompt's token ids: a prompt given as ids is its own (no template, no special tokens); else POST /tokenize on `e` (vLLM's request and answer shape). */
  private tokenize(e: Endpoint, body: TokenizeBody): Promise<number[]> {
    const p = body.prompt;
    if (Array.isArray(p) && p.length > 0 && p.every((t) => Number.isInteger(t) && t >= 0)) return Promise.resolve(p as number[]);
    const payload = JSON.stringify(
      body.messages !== undefined
        ? { model: body.model, messages: body.messages, ...(body.tools !== undefined ? { tools: body.tools } : {}) }
        : { model: body.model, prompt: body.prompt },
    );
    return new Promise((resolve, reject) => {
      const req = request(
        `http://${hostPortOf(e)}/tokenize`,
        { method: "POST", headers: { "content-type": "application/json", "content-length": Buffer.byteLength(payload) }, timeout: this.o.tokenizeTimeoutMs ?? 2000 },
        (res) => {
          const chunks: Buffer[] = [];
          res.on("data", (c: Buffer) => chunks.push(c));
          res.on("end", () => {
            try {
              const j = JSON.parse(Buffer.concat(chunks).toString("utf8")) as { tokens?: unknown };
              if (res.statusCode !== 200 || !Array.isArray(j.tokens)) throw new Error(`answered ${res.statusCode}`);
              resolve(j.tokens as number[]);
            } catch (err) {
              reject(err);
            }
          });
          res.on("error", reject);
        },
      );
      req.on("timeout", () => req.destroy(new Error("timed out")));
      req.on("error", reject);
      req.end(payload);
    });
  }

  close(): void {
    for (const { sub } of this.subs.values()) sub.close();
    this.subs.clear();
  }
}
