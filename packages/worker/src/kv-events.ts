// KV events in vLLM's wire format (vllm/distributed/kv_events.py, as vLLM 0.34 sends them): each
// batch of the engine's prefix-cache changes goes out on a ZMQ PUB socket as three frames, the
// topic, an 8-byte big-endian sequence number (from 0) and a msgpack KVEventBatch: the array [ts,
// events, data_parallel_rank], each event a map tagged by "type" (BlockStored, BlockRemoved,
// AllBlocksCleared) with vLLM's fields in vLLM's order. Block hashes go as vLLM's default int
// form: the low 64 bits of rm-core's block hash. The last `buffer_steps` batches are kept for a
// ROUTER replay socket: a consumer that (re)connects sends [empty, start seq] and gets [empty,
// topic, seq, payload] for every kept batch from there, then the end marker [empty, empty, -1, empty].
// Configured like vLLM's --kv-events-config (kv-events-config.ts). Loaded only when events are on
// (it loads zeromq's native addon).

import { encode } from "@msgpack/msgpack";
import { blockHashId, type BlockEvent } from "@airm/rm-core";
import * as zmq from "zeromq";
import type { KvEventsConfig } from "./kv-events-config.ts";

/** vLLM's medium for the engine's own KV cache (its primary tier: the card's memory on an NPU, host memory on the CPU reference). */
export const MEDIUM = "GPU";

/** One engine change as vLLM's tagged event map. */
export function vllmEvent(e: BlockEvent): Record<string, unknown> {
  if (e.kind === "stored") {
    return {
      type: "BlockStored",
      block_hashes: e.hashes.map(blockHashId),
      parent_block_hash: e.parent === null ? null : blockHashId(e.parent),
      token_ids: e.tokens,
      block_size: e.blockSize,
      lora_id: null,
      medium: MEDIUM,
      lora_name: null,
    };
  }
  if (e.kind === "removed") return { type: "BlockRemoved", block_hashes: e.hashes.map(blockHashId), medium: MEDIUM };
  return { type: "AllBlocksCleared" };
}

/** A KVEventBatch's msgpack bytes: [ts, events, data_parallel_rank], always three elements. */
export function encodeBatch(ts: number, events: BlockEvent[], rank: number | null = null): Uint8Array {
  return encode([ts, events.map(vllmEvent), rank], { useBigInt64: true, forceFloat32: false });
}

const seqBytes = (seq: bigint): Buffer => {
  const b = Buffer.alloc(8);
  b.writeBigInt64BE(seq);
  return b;
};

/**
 * vLLM binds an endpoint with a wildcard host (or ipc/inproc) and connects to any other. A tcp
 * endpoint on the address the worker itself listens on (--host) is bound too: the worker owns it.
 */
export function binds(endpoint: string, ownHost: string): boolean {
  if (endpoint.includes("*") || endpoint.includes("::") || endpoint.startsWith("ipc://") || endpoint.startsWith("inproc://")) return true;
  const host = /^tcp:\/\/(.+):\d+$/.exec(endpoint)?.[1]?.replace(/^\[(.*)\]$/, "$1");
  return host !== undefined && host === ownHost;
}

export class KvEventPublisher {
  private seq = 0n;
  private pending: BlockEvent[] = [];
  private flushing = false;
  private readonly kept: { seq: bigint; payload: Uint8Array }[] = [];
  private readonly topic: Buffer;
  private closed = false;
  /** Batches published and events in them. */
  batches = 0;
  events = 0;

  private constructor(
    private readonly cfg: KvEventsConfig,
    private readonly pub: zmq.Publisher,
    private readonly replay: zmq.Router | null,
  ) {
    this.topic = Buffer.from(cfg.topic, "utf8");
    if (replay) void this.serveReplay(replay);
  }

  /** Opens the PUB socket (and the replay ROUTER) as `cfg` says; `ownHost`: the address the worker serves on. */
  static async start(cfg: KvEventsConfig, ownHost: string): Promise<KvEventPublisher> {
    const pub = new zmq.Publisher({ sendHighWaterMark: cfg.hwm });
    let replay: zmq.Router | null = null;
    try {
      if (binds(cfg.endpoint, ownHost)) await pub.bind(cfg.endpoint);
      else pub.connect(cfg.endpoint);
      if (cfg.replay_endpoint) {
        replay = new zmq.Router({ sendHighWaterMark: 2 * (cfg.buffer_steps + 1) });
        await replay.bind(cfg.replay_endpoint);
      }
    } catch (err) {
      // An open socket keeps the process alive: a worker that cannot publish must still exit.
      pub.close();
      replay?.close();
      throw err;
    }
    return new KvEventPublisher(cfg, pub, replay);
  }

  /** Where a consumer finds the events (the addresses bound, a tcp port 0 resolved), for /health. */
  get advertised(): { endpoint: string; replayEndpoint: string | null; topic: string } {
    const { events, replay } = this.endpoints;
    return { endpoint: events ?? this.cfg.endpoint, replayEndpoint: replay ?? this.cfg.replay_endpoint, topic: this.cfg.topic };
  }

  /** The addresses bound (a tcp port 0 resolved), for logs and tests. */
  get endpoints(): { events: string | null; replay: string | null } {
    return { events: this.pub.lastEndpoint ?? null, replay: this.replay?.lastEndpoint ?? null };
  }

  /** Queues an engine change; the changes of one turn of the event loop go out as one batch. */
  add(e: BlockEvent): void {
    if (this.closed) return;
    this.pending.push(e);
    if (!this.flushing) {
      this.flushing = true;
      setImmediate(() => void this.flush());
    }
  }

  private async flush(): Promise<void> {
    const events = this.pending;
    this.pending = [];
    this.flushing = false;
    if (events.length === 0 || this.closed) return;
    const payload = encodeBatch(Date.now() / 1000, events);
    const seq = this.seq++;
    this.kept.push({ seq, payload });
    if (this.kept.length > this.cfg.buffer_steps) this.kept.shift();
    this.batches++;
    this.events += events.length;
    try {
      await this.pub.send([this.topic, seqBytes(seq), payload]);
    } catch {
      // a PUB socket drops what no subscriber can take; a closed one ends here
    }
  }

  private async serveReplay(router: zmq.Router): Promise<void> {
    try {
      for await (const frames of router) {
        if (this.closed) return;
        // [client id, empty, start seq]
        if (frames.length !== 3 || frames[2].length !== 8) continue;
        const [client, empty] = frames;
        const from = frames[2].readBigInt64BE(0);
        for (const b of this.kept) if (b.seq >= from) await router.send([client, empty, this.topic, seqBytes(b.seq), b.payload]);
        await router.send([client, empty, Buffer.alloc(0), seqBytes(-1n), Buffer.alloc(0)]);
      }
    } catch {
      // closed
    }
  }

  async close(): Promise<void> {
    if (this.closed) return;
    await this.flush();
    this.closed = true;
    this.pub.close();
    this.replay?.close();
  }
}
