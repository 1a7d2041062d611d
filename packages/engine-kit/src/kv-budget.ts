// How big an engine's paged KV cache is: the budget (`--kv-cache-memory`: bytes, or a share of
// the memory the process can still have once the weights are in), turned into blocks and capped
// by what the wasm memory can hold; and the context buckets an NPU would compile up to
// max_model_len. Knows numbers; the engine applies them.

import { ConfigError } from "@airm/rm-core";

/** The KV cache budget: bytes, or a share (0, 1] of the memory available after loading the weights. */
export type KvCacheMemory = { bytes: number } | { share: number };

/**
 * The default budget: a quarter of the memory this process can still have (MemAvailable, or the
 * cgroup limit) once the weights are loaded. The pool's memory is only touched as blocks are used,
 * so an idle worker holds none of it; the share bounds what a full one takes, leaving the rest to
 * the other parts of a cluster on the same machine (airm up runs three workers and a gateway).
 */
export const DEFAULT_KV_SHARE = 0.25;

const UNITS: Record<string, number> = { "": 1, k: 2 ** 10, kb: 2 ** 10, kib: 2 ** 10, m: 2 ** 20, mb: 2 ** 20, mib: 2 ** 20, g: 2 ** 30, gb: 2 ** 30, gib: 2 ** 30 };

/**
 * Parses `--kv-cache-memory`: a share in (0, 1] (`0.25`), or bytes (`189000000`, `512M`, `2GiB`;
 * K/M/G are powers of 1024). Throws ConfigError naming the value.
 */
export function parseKvCacheMemory(text: string, key = "kv-cache-memory"): KvCacheMemory {
  const m = /^\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*$/.exec(text);
  const unit = m ? UNITS[m[2].toLowerCase()] : undefined;
  if (!m || unit === undefined) throw new ConfigError(key, `"${text}" is neither a share of memory in (0, 1] (e.g. 0.25) nor bytes (e.g. 512M, 2G)`);
  const value = Number(m[1]);
  if (m[2] === "" && value > 0 && value <= 1) return { share: value };
  const bytes = Math.floor(value * unit);
  if (!(bytes >= 1)) throw new ConfigError(key, `"${text}" is not a positive amount`);
  return { bytes };
}

/** Shows a budget as the flag takes it. */
export function showKvCacheMemory(m: KvCacheMemory): string {
  return "share" in m ? String(m.share) : String(m.bytes);
}

/**
 * Blocks of `blockBytes` the budget buys: `available` bytes (what the process can still have) for
 * a share, capped by `room` (what the wasm memory can still take). Returns the blocks and a line
 * saying how they were sized.
 */
export function kvBudgetBlocks(o: { memory: KvCacheMemory; blockBytes: number; available: number; room: number }): { blocks: number; bytes: number; how: string } {
  const asked = "share" in o.memory ? Math.floor(o.memory.share * o.available) : o.memory.bytes;
  const how = "share" in o.memory ? `${o.memory.share} of ${gib(o.available)} available` : `${gib(asked)} asked`;
  const bytes = Math.min(asked, o.room);
  const blocks = Math.floor(bytes / o.blockBytes);
  return { blocks, bytes: blocks * o.blockBytes, how: bytes < asked ? `${how}, capped by the wasm memory's ${gib(o.room)} left` : how };
}

function gib(bytes: number): string {
  return bytes >= 2 ** 30 ? `${(bytes / 2 ** 30).toFixed(2)} GiB` : `${(bytes / 2 ** 20).toFixed(1)} MiB`;
}

/** The smallest context bucket an NPU compiles. */
const FIRST_BUCKET = 512;

/**
 * The context lengths an NPU would compile graphs for, up to max_model_len: powers of two from
 * 512, then max_model_len itself (just [max_model_len] when it is 512 or less).
 */
export function contextBuckets(maxModelLen: number): number[] {
  const out: number[] = [];
  for (let s = FIRST_BUCKET; s < maxModelLen; s *= 2) out.push(s);
  out.push(maxModelLen);
  return out;
}
