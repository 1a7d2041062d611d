// The engine's scheduler: one forward pass over the model at a time, each taking the decode steps
// that wait (up to the batch width) and, within the pass's token budget, a chunk of the oldest
// waiting prompt. Where streams decode, the chunk is sized from measured costs so that it adds
// at most `prefillShare` of a decode pass's time: a long prompt prefills beside running streams
// and they keep their pace. Alone, prompts run whole up to the budget (or several together when
// `packTokens` allows). Knows the model's pass, the policy and its cost estimates; streams,
// sampling and making room in the KV pool are the engine's (the `room` hook). A pass names at
// most `maxLoras` LoRA adapters (the model's limit): steps and prompts on another adapter wait
// for a later pass.

import { performance } from "node:perf_hooks";
import type { CpuKVCache, CpuLoraHandle, CpuModel } from "./cpu-model.ts";

/** A decode step waiting for a pass: one token into its cache; resolves with its logits. */
export interface DecodeWork {
  cache: CpuKVCache;
  token: number;
  /** The LoRA adapter the stream runs on; none: the base model. */
  lora?: CpuLoraHandle;
  resolve(logits: Float32Array): void;
  reject(e: unknown): void;
}

/** A prompt (or what is left of it) waiting for passes. */
export interface PrefillWork {
  /** The tokens still to compute, from cache.n on. */
  tokens: number[];
  cache: CpuKVCache;
  /** The LoRA adapter the prompt runs on; none: the base model. */
  lora?: CpuLoraHandle;
  /** Every position's logits (prompt log-probabilities), else the last one's only. */
  allLogits: boolean;
  /** Called for each layer once the last chunk has written it (the whole prompt's K/V of that layer is then final). */
  onLayer?(layer: number): void;
  /** Takes the KV blocks the next `count` tokens write; throws KVCacheFullError when the pool lacks them. */
  take(count: number): void;
  /** With allLogits: the rows collected over the chunks so far. */
  rows: Float32Array[];
  /** Accumulates the time of the passes this prompt was in (ms, pauses excluded). */
  timing: { computeMs: number };
  resolve(rows: Float32Array[]): void;
  reject(e: unknown): void;
}

export interface PassPolicy {
  /** Most decode steps in one pass (the widest compiled batch). */
  batch: number;
  /** Most tokens in one pass, decode steps included (vLLM's max_num_batched_tokens). */
  maxTokens: number;
  /** Tokens per chunk when prompts always prefill in fixed chunks (the rngd-chunk backend); else unset. */
  chunkSize?: number;
  /** Where streams decode, a chunk beside them costs at most this share of their pass's time. */
  prefillShare: number;
  /** Without decodes, whole prompts waiting together share a pass up to this many tokens (0: one prompt per pass). */
  packTokens: number;
  /** Most distinct LoRA adapters in one pass (the model's maxLoras); unset: no limit. */
  maxLoras?: number;
}

/** Chunk size beside decodes before any cost was measured. */
const FIRST_CHUNK = 16;
/**
 * Beside decodes, chunks are whole tiles of this many prompt tokens (but for a prompt's last
 * tokens): the attention kernel runs four consecutive tokens of a head together, so a token alone
 * costs about twice its share of a tile. A pass whose share buys less waits for a later one.
 */
const TILE = 4;
/**
 * While a prompt chunks beside decodes, every this-many-th pass is decodes alone: it measures
 * the decode pass again (its cost grows with the streams' context), so a chunk's share is
 * computed against what the streams cost now, not when the prompt came.
 */
const REMEASURE_EVERY = 8;
/**
 * Turns of the event loop a pass that would take a prompt chunk waits, at most, for the steps of
 * the streams decoding here (a turn costs microseconds when nothing else is to be done).
 */
const GATHER_TURNS = 32;

interface Chunk {
  work: PrefillWork;
  count: number;
  last: boolean;
}

/** Exponentially weighted mean (alpha 0.3); NaN until the first sample. */
class Mean {
  value = Number.NaN;
  add(x: number): void {
    if (!Number.isFinite(x) || x < 0) return;
    this.value = Number.isNaN(this.value) ? x : 0.7 * this.value + 0.3 * x;
  }
}

export class PassLoop {
  private readonly decodes: DecodeWork[] = [];
  private readonly prefills: PrefillWork[] = [];
  private scheduled = false;
  private running: Promise<void> | null = null;
  /** Passes with decodes and a chunk since the last pass of decodes alone. */
  private mixedSinceDecodeOnly = 0;
  /** ms of a pass of decode steps alone. */
  readonly decodePassMs = new Mean();
  /** ms per prompt token in a pass. */
  readonly prefillTokenMs = new Mean();
  /** Beside decodes: ms of prompt work the streams' passes have granted (their share) and chunks have not spent yet. */
  private credit = 0;
  /** Passes run (those with prompt chunks, those with decode steps too), the chunks, finished prompts and decode steps they carried. */
  readonly counts = { passes: 0, prefillPasses: 0, mixed: 0, chunks: 0, prompts: 0, decodeSteps: 0 };

  constructor(
    private readonly model: () => CpuModel,
    private readonly policy: PassPolicy,
    /**
     * Makes the KV pool hold what the decode steps write (the engine evicts kept prefixes, then
     * preempts streams); returns the steps that stay in the pass (a preempted one is settled by
     * the engine).
     */
    private readonly room: (steps: DecodeWork[]) => DecodeWork[],
    /** Streams that decode on this engine now (queued for a pass or not): while any does, chunks keep to their share. */
    private readonly decoding: () => number = () => 0,
  ) {}

  /** Queues decode steps for the next pass. */
  decode(steps: DecodeWork[]): void {
    this.decodes.push(...steps);
    this.schedule();
  }

  /** Queues a prompt; `first`: ahead of the others (a preempted stream's recompute). */
  prefill(work: PrefillWork, first = false): void {
    if (first) this.prefills.unshift(work);
    else this.prefills.push(work);
    this.schedule();
  }

  /** Settles when no pass runs or waits. */
  async idle(): Promise<void> {
    while (this.running || this.scheduled) await (this.running ?? new Promise<void>((r) => setImmediate(r)));
  }

  /** Prompts waiting or in progress. */
  get waitingPrompts(): number {
    return this.prefills.length;
  }

  private schedule(): void {
    if (this.scheduled || this.running) return;
    this.scheduled = true;
    // A turn of the event loop first: streams whose step just resolved queue their next one, and
    // they all go into one pass.
    setImmediate(() => {
      this.scheduled = false;
      this.running = this.runPasses().finally(() => {
        this.running = null;
        if (this.decodes.length || this.prefills.length) this.schedule();
      });
    });
  }

  private async runPasses(): Promise<void> {
    if (this.decodes.length === 0 && this.prefills.length === 0) return;
    if (this.prefills.length > 0) await this.gatherSteps();
    const adapters = new Set<CpuLoraHandle>();
    const decodes = this.room(this.takeDecodes(adapters));
    const remeasure = decodes.length > 0 && this.mixedSinceDecodeOnly >= REMEASURE_EVERY;
    const chunks = remeasure ? [] : this.takeChunks(decodes.length, adapters);
    this.mixedSinceDecodeOnly = decodes.length > 0 && chunks.length > 0 ? this.mixedSinceDecodeOnly + 1 : 0;
    if (decodes.length === 0 && chunks.length === 0) return;
    await this.runPass(decodes, chunks);
  }

  /**
   * A stream that the last pass resolved queues its next step only after its token went out (a
   * few turns of the event loop); a pass that took a prompt chunk without it would cost it a
   * whole pass. So before such a pass the streams decoding here get a moment to queue.
   */
  private async gatherSteps(): Promise<void> {
    for (let turn = 0; turn < GATHER_TURNS && this.decodes.length < Math.min(this.policy.batch, this.decoding()); turn++) {
      await new Promise<void>((r) => setImmediate(r));
    }
  }

  /** Whether work on `lora` may join a pass whose work names `adapters` (and adds it to them when so). */
  private fits(lora: CpuLoraHandle | undefined, adapters: Set<CpuLoraHandle>): boolean {
    if (lora === undefined || adapters.has(lora)) return true;
    if (adapters.size >= (this.policy.maxLoras ?? Number.POSITIVE_INFINITY)) return false;
    adapters.add(lora);
    return true;
  }

  /**
   * The decode steps of the next pass: the oldest ones, up to the batch width, that keep the
   * pass within maxLoras adapters (`adapters` collects them); the others stay queued, in order.
   */
  private takeDecodes(adapters: Set<CpuLoraHandle>): DecodeWork[] {
    const taken: DecodeWork[] = [];
    const left: DecodeWork[] = [];
    for (const d of this.decodes) (taken.length < this.policy.batch && this.fits(d.lora, adapters) ? taken : left).push(d);
    this.decodes.splice(0, this.decodes.length, ...left);
    return taken;
  }

  /**
   * The prompt chunks of the next pass, their blocks taken (a prompt whose blocks cannot be had
   * fails alone); a prompt on an adapter past the pass's maxLoras waits (and the ones behind it).
   */
  private takeChunks(decodeSteps: number, adapters: Set<CpuLoraHandle>): Chunk[] {
    const out: Chunk[] = [];
    const sharing = decodeSteps > 0 && !this.policy.chunkSize;
    if (!sharing || this.prefills.length === 0) this.credit = 0;
    const first = sharing ? this.sharedBudget(decodeSteps) : this.chunkBudget(decodeSteps);
    // Without decodes, whole prompts that wait may join the first one, up to packTokens in all.
    const pack = decodeSteps === 0 && this.decoding() === 0 && !this.policy.chunkSize ? this.policy.packTokens : 0;
    let used = 0;
    for (let i = 0; i < this.prefills.length; ) {
      const work = this.prefills[i];
      let count: number;
      if (out.length === 0) {
        count = Math.min(work.tokens.length, first);
        if (sharing && count < work.tokens.length) count -= count % TILE;
      } else if (work.tokens.length <= pack - used) count = work.tokens.length;
      else break;
      if (count <= 0 || !this.fits(work.lora, adapters)) break;
      try {
        work.take(count);
      } catch (e) {
        this.prefills.splice(i, 1);
        work.reject(e);
        continue;
      }
      out.push({ work, count, last: count === work.tokens.length });
      if (sharing && Number.isFinite(this.prefillTokenMs.value)) this.credit = Math.max(0, this.credit - count * this.prefillTokenMs.value);
      used += count;
      i++;
      if (pack === 0) break;
    }
    return out;
  }

  /**
   * Prompt tokens the next pass may take beside `decodeSteps` decode steps. While streams decode
   * here (their next steps may not be queued yet), a chunk keeps to its share of their pace.
   */
  private chunkBudget(decodeSteps: number): number {
    const p = this.policy;
    const room = p.maxTokens - decodeSteps;
    if (room <= 0) return 0;
    if (decodeSteps === 0 && this.decoding() === 0) return Math.min(room, p.chunkSize ?? room);
    const d = this.decodePassMs.value;
    const t = this.prefillTokenMs.value;
    const share = Number.isNaN(d) || Number.isNaN(t) || t <= 0 ? FIRST_CHUNK : Math.floor((p.prefillShare * d) / t);
    return Math.max(1, Math.min(room, p.chunkSize ?? room, share));
  }

  /**
   * Prompt tokens the next pass may take beside `decodeSteps` queued decode steps: each such pass
   * grants the prompt `prefillShare` of a decode pass's time (at least one prompt token's), and a
   * chunk spends what was granted in whole tiles, so a share worth less than a tile runs a tile
   * every few passes.
   */
  private sharedBudget(decodeSteps: number): number {
    const p = this.policy;
    const room = p.maxTokens - decodeSteps;
    const d = this.decodePassMs.value;
    const t = this.prefillTokenMs.value;
    if (room <= 0) return 0;
    if (Number.isNaN(d) || Number.isNaN(t) || t <= 0) return Math.min(room, FIRST_CHUNK);
    // at least a token's worth per pass, as a chunk of one token per pass took before tiles
    const grant = Math.max(p.prefillShare * d, t);
    this.credit = Math.min(this.credit + grant, grant + TILE * t);
    return Math.min(room, Math.floor(this.credit / t));
  }

  private async runPass(decodes: DecodeWork[], chunks: Chunk[]): Promise<void> {
    const items = [
      ...decodes.map((d) => ({ tokens: [d.token], cache: d.cache, lora: d.lora, logits: "last" as const })),
      ...chunks.map((c) => ({
        tokens: c.work.tokens.slice(0, c.count),
        cache: c.work.cache,
        lora: c.work.lora,
        logits: c.work.allLogits ? ("all" as const) : c.last ? ("last" as const) : ("none" as const),
      })),
    ];
    const model = this.model();
    const prompts = chunks.reduce((a, c) => a + c.count, 0);
    const onLayer = (l: number): void => {
      for (const c of chunks) if (c.last) c.work.onLayer?.(l);
    };
    let computeMs = 0;
    let rows: Float32Array[][];
    try {
      if (chunks.length === 0) {
        const t0 = performance.now();
        rows = model.pass(items);
        computeMs = performance.now() - t0;
        this.decodePassMs.add(computeMs);
      } else {
        let resumed = performance.now();
        const pause = async (): Promise<void> => {
          computeMs += performance.now() - resumed;
          await new Promise<void>((r) => setImmediate(r));
          resumed = performance.now();
        };
        rows = await model.passAsync(items, { onLayer, pause });
        computeMs += performance.now() - resumed;
        const decodeShare = decodes.length > 0 ? (Number.isNaN(this.decodePassMs.value) ? 0 : this.decodePassMs.value) : 0;
        this.prefillTokenMs.add(Math.max(0, computeMs - decodeShare) / prompts);
      }
    } catch (e) {
      for (const d of decodes) d.reject(e);
      for (const c of chunks) {
        this.prefills.splice(this.prefills.indexOf(c.work), 1);
        c.work.reject(e);
      }
      return;
    }
    this.counts.passes++;
    this.counts.decodeSteps += decodes.length;
    this.counts.chunks += chunks.length;
    if (chunks.length) this.counts.prefillPasses++;
    if (decodes.length && chunks.length) this.counts.mixed++;
    decodes.forEach((d, i) => {
      d.resolve(rows[i][0]);
    });
    for (const [i, c] of chunks.entries()) {
      const w = c.work;
      w.timing.computeMs += computeMs;
      w.tokens = w.tokens.slice(c.count);
      if (w.allLogits) w.rows.push(...rows[decodes.length + i]);
      if (!c.last) continue;
      this.prefills.splice(this.prefills.indexOf(w), 1);
      this.counts.prompts++;
      w.resolve(w.allLogits ? w.rows : rows[decodes.length + i]);
    }
  }
}
