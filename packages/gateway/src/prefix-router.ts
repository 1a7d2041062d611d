// Prefix-aware routing (AIRM_ROUTING=prefix): the gateway follows every worker's KV events into
// one block index (@airm/routing: a ZMQ subscription per worker, rebuilt from its replay endpoint
// when the gateway starts, after a gap, and when the worker's process changes), and scores each
// candidate by how many of the prompt's first blocks it already holds, with its load. The
// prompt's blocks are named as the workers name them: its token ids (a worker's /internal/tokenize,
// asked of the least busy decode worker only when there is a choice to make) hashed in a chain
// from the worker's model and numerics fingerprints, block size and the request's cache_salt.

import type { PromptInput } from "@airm/internal-api";
import { BlockIndex, type BlockIds, KvEventSubscriber, promptBlockIds } from "@airm/routing";
import { type BlockHashRoot, prefixSalt } from "@airm/rm-core";
import type { Logger } from "pino";
import type { Affinity, Endpoint, EndpointPool } from "./endpoint-pool.ts";

export type { Affinity } from "./endpoint-pool.ts";

/** What a request needs hashed: its prompt, tokens already generated (a moved stream) and its tenant. */
export interface PromptOf {
  input: PromptInput;
  resume?: number[];
  cacheSalt?: string;
  /** The LoRA adapter it runs on: its blocks are named under the adapter's fingerprint too. */
  lora?: string;
}

/** The worker's events endpoint with a wildcard host replaced by the host its URL names. */
export function reachable(endpoint: string, workerUrl: string): string {
  const host = new URL(workerUrl).hostname;
  return endpoint.replace(/^tcp:\/\/(\*|0\.0\.0\.0|\[::\]|::)(?=:\d+$)/, `tcp://${host.includes(":") ? `[${host}]` : host}`);
}

function rootOf(e: Endpoint): BlockHashRoot | null {
  const h = e.health;
  if (!h?.model || !h.kvCache || !h.prefixCache?.enabled) return null;
  return { modelFingerprint: h.model.modelFingerprint, numericsFingerprint: h.model.numericsFingerprint, blockSize: h.kvCache.blockSize };
}

const SYNC_MS = 250;

export class PrefixRouter {
  readonly index = new BlockIndex();
  private readonly subs = new Map<string, { instance: string; endpoint: string; sub: KvEventSubscriber }>();
  private readonly timer: NodeJS.Timeout;
  /** Prompts hashed for a pick. */
  readonly counts = { lookups: 0 };

  constructor(
    private readonly pools: EndpointPool[],
    private readonly log?: Logger,
  ) {
    this.timer = setInterval(() => this.sync(), SYNC_MS);
    this.timer.unref();
    this.sync();
  }

  /** Subscribes to every pool member that publishes events (again when its process or endpoint changed); drops members gone. */
  sync(): void {
    const seen = new Set<string>();
    for (const e of this.pools.flatMap((p) => p.endpoints)) {
      const pc = e.health?.prefixCache;
      if (!pc?.events) continue;
      seen.add(e.url);
      const endpoint = reachable(pc.events.endpoint, e.url);
      const had = this.subs.get(e.url);
      if (had && had.instance === pc.instance && had.endpoint === endpoint) continue;
      had?.sub.close();
      const sub = new KvEventSubscriber({
        worker: e.url,
        endpoint,
        replayEndpoint: pc.events.replayEndpoint ? reachable(pc.events.replayEndpoint, e.url) : null,
        index: this.index,
        onNote: (what, detail) => this.log?.[what === "replay" ? "debug" : "warn"]({ worker: e.url, what, detail }, "KV events"),
      });
      this.subs.set(e.url, { instance: pc.instance, endpoint, sub });
      sub.start().catch((err) => this.log?.warn({ worker: e.url, err: (err as Error).message }, "cannot follow KV events"));
    }
    for (const [url, s] of this.subs) {
      if (seen.has(url)) continue;
      s.sub.close();
      this.subs.delete(url);
    }
  }

  /** Event batches and events applied, replays asked and batches given up, over every worker followed. */
  eventCounts(): { batches: number; events: number; replays: number; missed: number } {
    const t = { batches: 0, events: 0, replays: 0, missed: 0 };
    for (const { sub } of this.subs.values()) for (const k of Object.keys(t) as (keyof typeof t)[]) t[k] += sub.counts[k];
    return t;
  }

  /**
   * The prompt's affinity to each endpoint of `pools` that may be picked, or null when there is
   * nothing to choose (one candidate per pool) or nothing indexed. Asks a worker of `tokenizeOn`
   * for the token ids; a failed ask routes by load (null).
   */
  async affinity(p: PromptOf, pools: EndpointPool[], tokenizeOn: EndpointPool, signal?: AbortSignal): Promise<Affinity | null> {
    const choice = pools.some((pool) => pool.endpoints.filter((e) => e.healthy).length > 1);
    if (!choice || this.index.size === 0) return null;
    const at = leastBusy(tokenizeOn);
    if (!at) return null;
    let promptTokens: number[];
    try {
      promptTokens = (await at.client.tokenize({ input: p.input }, { signal: AbortSignal.any([AbortSignal.timeout(5000), ...(signal ? [signal] : [])]) })).tokens;
    } catch (err) {
      this.log?.debug({ worker: at.url, err: (err as Error).message }, "prefix routing: tokenize failed; routing by load");
      return null;
    }
    const tokens = p.resume?.length ? [...promptTokens, ...p.resume] : promptTokens;
    this.counts.lookups++;
    const byRoot = new Map<string, BlockIds>();
    const idsFor = (e: Endpoint): BlockIds => {
      const root = rootOf(e);
      // An adapter's blocks are salted with its fingerprint, as the workers name them; a worker without it holds none.
      const lora = p.lora === undefined ? undefined : e.health?.lora?.adapters.find((a) => a.name === p.lora)?.fingerprint;
      if (!root || (p.lora !== undefined && lora === undefined)) return [];
      const key = `${root.modelFingerprint}/${root.numericsFingerprint}/${root.blockSize}/${lora ?? ""}`;
      let ids = byRoot.get(key);
      if (!ids) byRoot.set(key, (ids = promptBlockIds(root, tokens, prefixSalt(p.cacheSalt, lora))));
      return ids;
    };
    let blocks = 0;
    let blockSize = 0;
    for (const e of pools.flatMap((pool) => pool.endpoints)) {
      if (idsFor(e).length <= blocks) continue;
      blocks = idsFor(e).length;
      blockSize = rootOf(e)!.blockSize;
    }
    return { blocks, blockSize, promptTokens, matched: (e) => this.index.matched(idsFor(e), e.url) };
  }

  close(): void {
    clearInterval(this.timer);
    for (const { sub } of this.subs.values()) sub.close();
    this.subs.clear();
  }
}

/** The healthy endpoint with the fewest outstanding requests (no pick is counted). */
function leastBusy(pool: EndpointPool): Endpoint | undefined {
  return pool.endpoints.filter((e) => e.healthy).sort((a, b) => a.outstanding - b.outstanding)[0];
}
