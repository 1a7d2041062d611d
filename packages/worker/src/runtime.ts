// The state every route of a worker shares, built whole at start-up: role, leases, admission
// slots, metrics and log, plus what loading produces (engine, transport, batcher), which moves
// from loading to ready or failed exactly once. Routes ask `ready()` and get a 503 while loading.

import { LoraUse } from "./lora-use.ts";
import { randomUUID } from "node:crypto";
import { GrammarEngine, type GrammarMatcher, type GrammarSpec } from "@airm/grammar";
import { ApiError, OverloadedError, type WorkerEstimates } from "@airm/internal-api";
import { Ewma, PrefillFit, type KVTransport, type WorkerRole } from "@airm/rm-core";
import type { Logger } from "pino";
import { Admission } from "./admission.ts";
import { DecodeBatcher } from "./decode-batcher.ts";
import { LeaseTable, type LeaseEnd } from "./kv-leases.ts";
import { PrefixHolds } from "./prefix-holds.ts";
import type { EngineStream, ServingEngine } from "./serving-engine.ts";
import { WorkerMetrics } from "./worker-metrics.ts";

/** What a loaded worker serves with. */
export interface Serving {
  engine: ServingEngine;
  /** Null for the solo role. */
  transport: KVTransport | null;
  batcher: DecodeBatcher;
  /** Structured outputs; null when the engine's tokenizer gives no vocabulary. */
  grammar: GrammarEngine | null;
}

/** What a prefill or decode worker serves with: its KV transport is there. */
export type HandoffServing = Serving & { transport: KVTransport };

export interface RuntimeOptions {
  role: WorkerRole;
  backend: string;
  engineName: string;
  /** Requests that run at once (max_num_seqs). */
  maxNumSeqs: number;
  leaseTtlMs: number;
  kvTimeoutMs: number;
  /** Most requests waiting (for a slot, or decode's for their KV) before one more gets 429 (default: no bound). */
  maxWaiting?: number;
  /** Compiled grammars kept (structured outputs; default 64). */
  grammarCache?: number;
  /** A decode worker that also prefills whole requests (--local-prefill). */
  localPrefill?: boolean;
  log: Logger;
}

export class WorkerRuntime {
  readonly role: WorkerRole;
  readonly backend: string;
  readonly engineName: string;
  readonly kvTimeoutMs: number;
  readonly maxWaiting: number;
  readonly grammarCache: number;
  readonly log: Logger;
  /** Admission by KV blocks and running slots. */
  readonly admission: Admission;
  readonly leases: LeaseTable;
  readonly metrics: WorkerMetrics;
  /** Requests waiting for their KV to arrive (decode role). */
  kvWaiting = 0;
  /** Prompt blocks held for requests between their kv-hold and their decode (decode role). */
  readonly holds: PrefixHolds;
  /** Prompt positions held for handoffs (kv-hold answers), and KV bytes that did not cross because of them. */
  heldPositions = 0;
  kvSkippedBytes = 0;
  /** The KV event publisher, when --kv-events-config enables one. */
  kvEvents: { batches: number; events: number; advertised: { endpoint: string; replayEndpoint: string | null; topic: string } } | null = null;
  /** This process's id in /health (a router that sees it change forgets what it indexed here). */
  readonly instance = randomUUID();
  /** Decode role: KV bytes that crossed into this worker, and the handoffs that brought them. */
  kvPulledBytes = 0;
  kvPulls = 0;
  /** What the disaggregation decision reads (rm-core's disaggregation.ts), measured on this worker's own requests. */
  readonly estimates = {
    /** This worker's prefills: ms over computed tokens. */
    prefill: new PrefillFit(),
    /** Decode: bytes/s of its KV pulls while the bytes moved. */
    kvBandwidth: new Ewma(),
    /** Decode: KV bytes per request received. */
    kvBytes: new Ewma(),
    /** Decode: KV bytes received per prompt token. */
    kvBytesPerToken: new Ewma(),
  };
  readonly localPrefill: boolean;
  /** Set when the worker drains (SIGTERM, SIGINT, POST /internal/drain): it admits nothing new and /health says draining. */
  draining = false;
  /** The adapters of requests waiting and running (vllm:lora_requests_info). */
  readonly loraUse = new LoraUse();
  /** What started the drain: a stop signal (final) or the drain route (DELETE /internal/drain resumes it). */
  drainedBy: "signal" | "api" | null = null;
  /** Aborted (with a worker_draining ApiError) when a draining worker hands its requests back. */
  readonly handBack = new AbortController();
  /** Prompt tokens of prefills that looked up the engine's prefix cache, and the tokens it gave. */
  private prefixQueried = 0;
  private prefixHit = 0;
  /** Whether the loaded engine keeps a prefix cache (read once, at markReady). */
  private prefixCacheOn = false;
  private state: { kind: "loading" } | ({ kind: "ready" } & Serving) | { kind: "failed"; error: string } = { kind: "loading" };

  constructor(o: RuntimeOptions) {
    this.role = o.role;
    this.backend = o.backend;
    this.engineName = o.engineName;
    this.kvTimeoutMs = o.kvTimeoutMs;
    this.maxWaiting = o.maxWaiting ?? Number.POSITIVE_INFINITY;
    this.grammarCache = o.grammarCache ?? 64;
    this.localPrefill = o.localPrefill === true && o.role === "decode";
    this.log = o.log;
    this.admission = new Admission(o.maxNumSeqs);
    // A decode follows its kv-hold at once; one that never comes lets its blocks go after two KV waits.
    this.holds = new PrefixHolds(2 * o.kvTimeoutMs);
    this.leases = new LeaseTable(
      o.leaseTtlMs,
      async (rid) => {
        await this.serving?.transport?.release(rid);
      },
      (reason, rid) => {
        this.metrics.leaseEnds.inc({ reason });
        if (reason === "expired") this.log.warn({ request_id: rid }, "KV lease expired; blobs released");
      },
    );
    this.metrics = new WorkerMetrics(
      {
        waiting: () => this.admission.numWaiting + this.kvWaiting,
        running: () => this.admission.numRunning,
        // Blocks held by requests (and set aside for admitted ones) over the pool's blocks.
        kvUsage: () => {
          const kv = this.serving?.engine.kvCache();
          return kv ? kv.usedBlocks / kv.totalBlocks : 0;
        },
        geometry: () => {
          const kv = this.serving?.engine.kvCache();
          return kv ? { blockSize: kv.blockSize, numBlocks: kv.totalBlocks } : null;
        },
        preemptions: () => this.serving?.engine.kvCache().preemptions ?? 0,
        draining: () => this.draining,
        // Active: every adapter loaded here (ready to serve: the inference extension's protocol
        // reads running_lora_adapters as the adapters a server has loaded) and those of running requests.
        lora: () => {
          const loras = this.serving?.engine.loras;
          if (!loras) return undefined;
          const use = this.loraUse.names();
          return { maxLoras: loras.maxLoras, running: [...new Set([...loras.list().map((l) => l.name), ...use.running])], waiting: use.waiting };
        },
        leases: () => this.leases.counters(),
        prefixCache: () => {
          if (!this.serving) return null;
          const kept = this.serving.engine.stats?.().prefixCache;
          return {
            queriedTokens: this.prefixQueried,
            hitTokens: this.prefixHit,
            blocks: kept?.blocks ?? 0,
            evictions: kept?.evictions ?? 0,
            heldPositions: this.heldPositions,
            kvSkippedBytes: this.kvSkippedBytes,
            kvPulledBytes: this.kvPulledBytes,
            kvPulls: this.kvPulls,
            eventBatches: this.kvEvents?.batches ?? 0,
            events: this.kvEvents?.events ?? 0,
          };
        },
        grammar: () => this.serving?.grammar?.stats ?? null,
        estimates: () => this.estimatesNow(),
        prefixInfo: () => {
          const e = this.serving?.engine;
          if (!e?.stats().prefixCache?.enabled) return null;
          return { modelFingerprint: e.model.modelFingerprint, numericsFingerprint: e.model.numericsFingerprint, blockSize: e.kvCache().blockSize, instance: this.instance };
        },
      },
      { role: o.role, backend: o.backend },
    );
  }

  /** The disaggregation inputs this worker measured so far (null: not yet). */
  estimatesNow(): WorkerEstimates {
    return {
      prefill: this.estimates.prefill.model(),
      kvBandwidth: this.estimates.kvBandwidth.value,
      kvBytes: this.estimates.kvBytes.value,
      kvBytesPerToken: this.estimates.kvBytesPerToken.value,
      localPrefill: this.localPrefill,
    };
  }

  /** Records a KV pull's bytes, the time they were moving and the positions they hold (decode): a bandwidth sample. */
  noteKvTransfer(bytes: number, movingMs: number, positions: number): void {
    if (!(bytes > 0 && movingMs > 0)) return;
    this.estimates.kvBandwidth.add(bytes / (movingMs / 1000));
    this.estimates.kvBytes.add(bytes);
    if (positions > 0) this.estimates.kvBytesPerToken.add(bytes / positions);
  }

  /**
   * Waits (ahead of new requests) for the blocks of a preempted stream of an admitted request,
   * then recomputes its KV from `tokens`. A failed recompute returns the blocks.
   */
  async recompute(stream: EngineStream, tokens: number[], signal?: AbortSignal): Promise<void> {
    const { engine } = this.ready();
    const reservation = await this.admission.readmit({ positions: tokens.length + 1, signal });
    try {
      await engine.recompute(stream, tokens, reservation);
    } finally {
      reservation.release();
    }
  }

  /** Records a finished prefill: its time, its tokens (the prompt's, and the `firsts` it generated), and what the engine's prefix cache (if on) gave. */
  notePrefill(promptTokens: number, cachedTokens: number, prefillMs: number, firsts: number): void {
    this.metrics.prefillMs.observe(prefillMs);
    this.metrics.promptTokens.inc(promptTokens);
    this.metrics.generationTokens.inc(firsts);
    this.estimates.prefill.add(promptTokens - cachedTokens, prefillMs);
    if (this.prefixCacheOn) {
      this.prefixQueried += promptTokens;
      this.prefixHit += cachedTokens;
    }
  }

  /** Counts a token a decode step generated. */
  readonly noteGenerated = (): void => this.metrics.generationTokens.inc();

  /** The loaded engine and transport, or null while loading or after a failed load. */
  get serving(): Serving | null {
    return this.state.kind === "ready" ? this.state : null;
  }

  /** Why the load failed, or null. */
  get loadError(): string | null {
    return this.state.kind === "failed" ? this.state.error : null;
  }

  /**
   * Throws 503 worker_draining while the worker drains (a gateway sends the request elsewhere),
   * and 429 (OverloadedError, Retry-After) when the waiting queue is full: a request past
   * AIRM_MAX_WAITING is refused at once, before it holds anything, instead of waiting with no end.
   */
  admit(route: string): void {
    if (this.draining) {
      this.metrics.requests.inc({ route, outcome: "draining" });
      throw new ApiError(503, "worker_draining", `this ${this.role} worker is draining (it was asked to stop) and admits no new request; send it to another worker`);
    }
    const waiting = this.admission.numWaiting + this.kvWaiting;
    if (waiting < this.maxWaiting) return;
    this.metrics.requests.inc({ route, outcome: "overloaded" });
    throw new OverloadedError(1, `this ${this.role} worker has ${waiting} requests waiting, its limit (AIRM_MAX_WAITING); retry in 1 s`);
  }

  /** Requests holding or waiting for a slot, or waiting for their KV. */
  inFlight(): number {
    return this.admission.numRunning + this.admission.numWaiting + this.kvWaiting;
  }

  /** True when no request is in flight and no KV lease is open. */
  idle(): boolean {
    return this.inFlight() === 0 && this.leases.counters().outstanding === 0;
  }

  /** Hands every request in flight back (their streams end with an error event worker_draining). */
  handBackAll(): void {
    if (this.handBack.signal.aborted) return;
    this.handBack.abort(
      new ApiError(
        503,
        "worker_draining",
        `this ${this.role} worker drained for its grace period (AIRM_DRAIN_S) and handed the request back; a gateway moves it to another worker`,
      ),
    );
  }

  /** The loaded engine and transport. Throws ApiError 503 (not_ready) while loading or after a failed load. */
  ready(): Serving {
    if (this.state.kind === "ready") return this.state;
    const why = this.state.kind === "failed" ? `engine failed to load: ${this.state.error}` : "the engine is still loading; retry when /health says ready";
    throw new ApiError(503, "not_ready", why);
  }

  /**
   * What the prefill and decode routes hand KV through: ready()'s, with the transport every
   * prefill and decode worker loads. Throws as ready() does, and 500 on a worker without one
   * (a solo worker, which serves neither route).
   */
  handoff(): HandoffServing {
    const s = this.ready();
    if (!s.transport) throw new ApiError(500, "no_kv_transport", `this ${this.role} worker has no KV transport to hand KV through`);
    return s as HandoffServing;
  }

  markReady(s: Omit<Serving, "batcher" | "grammar">): void {
    // A decode step takes as many streams as the widest compiled batch.
    const b = Math.max(1, ...s.engine.variants().map((v) => v.batch));
    this.admission.attach(s.engine);
    this.prefixCacheOn = s.engine.stats?.().prefixCache?.enabled === true;
    const batcher = new DecodeBatcher(s.engine, b, (n) => this.metrics.decodeBatch.observe(n));
    this.state = { kind: "ready", ...s, batcher, grammar: startGrammar(s.engine, this.grammarCache) };
  }

  /**
   * A matcher for a request's constraint that has accepted `replay`. Throws ApiError 400 when the
   * engine has no vocabulary for one, GrammarError for a bad spec (400) or a failure (500).
   */
  async matcher(spec: GrammarSpec, replay: number[]): Promise<GrammarMatcher> {
    return this.grammar().matcher(spec, replay, "constraint");
  }

  /** Resolves when a request's constraint builds into a grammar; throws as `matcher` does. */
  async checkConstraint(spec: GrammarSpec): Promise<void> {
    await this.grammar().check(spec, "constraint");
  }

  private grammar(): GrammarEngine {
    const g = this.ready().grammar;
    if (!g) throw new ApiError(400, "invalid_request", "this model's tokenizer gives no vocabulary for structured outputs", "constraint");
    return g;
  }

  markFailed(error: string): void {
    this.state = { kind: "failed", error };
  }

  /** Ends a request's lease (releases its blobs); a failed release is logged, never thrown. */
  /** Records a kv-hold answer that held `positions` prompt positions. */
  noteHold(positions: number): void {
    this.heldPositions += positions;
  }

  endLease(rid: string, reason: LeaseEnd): Promise<boolean> {
    this.holds.drop(rid);
    return this.leases.end(rid, reason, (err) => this.log.warn({ request_id: rid, err: (err as Error).message }, "KV release failed"));
  }
}

/**
 * The grammar engine of a loaded engine's vocabulary (its thread builds xgrammar's tokenizer info
 * in the background), or null when the tokenizer gives none. Stop ids: every end-of-sequence id.
 */
function startGrammar(engine: ServingEngine, cache: number): GrammarEngine | null {
  const vocab = engine.tokenizer.vocabulary?.();
  if (!vocab) return null;
  const stopIds = [...new Set([...engine.tokenizer.eosTokenIds, ...engine.model.eosTokenIds])];
  return GrammarEngine.start({ tokens: vocab.tokens, type: vocab.type, prependSpace: false, vocabSize: engine.model.vocabSize, stopIds }, { maxCompiled: cache });
}
