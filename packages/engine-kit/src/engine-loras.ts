// The LoRA adapters an engine serves (vLLM's --enable-lora): the names requests use, each
// adapter's handle in the CPU model, and how many streams (and prompts in flight) run on each.
// Unloading a name takes it from new requests at once; the model forgets the adapter only when
// the last stream on it ends (the model refuses an unloaded handle at the next pass, and a stream
// takes a pass per token). Also the one place a request's cache_salt and its adapter make the
// prefix cache's salt. Knows the model's adapter calls; nothing of streams or blocks.

import { ConfigError, UnknownLoraError, isAirmError, prefixSalt } from "@airm/rm-core";
import type { EngineLoras, LoraInfo, LoraServingOptions } from "@airm/rm-core";
import type { CpuCheckpoint, CpuLoraHandle, CpuModel } from "./cpu-model.ts";

/**
 * The salt a request's KV blocks are kept and found under: its cache_salt and the fingerprint of
 * the adapter it runs on (rm-core's prefixSalt, as workers and routers salt). KV computed with an
 * adapter is wrong for the base model and for every other adapter, so each keeps its own chains
 * (and block hashes, in events too); equal fingerprints give equal bits, so they share.
 */
export function saltFor(cacheSalt: string | undefined, lora: CpuLoraHandle | undefined): string {
  return prefixSalt(cacheSalt, lora?.fingerprint);
}

/** The model's LoRA load options for serving options (the model checks them: ConfigError naming maxLoras / maxLoraRank). */
export function modelLoraOptions(o: LoraServingOptions): { maxLoras?: number; maxLoraRank?: number } {
  return { maxLoras: o.maxLoras, maxLoraRank: o.maxLoraRank };
}

/**
 * Bytes of the wasm memory the resident adapters may take at most: `maxLoras` adapters of rank
 * `maxLoraRank` on all seven projections of every layer (A [r][in] and B [out][r padded to 4] in
 * f32, each 64-byte aligned), plus the update kernel's scratch. Kept out of the KV cache's room,
 * as vLLM sets aside its LoRA buffers before sizing the cache.
 */
export function loraReserveBytes(c: CpuCheckpoint["config"], limits: { maxLoras: number; maxLoraRank: number }): number {
  const r = limits.maxLoraRank;
  const rp = (r + 3) & ~3;
  const q = c.numHeads * c.headDim;
  const kv = c.numKvHeads * c.headDim;
  const h = c.hiddenSize;
  const I = c.intermediateSize;
  const shapes: [number, number][] = [
    [h, q],
    [h, kv],
    [h, kv],
    [q, h],
    [h, I],
    [h, I],
    [I, h],
  ];
  const aligned = (bytes: number) => Math.ceil(bytes / 64) * 64;
  const perLayer = shapes.reduce((a, [inputs, outputs]) => a + aligned(r * inputs * 4) + aligned(outputs * rp * 4), 0);
  return limits.maxLoras * perLayer * c.numLayers + aligned(rp * 4);
}

/** The ConfigError for an adapter the model refused (LoraError: naming its key or tensor), with the adapter's name in the message. */
function adapterError(name: string, e: unknown): unknown {
  if (!isAirmError(e, "CONFIG")) return e;
  const at = e as { field?: string; tensor?: string; key?: string };
  return new ConfigError(at.field ?? at.tensor ?? at.key ?? "lora_path", `LoRA adapter ${JSON.stringify(name)}: ${e.message}`);
}

/** An engine's adapters by name, over the model's LoRA registry. Not safe for concurrent use (nor is the engine). */
export class EngineLoraSet implements EngineLoras {
  /** The adapters requests may name. */
  private readonly byName = new Map<string, CpuLoraHandle>();
  /** Streams and prompts in flight on each adapter (unloaded ones included, until their last ends). */
  private readonly users = new Map<CpuLoraHandle, number>();
  /** Unloaded by name while streams ran on them: the model forgets them when the last one ends. */
  private readonly retired = new Set<CpuLoraHandle>();

  private constructor(private model: CpuModel) {}

  /** The set over `model` with `modules` loaded (a bad one throws ConfigError naming it). */
  static open(model: CpuModel, modules: LoraServingOptions["modules"] = []): EngineLoraSet {
    const set = new EngineLoraSet(model);
    for (const m of modules) set.add(m?.name, m?.path);
    return set;
  }

  get maxLoras(): number {
    return this.model.loraLimits.maxLoras;
  }

  get maxLoraRank(): number {
    return this.model.loraLimits.maxLoraRank;
  }

  async load(name: string, path: string): Promise<LoraInfo> {
    const h = this.add(name, path);
    return this.info(name, h);
  }

  /**
   * Loads the PEFT folder `path` as `name`. ConfigError `lora_name` for a name in use (or empty),
   * `lora_path` for no path; the model's refusal as a ConfigError naming the key or tensor.
   */
  add(name: string, path: string): CpuLoraHandle {
    if (typeof name !== "string" || name === "") throw new ConfigError("lora_name", "a LoRA adapter needs a non-empty name");
    if (typeof path !== "string" || path === "")
      throw new ConfigError("lora_path", `LoRA adapter ${JSON.stringify(name)} needs the path of its PEFT folder or llama.cpp GGUF LoRA file`);
    if (this.byName.has(name)) throw new ConfigError("lora_name", `a LoRA adapter named ${JSON.stringify(name)} is already loaded; unload it first`);
    let h: CpuLoraHandle;
    try {
      h = this.model.loadLora(this.freeModelName(name), path);
    } catch (e) {
      throw adapterError(name, e);
    }
    this.byName.set(name, h);
    return h;
  }

  /** `name`, or (while the model still holds an unloaded adapter of that name for its streams) `name#k`. */
  private freeModelName(name: string): string {
    let k = 0;
    let inModel = name;
    while (this.model.getLora(inModel)) inModel = `${name}#${++k}`;
    return inModel;
  }

  unload(name: string): boolean {
    const h = this.byName.get(name);
    if (!h) return false;
    this.byName.delete(name);
    if (this.users.has(h)) this.retired.add(h);
    else this.model.unloadLora(h);
    return true;
  }

  list(): LoraInfo[] {
    return [...this.byName].map(([name, h]) => this.info(name, h));
  }

  private info(name: string, h: CpuLoraHandle): LoraInfo {
    return { name, path: h.folder, rank: h.rank, fingerprint: h.fingerprint, resident: this.model.loraResident(h) };
  }

  /** The adapter loaded as `name` (undefined for none); UnknownLoraError when no adapter has that name. */
  resolve(name: string | undefined): CpuLoraHandle | undefined {
    if (name === undefined) return undefined;
    const h = typeof name === "string" ? this.byName.get(name) : undefined;
    if (!h) throw new UnknownLoraError(String(name), [...this.byName.keys()]);
    return h;
  }

  /** Counts one more stream (or prompt in flight) on `h`; none for the base model. */
  hold(h: CpuLoraHandle | undefined): void {
    if (h) this.users.set(h, (this.users.get(h) ?? 0) + 1);
  }

  /** Counts one stream fewer on `h`; an adapter unloaded meanwhile leaves the model with its last one. */
  release(h: CpuLoraHandle | undefined): void {
    if (!h) return;
    const n = (this.users.get(h) ?? 0) - 1;
    if (n > 0) {
      this.users.set(h, n);
      return;
    }
    this.users.delete(h);
    if (this.retired.delete(h)) this.model.unloadLora(h);
  }

  /**
   * Loads every adapter into `next` (the model a full reload made) under the same names, for
   * `adopt`; throws as `add` (an adapter whose shapes the new model does not have, say). Their
   * base_model_name_or_path was checked at their load: the delta's checkpoint folder may have
   * another name. The caller closes `next` on failure.
   */
  loadInto(next: CpuModel): Map<string, CpuLoraHandle> {
    const out = new Map<string, CpuLoraHandle>();
    for (const [name, h] of this.byName) {
      try {
        out.set(name, next.loadLora(name, h.folder, { baseModelNames: [] }));
      } catch (e) {
        throw adapterError(name, e);
      }
    }
    return out;
  }

  /** Switches to `next` with the handles loadInto gave; adapters unloaded in the old model go with it. */
  adopt(next: CpuModel, handles: Map<string, CpuLoraHandle>): void {
    this.model = next;
    this.byName.clear();
    for (const [name, h] of handles) this.byName.set(name, h);
    this.retired.clear();
  }
}
