// Block hashes: the name of a full KV block, the same on every worker, process and host. A block's
// hash is SHA-256 over its parent's hash and its token ids, so it names the whole prefix up to and
// including the block; the chain starts from a root that holds what else makes KV differ (the model
// and numerics fingerprints, the block size, and a request's cache_salt). No process-random seed:
// a prefill worker, a decode worker and a router that hash the same prompt get the same names.
//
// root  = SHA-256("rngd-pd/block-hash/v1" 0x00 model 0x00 numerics 0x00 blockSize 0x00 salt)
// h[i]  = SHA-256(h[i-1] (32 bytes, root for i = 0) || token ids of block i as u32 little-endian)
//
// Hashes travel as lowercase hex. `blockHashId` gives the low 64 bits (the last 8 bytes, big-endian,
// unsigned): the integer vLLM's KV events carry a block hash as (VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES,
// on by default), and what llm-d's decoder makes of a bytes hash too.

import { createHash } from "node:crypto";

export interface BlockHashRoot {
  modelFingerprint: string;
  numericsFingerprint: string;
  blockSize: number;
}

/** The chain's root for one model, numerics and block size, and a tenant's cache_salt (none: ""). */
export function blockHashRoot(r: BlockHashRoot, cacheSalt = ""): string {
  return createHash("sha256").update(`rngd-pd/block-hash/v1\0${r.modelFingerprint}\0${r.numericsFingerprint}\0${r.blockSize}\0${cacheSalt}`, "utf8").digest("hex");
}

/**
 * The salt a request's blocks are kept and named under: its cache_salt, and the fingerprint of
 * the LoRA adapter it runs on (KV computed with an adapter is another adapter's or the base
 * model's wrong KV, so each keeps its own blocks). Engines, workers and routers all salt with this.
 */
export function prefixSalt(cacheSalt: string | undefined, loraFingerprint?: string): string {
  return loraFingerprint ? `${cacheSalt ?? ""}\0lora:${loraFingerprint}` : (cacheSalt ?? "");
}

/**
 * The hashes of the first `blocks` full blocks of `tokens` (default: every full block), each
 * chained from `root` (blockHashRoot). `from`/`parent` continue a chain: the hashes of blocks
 * [from, blocks) given the hash of block from - 1 (root when from is 0).
 */
export function blockHashes(root: string, tokens: readonly number[], blockSize: number, blocks = Math.floor(tokens.length / blockSize), from = 0, parent = root): string[] {
  if (blocks * blockSize > tokens.length) throw new RangeError(`${blocks} blocks of ${blockSize} need ${blocks * blockSize} tokens, got ${tokens.length}`);
  const out: string[] = [];
  const ids = Buffer.alloc(4 * blockSize);
  let prev = Buffer.from(parent, "hex");
  for (let b = from; b < blocks; b++) {
    for (let j = 0; j < blockSize; j++) ids.writeUInt32LE(tokens[b * blockSize + j] >>> 0, 4 * j);
    const h = createHash("sha256").update(prev).update(ids).digest();
    out.push(h.toString("hex"));
    prev = h;
  }
  return out;
}

/** A block hash as KV events carry it: the unsigned 64-bit integer of its last 8 bytes (big-endian). */
export function blockHashId(hash: string): bigint {
  return Buffer.from(hash.slice(-16), "hex").readBigUInt64BE(0);
}
