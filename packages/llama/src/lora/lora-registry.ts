// The LoRA adapters a model knows by name, and which of them are resident in the kernels' memory:
// at most `maxLoras` at a time. An adapter that does not fit waits on disk and is read again
// (its fingerprint checked) when a pass needs it, in place of the least recently used one that no
// running pass holds. Knows files through read-adapter.ts and memory through the runtime.
import { ConfigError } from "@airm/rm-core";
import type { ModelConfig } from "../checkpoint-types.ts";
import type { KernelRuntime } from "../kernels/kernel-runtime.ts";
import { LoraError } from "./lora-error.ts";
import type { LoraProjection } from "./projections.ts";
import { type LoraAdapterData, readLoraAdapter } from "./read-adapter.ts";
import { paddedRank, placeAdapter, type ResidentLora } from "./resident-lora.ts";

/** Adapters resident at once by default. */
export const DEFAULT_MAX_LORAS = 4;
/** The largest adapter rank accepted by default. */
export const DEFAULT_MAX_LORA_RANK = 64;

export interface LoraOptions {
  /** Adapters resident in memory at once (default DEFAULT_MAX_LORAS); the others are read again from their folders when used. */
  maxLoras?: number;
  /** The largest rank `r` an adapter may have (default DEFAULT_MAX_LORA_RANK). */
  maxLoraRank?: number;
}

export interface LoadLoraOptions {
  /**
   * The names the base model goes by, for `base_model_name_or_path` (it must equal one or end in
   * the same last path segment). Default: the checkpoint's path and id. Empty: not checked.
   */
  baseModelNames?: string[];
}

/** A loaded adapter: what a pass item names to run on it. Valid until `unloadLora`. */
export interface LoraHandle {
  readonly name: string;
  /** Where it was read from: a PEFT folder or a llama.cpp GGUF LoRA file. */
  readonly folder: string;
  readonly rank: number;
  readonly alpha: number;
  readonly useRslora: boolean;
  /** The factor of the update: alpha / r (alpha / sqrt(r) with rsLoRA), as f32. */
  readonly scale: number;
  /** The projections it adapts in at least one layer. */
  readonly targets: readonly LoraProjection[];
  /** The layers it adapts. */
  readonly layers: readonly number[];
  readonly baseModel: string | null;
  /** sha-256 hex of its arithmetic (rank, scale, A and B of every module): equal fingerprints give equal bits. */
  readonly fingerprint: string;
}

interface Entry {
  handle: LoraHandle;
  resident: ResidentLora | undefined;
  /** The registry's use counter when a pass last took it (for LRU eviction). */
  lastUsed: number;
  /** Passes running on it now. */
  pins: number;
  /** Unloaded while a pass held it: freed when the last one lets go. */
  unloading: boolean;
}

/** The handle's public description of an adapter read from its folder. */
function handleOf(name: string, data: LoraAdapterData): LoraHandle {
  const c = data.config;
  return Object.freeze({
    name,
    folder: data.folder,
    rank: c.r,
    alpha: c.alpha,
    useRslora: c.useRslora,
    scale: c.scale,
    targets: Object.freeze([...new Set(data.modules.map((m) => m.proj))]),
    layers: Object.freeze([...new Set(data.modules.map((m) => m.layer))].sort((a, b) => a - b)),
    baseModel: c.baseModel,
    fingerprint: data.fingerprint,
  });
}

function checkedLimit(v: number | undefined, key: string, fallback: number): number {
  const n = v ?? fallback;
  if (!Number.isInteger(n) || n < 1) throw new ConfigError(key, `must be a positive integer, got ${String(v)}`);
  return n;
}

/** The LoRA limits of `opts` with their defaults; ConfigError naming `maxLoras` / `maxLoraRank` for a value that is not a positive integer. */
export function loraLimits(opts: LoraOptions = {}): { maxLoras: number; maxLoraRank: number } {
  return { maxLoras: checkedLimit(opts.maxLoras, "maxLoras", DEFAULT_MAX_LORAS), maxLoraRank: checkedLimit(opts.maxLoraRank, "maxLoraRank", DEFAULT_MAX_LORA_RANK) };
}

/** The adapters of one model. Not safe for concurrent use (nor is the model). */
export class LoraRegistry {
  readonly maxLoras: number;
  readonly maxLoraRank: number;
  private readonly entries = new Map<LoraHandle, Entry>();
  private readonly byName = new Map<string, LoraHandle>();
  private readonly baseNames: string[];
  private clock = 0;
  /** The kernels' scratch u (four tokens' paddedRank(maxLoraRank) f32). */
  private scratch = 0;

  constructor(
    private readonly rt: KernelRuntime,
    private readonly model: ModelConfig,
    base: { path: string; id: string },
    opts: LoraOptions = {},
  ) {
    ({ maxLoras: this.maxLoras, maxLoraRank: this.maxLoraRank } = loraLimits(opts));
    this.baseNames = [base.path, base.id];
  }

  /** The scratch the update kernel needs (one adapter rank wide), allocated with the first adapter. */
  get kernelScratch(): number {
    return this.scratch;
  }

  /**
   * Reads the adapter in `folder` (a PEFT folder or a llama.cpp GGUF LoRA file) under `name` and makes it resident when a slot is free or can be
   * freed (the least recently used adapter no pass holds goes back to disk); otherwise it is read
   * again when a pass uses it. Throws LoraError for an adapter this model cannot run (naming the
   * key or tensor), ConfigError for a name already in use.
   */
  load(name: string, folder: string, opts: LoadLoraOptions = {}): LoraHandle {
    if (typeof name !== "string" || name === "") throw new ConfigError("name", "a LoRA adapter needs a non-empty name");
    if (this.byName.has(name)) throw new ConfigError("name", `a LoRA adapter named ${JSON.stringify(name)} is already loaded; unload it first`);
    const data = readLoraAdapter(folder, this.model, { maxRank: this.maxLoraRank, baseModelNames: opts.baseModelNames ?? this.baseNames });
    if (this.scratch === 0) this.scratch = this.rt.alloc(4 * paddedRank(this.maxLoraRank) * 4);
    const handle = handleOf(name, data);
    const entry: Entry = { handle, resident: undefined, lastUsed: ++this.clock, pins: 0, unloading: false };
    this.entries.set(handle, entry);
    this.byName.set(name, handle);
    if (this.makeRoom(1, new Set())) entry.resident = placeAdapter(this.rt, this.model, data.config.r, data.config.scale, data.modules);
    return handle;
  }

  /** Forgets an adapter and frees its memory (once no running pass holds it). Its handle is invalid afterwards. */
  unload(handle: LoraHandle | string): void {
    const entry = this.entryOf(typeof handle === "string" ? this.byName.get(handle) : handle, typeof handle === "string" ? handle : handle.name);
    this.byName.delete(entry.handle.name);
    entry.unloading = true;
    if (entry.pins === 0) this.drop(entry);
  }

  /** The adapter loaded under `name`, if any. */
  get(name: string): LoraHandle | undefined {
    return this.byName.get(name);
  }

  /** Every loaded adapter, in load order. */
  list(): LoraHandle[] {
    return [...this.byName.values()];
  }

  /** Whether the adapter's matrices are in memory now. */
  isResident(handle: LoraHandle): boolean {
    return this.entryOf(handle, handle.name).resident !== undefined;
  }

  /**
   * For a pass whose token t runs on `perToken[t]`: makes every adapter it names resident
   * (reading evicted ones again), holds them until `release`, and returns each token's resident
   * adapter. Throws ConfigError naming maxLoras when the pass names more adapters than may be
   * resident, and for a handle this registry does not hold.
   */
  acquire(perToken: readonly (LoraHandle | undefined)[]): (ResidentLora | undefined)[] {
    const used = new Set(perToken.filter((h): h is LoraHandle => h !== undefined));
    const entries = [...used].map((h) => this.entryOf(h, h.name));
    if (entries.length > this.maxLoras) {
      throw new ConfigError("maxLoras", `this pass uses ${entries.length} LoRA adapters; at most ${this.maxLoras} can be resident at once`);
    }
    for (const e of entries) if (e.resident === undefined) this.reload(e, used);
    for (const e of entries) {
      e.pins++;
      e.lastUsed = ++this.clock;
    }
    return perToken.map((h) => (h === undefined ? undefined : this.entries.get(h)!.resident));
  }

  /** Lets go of the adapters a pass held (`perToken` as given to acquire). */
  release(perToken: readonly (LoraHandle | undefined)[]): void {
    for (const h of new Set(perToken)) {
      const e = h === undefined ? undefined : this.entries.get(h);
      if (!e) continue;
      e.pins--;
      if (e.pins === 0 && e.unloading) this.drop(e);
    }
  }

  private entryOf(handle: LoraHandle | undefined, name: string): Entry {
    const e = handle === undefined ? undefined : this.entries.get(handle);
    if (!e || e.unloading) throw new ConfigError("lora", `no LoRA adapter ${JSON.stringify(name)} is loaded in this model (unloaded, or loaded into another model)`);
    return e;
  }

  /** Reads an evicted adapter again into memory; its files must still compute what they did at load. */
  private reload(e: Entry, keep: Set<LoraHandle>): void {
    const data = readLoraAdapter(e.handle.folder, this.model, { maxRank: this.maxLoraRank, baseModelNames: [] });
    if (data.fingerprint !== e.handle.fingerprint) {
      throw new LoraError(e.handle.folder, `LoRA adapter ${JSON.stringify(e.handle.name)} changed on disk since it was loaded; unload and load it again`);
    }
    if (!this.makeRoom(1, keep))
      throw new ConfigError("maxLoras", `no resident LoRA adapter can make room for ${JSON.stringify(e.handle.name)}: running passes hold all ${this.maxLoras}`);
    e.resident = placeAdapter(this.rt, this.model, data.config.r, data.config.scale, data.modules);
  }

  /** Evicts least recently used adapters (none held by a pass, none in `keep`) until `n` slots are free; false when it cannot. */
  private makeRoom(n: number, keep: Set<LoraHandle>): boolean {
    const resident = () => [...this.entries.values()].filter((e) => e.resident !== undefined);
    while (resident().length + n > this.maxLoras) {
      const victim = resident()
        .filter((e) => e.pins === 0 && !keep.has(e.handle))
        .sort((a, b) => a.lastUsed - b.lastUsed)[0];
      if (!victim) return false;
      this.evict(victim);
    }
    return true;
  }

  private evict(e: Entry): void {
    if (e.resident) this.rt.free(e.resident.ptr, e.resident.bytes);
    e.resident = undefined;
  }

  private drop(e: Entry): void {
    this.evict(e);
    this.entries.delete(e.handle);
  }
}
